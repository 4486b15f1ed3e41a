"""An op's request in protobuf's wire format, written directly: the client's encoder of
CollectiveRequest and the messages inside it (Tensor, its references, ReduceOp, StreamSignal).

Building those messages through protobuf's Python API (a message per tensor and reference, a
copy into the request, then SerializeToString) was the largest part of a small op's CPU time in
the client, about three times what writing the bytes costs. The bytes are what protobuf's own
serializer writes: fields in number order, scalars at their default left out, a oneof member
written even at its default. The field numbers come from the generated descriptors, so a renumbered
field follows the .proto; tests/python/test_wire.py compares every op's bytes with protobuf's.
A value out of its field's range raises ValueError, as protobuf's setters do.

Each function returns its message as a list of bytes pieces, joined once (join()): an inline
tensor's bytes are copied into the request once, not once per level of nesting."""

import functools
import operator
import struct

from collectived.op_table import OPS
from collectived.v1 import collectives_pb2, common_pb2, session_pb2

_VARINT, _FIXED64, _LENGTH = 0, 1, 2
_SMALL = [bytes((value,)) for value in range(128)]
_U32, _U64 = 1 << 32, 1 << 64
_I32, _I64 = 1 << 31, 1 << 63


def _varint(value):
    """The varint of a non-negative ``value`` below 2**64."""
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _unsigned(value, bound, what):
    value = operator.index(value)  # an integer of any kind; TypeError for others, as protobuf
    if not 0 <= value < bound:
        raise ValueError(f"{what} {value} is out of range (0 to {bound - 1})")
    return _varint(value)


def _signed(value, bound, what):
    """A signed field's varint: negative values as their 64-bit two's complement (10 bytes)."""
    value = operator.index(value)
    if not -bound <= value < bound:
        raise ValueError(f"{what} {value} is out of range ({-bound} to {bound - 1})")
    return _varint(value if value >= 0 else value + _U64)


def _tag(number, wire_type):
    return _varint(number << 3 | wire_type)


def _key(message, field, wire_type):
    return _tag(message.DESCRIPTOR.fields_by_name[field].number, wire_type)


def _int_field(key, value, what, bound):
    """A signed scalar field; nothing at its default (0). None or a float is a TypeError (a
    rooted op without its root is not root 0)."""
    encoded = _signed(value, bound, what)
    return key + encoded if encoded != b"\0" else b""


def _uint_field(key, value, what, bound=_U64):
    """An unsigned scalar field; nothing at its default (0)."""
    return key + _unsigned(value, bound, what) if value else b""


def _bytes_field(key, data):
    """A bytes field; nothing when empty."""
    return key + _varint(len(data)) + data if data else b""


def _delimited(key, pieces):
    """A length-delimited field holding ``pieces``."""
    return [key, _varint(sum(map(len, pieces))), *pieces]


def size(pieces):
    """The bytes of a message that these functions returned."""
    return sum(map(len, pieces))


def join(pieces):
    """The serialized message."""
    return b"".join(pieces)


