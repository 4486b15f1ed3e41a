#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets into tests/fuzz/corpus/<target>/seed-*.

The translate_request_fuzzer seeds are serialized v1.CollectiveRequest messages: one valid
request per op kind (valid for a group of two ranks, seen from rank 0) and a few invalid ones, each
refused by a different check. The other targets read a byte program (fuzz/fuzz_input.h); their
seeds are written here with the same encoding. Files named crash-* (regressions) are left alone.

Usage: fuzz/make_corpus.py [BUILD_DIR]   (BUILD_DIR/python holds the generated Python stubs;
default: build/ at the repository root, built with `cmake --build build --target collectived_python`)
"""
import pathlib
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build"
sys.path.insert(0, str(BUILD / "python"))

from collectived.v1 import collectives_pb2 as c  # noqa: E402
from collectived.v1 import common_pb2 as m  # noqa: E402

CORPUS = ROOT / "tests" / "fuzz" / "corpus"
SIZES = {m.FLOAT16: 2, m.BFLOAT16: 2, m.FLOAT32: 4, m.FLOAT64: 8, m.INT8: 1, m.UINT8: 1,
         m.INT16: 2, m.INT32: 4, m.INT64: 8, m.BOOL: 1, m.COMPLEX64: 8, m.COMPLEX128: 16}


def shm(dtype, count, buffer_id=1, offset=0, length=None):
    """A tensor in the fuzzer's session buffer 1 (4096 bytes) or 2 (4100 bytes)."""
    t = m.Tensor(dtype=dtype, count=count)
    t.shm.buffer_id = buffer_id
    t.shm.offset = offset
    t.shm.length = SIZES[dtype] * count if length is None else length
    return t


def inline(dtype, count, fill=1):
    """An inline tensor with its bytes."""
    return m.Tensor(dtype=dtype, count=count, inline=bytes([fill]) * (SIZES[dtype] * count))


def output(dtype, count):
    """An inline output: dtype and count only, the sidecar allocates it."""
    return m.Tensor(dtype=dtype, count=count)


def op(kind, scale=None):
    r = m.ReduceOp(kind=kind)
    if scale is not None:
        r.scale = scale
    return r


def request(**op_field):
    return c.CollectiveRequest(session_id="s1-fuzz", group="g", client_op_id=1, **op_field)


