"""dtype tables: numpy and torch dtypes <-> the API's DType enum, and ReduceOp names."""

import numpy as np

from collectived.v1 import common_pb2

# numpy has no bfloat16: bfloat16 tensors only travel as torch tensors.
NUMPY_TO_PROTO = {
    np.dtype(np.float16): common_pb2.FLOAT16,
    np.dtype(np.float32): common_pb2.FLOAT32,
    np.dtype(np.float64): common_pb2.FLOAT64,
    np.dtype(np.int8): common_pb2.INT8,
    np.dtype(np.uint8): common_pb2.UINT8,
    np.dtype(np.int16): common_pb2.INT16,
    np.dtype(np.int32): common_pb2.INT32,
    np.dtype(np.int64): common_pb2.INT64,
    np.dtype(np.bool_): common_pb2.BOOL,
    np.dtype(np.complex64): common_pb2.COMPLEX64,
    np.dtype(np.complex128): common_pb2.COMPLEX128,
}

PROTO_SIZES = {
    common_pb2.FLOAT16: 2, common_pb2.BFLOAT16: 2, common_pb2.FLOAT32: 4, common_pb2.FLOAT64: 8,
    common_pb2.INT8: 1, common_pb2.UINT8: 1, common_pb2.INT16: 2, common_pb2.INT32: 4,
    common_pb2.INT64: 8, common_pb2.BOOL: 1, common_pb2.COMPLEX64: 8, common_pb2.COMPLEX128: 16,
}

REDUCE_OPS = {
    "SUM": common_pb2.ReduceOp.SUM, "AVG": common_pb2.ReduceOp.AVG,
    "PRODUCT": common_pb2.ReduceOp.PRODUCT, "MIN": common_pb2.ReduceOp.MIN,
    "MAX": common_pb2.ReduceOp.MAX, "BAND": common_pb2.ReduceOp.BAND,
    "BOR": common_pb2.ReduceOp.BOR, "BXOR": common_pb2.ReduceOp.BXOR,
    "PREMUL_SUM": common_pb2.ReduceOp.PREMUL_SUM,
}


_TORCH_TO_PROTO = None  # torch dtype -> proto dtype, built on first use (torch is optional)


def torch_to_proto(dtype):
    global _TORCH_TO_PROTO
    if _TORCH_TO_PROTO is None:
        import torch
        _TORCH_TO_PROTO = {
            torch.float16: common_pb2.FLOAT16, torch.bfloat16: common_pb2.BFLOAT16,
            torch.float32: common_pb2.FLOAT32, torch.float64: common_pb2.FLOAT64,
            torch.int8: common_pb2.INT8, torch.uint8: common_pb2.UINT8,
            torch.int16: common_pb2.INT16, torch.int32: common_pb2.INT32,
            torch.int64: common_pb2.INT64, torch.bool: common_pb2.BOOL,
            torch.complex64: common_pb2.COMPLEX64, torch.complex128: common_pb2.COMPLEX128,
        }
    proto = _TORCH_TO_PROTO.get(dtype)
    if proto is None:
        raise ValueError(f"collectived does not support dtype {dtype}")
    return proto


_REDUCE_OP_MESSAGES = {}  # name -> ReduceOp message of the ops without a scale (read-only)


def reduce_op(op="SUM", scale=None):
    """A ReduceOp message from a name ("SUM", "avg", ...) or an existing message. The message
    may be shared: callers copy it (CopyFrom), never change it."""
    if isinstance(op, common_pb2.ReduceOp):
        return op
    if scale is None and isinstance(op, str):
        cached = _REDUCE_OP_MESSAGES.get(op)
        if cached is not None:
            return cached
    name = str(op).upper()
    if name not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r} (one of {', '.join(REDUCE_OPS)})")
    message = common_pb2.ReduceOp(kind=REDUCE_OPS[name])
    if name == "PREMUL_SUM":
        if scale is None:
            raise ValueError("PREMUL_SUM needs a scale")
        message.scale = float(scale)
    elif isinstance(op, str):
        _REDUCE_OP_MESSAGES[op] = message
    return message