_TENSOR_DTYPE = _key(common_pb2.Tensor, "dtype", _VARINT)
_TENSOR_COUNT = _key(common_pb2.Tensor, "count", _VARINT)
_TENSOR_SHM = _key(common_pb2.Tensor, "shm", _LENGTH)
_TENSOR_INLINE = _key(common_pb2.Tensor, "inline", _LENGTH)
_TENSOR_CUDA = _key(common_pb2.Tensor, "cuda", _LENGTH)
_TENSOR_CUDA_VMM = _key(common_pb2.Tensor, "cuda_vmm", _LENGTH)
_SHM_BUFFER = _key(common_pb2.ShmRef, "buffer_id", _VARINT)
_SHM_OFFSET = _key(common_pb2.ShmRef, "offset", _VARINT)
_SHM_LENGTH = _key(common_pb2.ShmRef, "length", _VARINT)
_IPC_MEMORY = _key(common_pb2.CudaIpcRef, "mem_handle", _LENGTH)
_IPC_OFFSET = _key(common_pb2.CudaIpcRef, "offset", _VARINT)
_IPC_LENGTH = _key(common_pb2.CudaIpcRef, "length", _VARINT)
_IPC_DEVICE = _key(common_pb2.CudaIpcRef, "device", _VARINT)
_IPC_EVENT = _key(common_pb2.CudaIpcRef, "event_handle", _LENGTH)
_REDUCE_KIND = _key(common_pb2.ReduceOp, "kind", _VARINT)
_REDUCE_SCALE = _key(common_pb2.ReduceOp, "scale", _FIXED64)
_SIGNAL_BUFFER = _key(collectives_pb2.StreamSignal, "buffer_id", _VARINT)
_SIGNAL_OFFSET = _key(collectives_pb2.StreamSignal, "offset", _VARINT)
_SIGNAL_VALUE = _key(collectives_pb2.StreamSignal, "value", _VARINT)
_REQUEST_SESSION = _key(collectives_pb2.CollectiveRequest, "session_id", _LENGTH)
_REQUEST_GROUP = _key(collectives_pb2.CollectiveRequest, "group", _LENGTH)
_REQUEST_OP_ID = _key(collectives_pb2.CollectiveRequest, "client_op_id", _VARINT)
_REQUEST_TIMEOUT = _key(collectives_pb2.CollectiveRequest, "timeout_ms", _VARINT)
_REQUEST_STREAM_ORDERED = _key(collectives_pb2.CollectiveRequest, "stream_ordered", _VARINT)
_REQUEST_SIGNAL = _key(collectives_pb2.CollectiveRequest, "stream_signal", _LENGTH)
_SESSION_SUBMIT = _key(session_pb2.SessionRequest, "submit", _LENGTH)


# -- tensors ---------------------------------------------------------------------------------

def shm(buffer_id, offset, length):
    """The data field of a Tensor in a registered buffer (a ShmRef)."""
    return _delimited(_TENSOR_SHM, [
        _uint_field(_SHM_BUFFER, buffer_id, "buffer id"),
        _uint_field(_SHM_OFFSET, offset, "offset"),
        _uint_field(_SHM_LENGTH, length, "length")])


def inline(data):
    """The data field of a Tensor whose bytes travel in the request (b"" for an output)."""
    return _delimited(_TENSOR_INLINE, [data])


def cuda_ipc(mem_handle, offset, length, device, event_handle):
    """The data field of a Tensor in memory shared through CUDA IPC (a CudaIpcRef)."""
    return _delimited(_TENSOR_CUDA, [
        _bytes_field(_IPC_MEMORY, mem_handle),
        _uint_field(_IPC_OFFSET, offset, "offset"),
        _uint_field(_IPC_LENGTH, length, "length"),
        _IPC_DEVICE + _signed(device, _I32, "device") if device else b"",
        _bytes_field(_IPC_EVENT, event_handle)])


def cuda_vmm(ref):
    """The data field of a Tensor in CUDA VMM memory, from its CudaVmmRef message."""
    return _delimited(_TENSOR_CUDA_VMM, [ref.SerializeToString()])


def tensor(dtype, count, data):
    """A Tensor message: ``dtype`` (a DType value), ``count`` elements, and ``data``, one of the
    data fields above."""
    head = _TENSOR_DTYPE + _varint(dtype) if dtype else b""
    return [head + _uint_field(_TENSOR_COUNT, count, "element count"), *data]


@functools.lru_cache(maxsize=64)
def reduce_op(kind, scale):
    """A ReduceOp message, serialized (``kind`` a ReduceOp.Kind value, ``scale`` PREMUL_SUM's
    factor)."""
    scale_bytes = struct.pack("<d", scale)
    return (_REDUCE_KIND + _varint(kind) if kind else b"") + \
        (_REDUCE_SCALE + scale_bytes if scale_bytes != bytes(8) else b"")


# -- ops -------------------------------------------------------------------------------------