def translate_seeds():
    f32, i32 = m.FLOAT32, m.INT32
    valid = {
        "allreduce": request(allreduce=c.AllReduce(tensor=shm(f32, 16), op=op(m.ReduceOp.SUM))),
        "allreduce_coalesced": request(allreduce_coalesced=c.AllReduceCoalesced(
            tensors=[inline(f32, 4), inline(f32, 2)], op=op(m.ReduceOp.AVG))),
        "broadcast": request(broadcast=c.Broadcast(tensor=output(m.INT64, 8), root=1)),
        "reduce": request(reduce=c.Reduce(tensor=shm(i32, 1, buffer_id=2, offset=4096), root=0,
                                          op=op(m.ReduceOp.MAX))),
        "allgather": request(allgather=c.AllGather(
            input=inline(m.FLOAT64, 2), outputs=[shm(m.FLOAT64, 2), output(m.FLOAT64, 2)])),
        "allgather_into_tensor": request(allgather_into_tensor=c.AllGatherIntoTensor(
            input=shm(m.FLOAT16, 16), output=shm(m.FLOAT16, 32, offset=32))),
        "allgather_coalesced": request(allgather_coalesced=c.AllGatherCoalesced(
            inputs=[inline(i32, 1), inline(i32, 3)],
            outputs=[output(i32, 1), output(i32, 1), output(i32, 3), output(i32, 3)])),
        "reduce_scatter": request(reduce_scatter=c.ReduceScatter(
            inputs=[inline(i32, 4), inline(i32, 4)], output=output(i32, 4),
            op=op(m.ReduceOp.BXOR))),
        "reduce_scatter_tensor": request(reduce_scatter_tensor=c.ReduceScatterTensor(
            input=shm(m.BFLOAT16, 8, buffer_id=2), output=output(m.BFLOAT16, 4),
            op=op(m.ReduceOp.PREMUL_SUM, scale=0.5))),
        "alltoall": request(alltoall=c.AllToAll(
            inputs=[inline(m.UINT8, 5), inline(m.UINT8, 5)],
            outputs=[output(m.UINT8, 5), output(m.UINT8, 5)])),
        "alltoall_single": request(alltoall_single=c.AllToAllSingle(
            input=inline(m.INT16, 6), output=output(m.INT16, 5),
            input_splits=[2, 4], output_splits=[3, 2])),
        "gather": request(gather=c.Gather(input=inline(m.INT8, 3),
                                          outputs=[output(m.INT8, 3), output(m.INT8, 3)], root=0)),
        "scatter": request(scatter=c.Scatter(
            inputs=[inline(m.COMPLEX64, 3), inline(m.COMPLEX64, 3)],
            output=output(m.COMPLEX64, 3), root=0)),
        "barrier": request(barrier=c.Barrier(), timeout_ms=1000),
        "send": request(send=c.Send(tensor=inline(m.BOOL, 3), dst=1, tag=5)),
        "recv": request(recv=c.Recv(tensor=shm(m.COMPLEX128, 1, buffer_id=2, offset=16), src=1,
                                    tag=5)),
    }
    kinds = [f.name for f in c.CollectiveRequest.DESCRIPTOR.oneofs_by_name["op"].fields]
    missing = set(kinds) - set(valid)
    assert not missing, f"no seed for op kinds {sorted(missing)}"
    seeds = {f"seed-{k}": v for k, v in valid.items()}

    absurd = output(f32, 1 << 38)
    seeds.update({
        "seed-bad-unknown-buffer": request(allreduce=c.AllReduce(tensor=shm(f32, 4, buffer_id=3))),
        "seed-bad-misaligned": request(allreduce=c.AllReduce(tensor=shm(f32, 4, offset=2))),
        "seed-bad-past-end": request(allreduce=c.AllReduce(
            tensor=shm(i32, 2, buffer_id=2, offset=4096))),
        "seed-bad-length": request(allreduce=c.AllReduce(tensor=shm(f32, 4, length=15))),
        "seed-bad-inline-size": request(allreduce=c.AllReduce(
            tensor=m.Tensor(dtype=f32, count=2, inline=b"\0" * 7))),
        "seed-bad-dtype": request(allreduce=c.AllReduce(tensor=m.Tensor(dtype=99, count=1))),
        "seed-bad-cuda": request(allreduce=c.AllReduce(
            tensor=m.Tensor(dtype=f32, count=1, cuda=m.CudaIpcRef(device=0)))),
        "seed-bad-cuda-vmm": request(allreduce=c.AllReduce(
            tensor=m.Tensor(dtype=f32, count=1, cuda_vmm=m.CudaVmmRef(
                registration_ids=[1] * 65, offset=2 ** 64 - 2, length=4, device=0)))),
        "seed-bad-inline-total": request(alltoall=c.AllToAll(
            inputs=[inline(f32, 1)], outputs=[absurd, absurd])),
        "seed-bad-split-overflow": request(alltoall_single=c.AllToAllSingle(
            input=inline(m.INT16, 6), output=output(m.INT16, 6),
            input_splits=[2 ** 64 - 1, 7], output_splits=[3, 3])),
        "seed-bad-timeout": request(barrier=c.Barrier(), timeout_ms=-5),
        "seed-bad-no-op": request(),
    })
    return {name: msg.SerializeToString(deterministic=True) for name, msg in seeds.items()}


# The byte programs of fuzz/fuzz_input.h: little-endian integers, strings with a one-byte length.
def u8(*values):
    return bytes(v & 0xFF for v in values)


def u64(value):
    return struct.pack("<Q", value & (2 ** 64 - 1))


def text(s, max_bytes=64):
    data = s.encode() if isinstance(s, str) else s
    assert len(data) <= max_bytes
    return (struct.pack("<H", len(data)) if max_bytes > 255 else u8(len(data))) + data


def shm_view_seeds():
    def view(segment, dtype, *values):  # values: (mode, value) pairs for offset, length, count
        out = u8(segment, dtype)
        for mode, value in values:
            out += u8(mode) + (u64(value) if mode == 0 else u8(value))
        return out
    return {
        "seed-float32-at-start": view(2, 3, (1, 0), (1, 64), (1, 16)),
        "seed-int32-at-end": view(3, 8, (2, 4), (1, 4), (1, 1)),
        "seed-one-byte-segment": view(0, 6, (1, 0), (1, 1), (1, 1)),
        "seed-offset-overflow": view(2, 9, (0, 2 ** 64 - 8), (1, 8), (1, 1)),
        "seed-misaligned": view(2, 4, (1, 4), (1, 8), (1, 1)),
        "seed-past-end": view(3, 12, (2, 4), (1, 16), (1, 1)),
        "seed-unspecified-dtype": view(2, 0, (1, 0), (1, 0), (1, 0)),
    }


