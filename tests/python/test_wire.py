"""collectived.wire, the client's encoder of op requests, against protobuf's own serializer: every
op of the op table with every kind of tensor reference and every optional field, byte for byte,
and the range checks protobuf's setters make (no sidecar needed)."""

import random

import pytest

from collectived import wire
from collectived.op_table import OPS
from collectived.v1 import collectives_pb2, common_pb2, session_pb2

U64 = (1 << 64) - 1


def random_reference(rng):
    """A tensor reference of a random kind: (the wire data field, a function filling a Tensor)."""
    kind = rng.choice(["shm", "inline", "empty_inline", "cuda", "cuda_vmm"])
    if kind == "shm":
        fields = (rng.randrange(0, 1 << 40), rng.choice([0, rng.randrange(U64)]),
                  rng.choice([0, 8, rng.randrange(1 << 33)]))
        return wire.shm(*fields), lambda t: t.shm.MergeFrom(
            common_pb2.ShmRef(buffer_id=fields[0], offset=fields[1], length=fields[2]))
    if kind in ("inline", "empty_inline"):
        data = bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 300])))
        data = data if kind == "inline" else b""

        def fill(t):
            t.inline = data
        return wire.inline(data), fill
    if kind == "cuda":
        memory = bytes(rng.randrange(256) for _ in range(64))
        event = bytes(rng.randrange(256) for _ in range(64))
        offset, length = rng.choice([0, 512, 1 << 35]), rng.choice([0, 4, 1 << 30])
        device = rng.choice([0, 1, 7])
        return wire.cuda_ipc(memory, offset, length, device, event), lambda t: t.cuda.MergeFrom(
            common_pb2.CudaIpcRef(mem_handle=memory, offset=offset, length=length,
                                  device=device, event_handle=event))
    ref = common_pb2.CudaVmmRef(registration_ids=[rng.randrange(1, 1 << 20) for _ in range(3)],
                                offset=rng.randrange(1 << 21), length=1 << 20, device=1,
                                event_handle=bytes(64))
    return wire.cuda_vmm(ref), lambda t: t.cuda_vmm.MergeFrom(ref)


def random_tensor(rng):
    dtype = rng.choice(list(common_pb2.DType.values()))
    count = rng.choice([0, 1, 255, 1 << 31, U64])
    data, fill = random_reference(rng)

    def fill_tensor(t):
        t.dtype, t.count = dtype, count
        fill(t)
    return wire.tensor(dtype, count, data), fill_tensor


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_encodes_as_protobuf_serializes_it(name):
    spec = OPS[name]
    rng = random.Random(name)
    for _ in range(40):
        expected = collectives_pb2.CollectiveRequest(
            group=rng.choice(["", "g", "cd-dev0-trainers-ü"]),
            client_op_id=rng.choice([0, 1, 300, U64]),
            timeout_ms=rng.choice([0, 30000, -1]), stream_ordered=rng.random() < 0.5)
        signal = None
        if rng.random() < 0.5:
            signal = (rng.randrange(1 << 30), rng.choice([0, 4, 4096]),
                      rng.choice([0, 1, (1 << 32) - 1]))
            expected.stream_signal.MergeFrom(collectives_pb2.StreamSignal(
                buffer_id=signal[0], offset=signal[1], value=signal[2]))
        message = getattr(expected, name)
        message.SetInParent()
        inputs, outputs = [], []
        for side, field, repeated, into in ((spec.inputs, spec.inputs, spec.inputs_repeated,
                                             inputs),
                                            (spec.outputs, spec.outputs,
                                             spec.outputs_repeated, outputs)):
            if side is None:
                continue
            for _ in range(rng.choice([0, 1, 3]) if repeated else 1):
                data, fill = random_tensor(rng)
                into.append(data)
                fill(getattr(message, field).add() if repeated else getattr(message, field))
        reduce = b""
        if spec.reduces:
            kind = rng.choice(list(common_pb2.ReduceOp.Kind.values()))
            scale = rng.choice([0.0, 0.5, -2.25, 1e-300])
            message.op.MergeFrom(common_pb2.ReduceOp(kind=kind, scale=scale))
            reduce = wire.reduce_op(kind, scale)
        root = peer = tag = 0
        splits = ([], [])
        if spec.rooted:
            root = rng.choice([0, 3, -1, (1 << 31) - 1])
            message.root = root
        if spec.point_to_point:
            peer, tag = rng.choice([0, 1, -1]), rng.choice([0, 9, -5, (1 << 63) - 1])
            setattr(message, spec.peer, peer)
            message.tag = tag
        if spec.splits:
            splits = ([rng.randrange(1 << 40) for _ in range(rng.choice([0, 2]))],
                      [rng.randrange(300) for _ in range(rng.choice([0, 4]))])
            message.input_splits.extend(splits[0])
            message.output_splits.extend(splits[1])
        op_field = wire.op(name, inputs, outputs, reduce, root, peer, tag, *splits)
        encoded = wire.request(expected.group, expected.client_op_id, op_field,
                               expected.timeout_ms, expected.stream_ordered, signal)
        assert wire.join(encoded) == expected.SerializeToString(deterministic=True)
        assert wire.size(encoded) == expected.ByteSize()

        session = "6f1c-session"
        expected.session_id = session
        assert wire.session_submit(session, encoded) == \
            session_pb2.SessionRequest(submit=expected).SerializeToString(deterministic=True)


def test_an_op_without_fields_still_names_its_op():
    # barrier's message is empty; the oneof member is still written, or the op would be lost.
    encoded = wire.join(wire.request("g", 1, wire.op("barrier")))
    parsed = collectives_pb2.CollectiveRequest.FromString(encoded)
    assert parsed.WhichOneof("op") == "barrier"
    assert collectives_pb2.CollectiveRequest.FromString(wire.join(
        wire.request("g", 1, wire.op("allreduce", [wire.tensor(0, 0, wire.inline(b""))])))
    ).allreduce.tensor.WhichOneof("data") == "inline"


@pytest.mark.parametrize("make, match", [
    (lambda: wire.op("alltoall_single", input_splits=[4, -1]), "input split -1"),
    (lambda: wire.op("alltoall_single", output_splits=[1 << 64]), "output split"),
    (lambda: wire.op("broadcast", root=1 << 31), "root rank 2147483648"),
    (lambda: wire.op("send", peer=-(1 << 31) - 1), "peer rank"),
    (lambda: wire.op("send", tag=1 << 63), "tag"),
    (lambda: wire.request("g", -1, []), "client op id -1"),
    (lambda: wire.request("g", 1, [], timeout_ms=1 << 63), "timeout"),
    (lambda: wire.request("g", 1, [], signal=(1, 4, 1 << 32)), "signal value"),
    (lambda: wire.tensor(7, -3, wire.inline(b"")), "element count -3"),
    (lambda: wire.shm(1, -8, 8), "offset -8"),
])
def test_values_out_of_range_are_refused_naming_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_values_that_are_not_integers_are_refused_as_protobuf_refuses_them():
    with pytest.raises(TypeError):
        wire.op("broadcast", root=1.5)
    with pytest.raises(TypeError):  # a rooted op without its root is not root 0
        wire.op("broadcast", root=None)
    # Integers of other kinds (numpy's, bool) are integers.
    import numpy as np
    assert wire.op("broadcast", root=np.int64(-1)) == wire.op("broadcast", root=-1)