class _OpLayout:
    """Where an op's parts go in its message: the key of the request's oneof field, and its
    message's parts as (field number, part, key) in number order."""

    def __init__(self, spec):
        field = collectives_pb2.CollectiveRequest.DESCRIPTOR.fields_by_name[spec.name]
        self.key = _tag(field.number, _LENGTH)
        fields = field.message_type.fields_by_name
        parts = []

        def add(name, part, wire_type):
            if name is not None:
                number = fields[name].number
                parts.append((number, part, _tag(number, wire_type)))
        add(spec.inputs, "inputs", _LENGTH)
        add(spec.outputs, "outputs", _LENGTH)
        if spec.reduces:
            add("op", "op", _LENGTH)
        if spec.rooted:
            add("root", "root", _VARINT)
        if spec.point_to_point:
            add(spec.peer, "peer", _VARINT)
            add("tag", "tag", _VARINT)
        if spec.splits:
            add("input_splits", "input_splits", _LENGTH)
            add("output_splits", "output_splits", _LENGTH)
        self.parts = tuple(sorted(parts))


_LAYOUTS = {name: _OpLayout(spec) for name, spec in OPS.items()}


def _splits(key, splits, what):
    if not splits:
        return ()
    return _delimited(key, [_unsigned(int(s), _U64, what) for s in splits])


def op(name, inputs=(), outputs=(), reduce=b"", root=0, peer=0, tag=0, input_splits=(),
       output_splits=()):
    """The message of op ``name`` (a CollectiveRequest oneof field) with its field key: the
    wire forms of its input and output Tensors, ``reduce`` (a reduce_op()), and the scalars the
    op takes (the op table says which)."""
    out = []
    for _, part, key in _LAYOUTS[name].parts:
        if part == "inputs":
            for t in inputs:
                out += _delimited(key, t)
        elif part == "outputs":
            for t in outputs:
                out += _delimited(key, t)
        elif part == "op":
            out += (key, _varint(len(reduce)), reduce)
        elif part == "root":
            out.append(_int_field(key, root, "root rank", _I32))
        elif part == "peer":
            out.append(_int_field(key, peer, "peer rank", _I32))
        elif part == "tag":
            out.append(_int_field(key, tag, "tag", _I64))
        elif part == "input_splits":
            out += _splits(key, input_splits, "input split")
        else:
            out += _splits(key, output_splits, "output split")
    return _delimited(_LAYOUTS[name].key, out)


@functools.lru_cache(maxsize=256)
def _group(group):
    encoded = group.encode()
    return _REQUEST_GROUP + _varint(len(encoded)) + encoded


def request(group, client_op_id, op_field, timeout_ms=0, stream_ordered=False, signal=None):
    """A CollectiveRequest without its session id: ``op_field`` is op()'s, ``signal`` a
    StreamSignal's (buffer id, offset, value) or None."""
    parts = [_group(group) if group else b"",
             _uint_field(_REQUEST_OP_ID, client_op_id, "client op id"),
             _REQUEST_TIMEOUT + _signed(timeout_ms, _I64, "timeout (ms)") if timeout_ms else b"",
             _REQUEST_STREAM_ORDERED + _SMALL[1] if stream_ordered else b""]
    if signal is not None:
        buffer_id, offset, value = signal
        parts += _delimited(_REQUEST_SIGNAL, [
            _uint_field(_SIGNAL_BUFFER, buffer_id, "buffer id"),
            _uint_field(_SIGNAL_OFFSET, offset, "offset"),
            _uint_field(_SIGNAL_VALUE, value, "signal value", _U32)])
    parts += op_field
    return parts


def session_submit(session_id, request_pieces):
    """The serialized SessionRequest submitting request()'s ``request_pieces`` for the session
    ``session_id``, whose field goes first (its number is below request()'s)."""
    session = session_id.encode()
    head = [_REQUEST_SESSION, _varint(len(session)), session] if session else []
    return join(_delimited(_SESSION_SUBMIT, head + request_pieces))
