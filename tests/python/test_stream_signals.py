"""Stream signals (CollectiveRequest.stream_signal): the client's words (StreamSignalWords, the
twin of the C++ client's), and the sidecar's side over the wire: a successful op's word is set
when its op succeeds (on a host group the sidecar stores it, before the completion:
tests/engine/group/stream_signal_group_test.cc checks the order; a CUDA group's stream writes it,
which needs a GPU: tests/python/test_gpu_torch.py), a failed op's is left alone, and hostile
signals are refused naming the op."""

import ctypes
import fcntl
import os
import threading

import grpc
import numpy as np
import pytest

import collectived
from raw.raw_client import RawClient as Client  # raw stream-signal requests
from raw import stream_signals
from raw.raw_work import Work
from collectived.v1 import collectives_pb2, collectives_pb2_grpc, common_pb2
from conftest import two_rank_group

PER_GROUP = stream_signals.WORDS_PER_GROUP


@pytest.fixture
def words():
    memory = (ctypes.c_uint32 * (3 * PER_GROUP))()
    return memory, stream_signals.StreamSignalWords(ctypes.addressof(memory), len(memory))


def test_each_group_has_a_block_and_its_ops_take_values_in_issue_order(words):
    memory, signals = words
    a1, b1, a2 = signals.assign("a"), signals.assign("b"), signals.assign("a")
    assert (a1.value, a1.offset, a2.value, a2.offset) == (1, 4, 2, 8)
    assert (b1.value, b1.offset) == (1, (PER_GROUP + 1) * 4)
    assert signals.free_blocks() == 1
    assert memory[1] == 0
    signals.completed(a1, True)
    assert memory[1] == 1


def test_a_word_is_reused_only_once_its_previous_op_completed(words):
    memory, signals = words
    out = [signals.assign("g") for _ in range(PER_GROUP)]
    assert all(out) and out[-1].value == PER_GROUP and out[-1].offset == 0
    assert signals.assign("g") is None, "word 1 still belongs to op 1"
    signals.completed(out[0], True)
    again = signals.assign("g")
    assert (again.value, again.offset) == (PER_GROUP + 1, 4)


def test_a_failed_op_sets_its_word_and_its_group_takes_no_more(words):
    memory, signals = words
    first, second = signals.assign("g"), signals.assign("g")
    signals.completed(second, False)
    assert memory[2] == 2, "a stream waiting on the failed op goes on"
    assert signals.assign("g") is None
    assert signals.assign("other") is not None
    signals.completed(first, True)
    signals.forget("g")
    assert signals.free_blocks() == 1, "a failed group's block never returns"
    assert signals.assign("g").value == 1, "a group created again gets a fresh block"


def test_a_forgotten_groups_block_returns_once_its_last_op_completed_and_goes_on(words):
    memory, signals = words
    ops = [signals.assign("g") for _ in range(3)]
    signals.forget("g")
    assert signals.free_blocks() == 2
    for op in ops:
        signals.completed(op, True)
    assert signals.free_blocks() == 3
    assert memory[3] == 3, "not cleared: a stream may still reach a queued wait for 3"
    following = signals.assign("h")
    assert (following.value, following.offset) == (4, 16), "the next group goes on from 4"
    signals.disable()
    assert signals.assign("h") is None


def test_an_op_that_never_reached_the_sidecar_gives_its_word_back(words):
    memory, signals = words
    op = signals.assign("g")
    signals.cancel(op)
    assert memory[1] == 1
    assert signals.assign("g").value == 2, "the group goes on taking words"


def test_a_work_releases_its_word_once_whichever_completion_comes_first(words):
    memory, signals = words
    ok, failed = signals.assign("ok"), signals.assign("failed")
    works = []
    for group, assigned in (("ok", ok), ("failed", failed)):
        work = Work(None, "allreduce", group, 1, [])
        work._signal = work._signal_release = (signals, assigned)
        works.append(work)
    response = collectives_pb2.CollectiveResponse(client_op_id=1, group="ok")
    works[0]._complete(response)
    works[0]._complete(error=collectived.CollectivedError("session lost"))  # a late second one
    works[1]._complete(error=collectived.CollectivedError("peer lost"))
    assert memory[1] == 1 and memory[PER_GROUP + 1] == 1
    assert works[0].exception() is None
    assert signals.assign("ok").value == 2, "the success left its group taking words"
    assert signals.assign("failed") is None


def test_a_works_leased_ready_events_go_back_once_at_its_enqueue_or_its_completion(monkeypatch):
    """A client with stream signals leases its CUDA tensors' ready events (collectived.cuda), one
    per device and op: each op gives its leases back exactly once, at its early response (the
    sidecar waited on them) or at its completion, whichever comes first."""
    from raw import raw_client as client_module
    from collectived import cuda
    released = []
    monkeypatch.setattr(cuda, "release_ready", lambda leases: released.extend(leases))
    enqueued = Work(None, "allreduce", "g", 1, [])
    enqueued._leases = [(0, 3)]
    enqueued._mark_enqueued("")  # a signal op's ops get no early response; this one did
    enqueued._complete(collectives_pb2.CollectiveResponse(client_op_id=1, group="g"))
    completed = Work(None, "allreduce", "g", 2, [])
    completed._leases = [(0, 4), (1, 0)]
    completed._complete(error=collectived.CollectivedError("peer lost"))
    completed._mark_enqueued("late")
    assert released == [(0, 3), (0, 4), (1, 0)], released

    class Raw:
        def __init__(self, lease):
            self.lease = lease
    writeback = [(None, Raw([(0, 7)])), (0, Raw(None)), (None, Raw([(1, 8)]))]
    leases = client_module._leases_of(writeback)
    assert leases == [(0, 7), (1, 8)]
    # An op's later tensors of a device record that device's lease again (one per device).
    assert cuda._lease_of(leases, 1) == 8 and cuda._lease_of(leases, 2) == -1
    assert cuda._lease_of(None, 0) == -1