# store_request_fuzzer: ops are U8 % 13 (set, get, add, compare_set, delete_key, check,
# num_keys, multi_get, multi_set, append, wait, wait_async, set_default_timeout); a pool key is
# one byte < 160 ("k<b % 6>"), a string key 160..229 then the string; a value < 100 is a number
# (u64, shift), 100..249 then a string.
def pool(i):
    return u8(i)


def skey(s):
    return u8(200) + text(s, 48)


def num(v, shift=0):
    return u8(0) + u64(v) + u8(shift)


def sval(s):
    return u8(150) + text(s, 32)


def store_seeds():
    prefix = u8(1, 2)  # through PrefixStore "g2"
    direct = u8(0)
    return {
        "seed-set-get-add": direct + u8(0) + pool(0) + num(5) + u8(2) + pool(0) + u64(3) + u8(0)
        + u8(1) + pool(0) + u8(2) + u8(6),
        "seed-compare-set": prefix + u8(3) + pool(1) + u8(1) + sval("a") + u8(3) + pool(1)
        + u8(0) + sval("a") + sval("b") + u8(1) + pool(1) + u8(0),
        "seed-multi": direct + u8(8) + u8(2) + pool(0) + skey("x y") + u8(1) + sval("1")
        + sval("2") + u8(7) + u8(2) + pool(0) + skey("x y") + u8(1) + u8(5) + u8(2) + pool(0)
        + pool(3),
        "seed-append-delete": prefix + u8(9) + pool(2) + sval("ab") + u8(9) + pool(2) + sval("cd")
        + u8(4) + pool(2) + u8(4) + pool(2),
        "seed-wait-missing": direct + u8(10) + u8(1) + pool(4) + u8(0) + u8(10) + u8(1) + pool(4)
        + u8(1) + u64(5),
        "seed-wait-async": direct + u8(11) + u8(1) + pool(5) + u8(1) + u8(1) + u8(1) + u8(0)
        + u8(11) + u8(1) + pool(3) + u8(0) + u8(1) + u8(0) + pool(3) + num(1),
        "seed-bad-input": direct + u8(0) + u8(235) + num(1) + u8(0) + u8(245) + u8(2) + num(1)
        + u8(12) + u8(0) + u64(2 ** 64 - 1) + u8(2) + pool(0) + u64(2 ** 63 - 1) + u8(0)
        + u8(0) + pool(0) + sval("x") + u8(2) + pool(0) + u64(1) + u8(0),
    }


def group_records_seeds():
    # The current announcement format (version 5): sidecar id, world size, members digest, job
    # token commitment, device, gRPC address.
    announcement = (b"cd5" + b"4:sc-1" + b"1:4" + b"18:4:26d7e95ec6a0944d" + b"5:12345"
                    + b"3:cpu" + b"13:10.0.0.1:7490")
    failure = b"cd1" + b"1:3" + b"21:rank 2 of group 'g' lost"
    # A membership (GroupMembership): refusal kind and message, sidecar count, each sidecar's id
    # and address, then every rank's sidecar index.
    membership = b"cm1" + b"1:0" + b"0:" + b"1:2" + b"1:a" + b"6:a:7490" + b"1:b" + b"0:" + b"8:0,1,0,1,"
    return {
        "seed-membership": u8(0) + membership,
        "seed-membership-refused": u8(0) + b"cm1" + b"1:1" + b"9:disagree!" + b"1:0" + b"0:",
        "seed-announcement": u8(0) + announcement,
        "seed-failure": u8(0) + failure,
        "seed-truncated": u8(0) + announcement[:-2],
        "seed-unknown-kind": u8(0) + b"cd1" + b"2:99" + b"1:x",
        "seed-encode": u8(1) + text("sidecar:7", 300) + struct.pack("<I", 3) + u8(2)
        + struct.pack("<ii", 0, -1) + text("digest", 300) + u8(4) + b"peer lost",
    }


def main():
    targets = {
        "translate_request_fuzzer": translate_seeds(),
        "shm_view_fuzzer": shm_view_seeds(),
        "store_request_fuzzer": store_seeds(),
        "group_records_fuzzer": group_records_seeds(),
    }
    for target, seeds in targets.items():
        directory = CORPUS / target
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("seed-*"):
            old.unlink()
        for name, data in seeds.items():
            (directory / name).write_bytes(data)
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