# -- the sidecar's side, over the wire -----------------------------------------------------

def signalled_allreduce(client, group, values, buffer_id, offset, value, op_id):
    request = collectives_pb2.CollectiveRequest(session_id=client.session_id, group=group,
                                                client_op_id=op_id, timeout_ms=20000)
    tensor = request.allreduce.tensor
    tensor.dtype = common_pb2.FLOAT32
    tensor.count = len(values)
    tensor.inline = np.asarray(values, dtype=np.float32).tobytes()
    request.stream_signal.buffer_id = buffer_id
    request.stream_signal.offset = offset
    request.stream_signal.value = value
    return request


def run_both(ranks, requests):
    """Runs one request per rank at once; returns the responses."""
    stubs = [collectives_pb2_grpc.CollectivesStub(c._channel) for c in ranks]
    answers = [None, None]

    def run(rank):
        answers[rank] = stubs[rank].Run(requests[rank], timeout=30)

    thread = threading.Thread(target=run, args=(1,))
    thread.start()
    run(0)
    thread.join(30)
    return answers


def test_the_sidecar_sets_the_words_of_successful_and_of_failed_ops(sidecar):
    with Client(sidecar.unix_address, name="r0") as r0, \
            Client(sidecar.unix_address, name="r1") as r1:
        ranks = (r0, r1)
        name = two_rank_group(r0, r1)
        buffers = [c.allocate(4096) for c in ranks]
        word_arrays = [b.array((1024,), np.uint32) for b in buffers]
        answers = run_both(ranks, [
            signalled_allreduce(c, name, [rank + 1.0], b.id, 40, 7, 1)
            for rank, (c, b) in enumerate(zip(ranks, buffers))])
        for answer, array in zip(answers, word_arrays):
            assert answer.error.kind == common_pb2.OK, answer
            assert np.frombuffer(answer.outputs[0], np.float32)[0] == 3.0
            assert array[10] == 7
        # A desync fails the op on both ranks: the words are set before the responses all the
        # same (no stream may wait on them for ever; the error says the results are not there).
        answers = run_both(ranks, [
            signalled_allreduce(c, name, [1.0] * (rank + 1), b.id, 44, 8, 2)
            for rank, (c, b) in enumerate(zip(ranks, buffers))])
        for answer, array in zip(answers, word_arrays):
            assert answer.error.kind == common_pb2.DESYNC, answer
            assert array[11] == 8


def test_hostile_stream_signals_are_refused_naming_the_op(sidecar):
    with Client(sidecar.unix_address, name="owner") as owner, \
            Client(sidecar.unix_address, name="thief") as thief:
        name = f"g-signal-{os.getpid()}"
        thief.create_group(name, 0, 1, timeout=20)
        mine = thief.allocate(4096)
        theirs = [owner.allocate(4096) for _ in range(3)][-1]  # an id thief has not got
        fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 4096)
        unsealed = thief.register_fd(fd, 4096)
        os.close(fd)
        stub = collectives_pb2_grpc.CollectivesStub(thief._channel)
        assert theirs.id > max(mine.id, unsealed.id)
        cases = [(theirs.id, 0, grpc.StatusCode.NOT_FOUND,
                  f"not registered by session {thief.session_label}"),
                 (unsealed.id, 0, grpc.StatusCode.INVALID_ARGUMENT,
                  "not sealed against shrinking"),
                 (mine.id, 6, grpc.StatusCode.INVALID_ARGUMENT, "not a multiple of 4"),
                 (mine.id, 4096, grpc.StatusCode.INVALID_ARGUMENT,
                  "outside the buffer's 4096 bytes")]
        for buffer_id, offset, code, needle in cases:
            with pytest.raises(grpc.RpcError) as error:
                stub.Run(signalled_allreduce(thief, name, [1.0], buffer_id, offset, 1, 1),
                         timeout=10)
            assert error.value.code() == code, (needle, error.value.details())
            assert needle in error.value.details()
            assert f"allreduce on group '{name}'" in error.value.details()
        send = collectives_pb2.CollectiveRequest(session_id=thief.session_id, group=name,
                                                 client_op_id=2, timeout_ms=1000)
        send.send.dst = 0
        send.send.tensor.dtype = common_pb2.FLOAT32
        send.send.tensor.count = 1
        send.send.tensor.inline = b"\0" * 4
        send.stream_signal.buffer_id = mine.id
        with pytest.raises(grpc.RpcError) as error:
            stub.Run(send, timeout=10)
        assert "a stream signal is for collectives" in error.value.details()
        assert sidecar.process.poll() is None, sidecar.log()
        # The session goes on: a plain op still runs.
        assert np.frombuffer(stub.Run(signalled_allreduce(thief, name, [2.0], mine.id, 0, 3, 3),
                                      timeout=10).outputs[0], np.float32)[0] == 2.0
        assert mine.array((1,), np.uint32)[0] == 3


def test_a_client_without_a_gpu_asked_for_signals_says_why_it_waits_on_events(sidecar):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: test_torch_cuda.py runs the signal path")
    with Client(sidecar.unix_address, name="cpu", stream_signals=True) as client:
        unregistered = []
        unregister = client._unregister
        client._unregister = lambda buffer_id: (unregistered.append(buffer_id),
                                                unregister(buffer_id))
        assert client._signals(0) is None
        assert client.signal_error, "no reason given"
        assert len(unregistered) == 1, "the buffer CUDA refused stayed registered"
    with Client(sidecar.unix_address, name="default") as client:
        assert not client._stream_signals_wanted, "the event path stays the default"
