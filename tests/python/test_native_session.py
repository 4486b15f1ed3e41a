"""collectived.native_session: a session of the C++ client driven through libcollectived_native.so
(the torch backend's native op path), against real sidecars: results across two sidecars, every
refusal as a clear error of its kind naming the group, a wait that times out and the op that then
completes, done callbacks before and after completion, a peer that goes away (the group's
failure is recorded for the process group to take), calls after the session closed and racing
with its close, and a work dropped while its op runs (its tensor is kept until the op
completed)."""

import threading
import time

import pytest
import torch

from collectived import errors
from collectived.client import Client
from collectived.native_session import NativeSession
from conftest import unique


def _allreduce(session, group, tensor, op="SUM", timeout=None):
    return session.allreduce(group.encode(), tensor, op=op, timeout=timeout)


class _Sessions(list):
    """A native session per sidecar; ``store``: the rendezvous store of their groups."""

    store = ""


def _two_rank_group(sessions, timeout=20.0):
    name = unique()
    joiner = threading.Thread(target=sessions[1].create_group, args=(name, 1, 2),
                              kwargs={"store_address": sessions.store, "timeout": timeout},
                              daemon=True)
    joiner.start()
    sessions[0].create_group(name, 0, 2, store_address=sessions.store, timeout=timeout)
    joiner.join(timeout)
    assert not joiner.is_alive(), "rank 1 never finished joining"
    return name


@pytest.fixture
def sessions(two_sidecars):
    opened = _Sessions(NativeSession(side.unix_address, name=f"native test {i}")
                       for i, side in enumerate(two_sidecars))
    opened.store = two_sidecars[0].tcp_address
    yield opened
    for session in opened:
        session.close()


def test_allreduce_across_two_sidecars_every_op(sessions):
    group = _two_rank_group(sessions)
    for op, want in (("SUM", [3, 5, 7]), ("MAX", [2, 3, 4]), ("MIN", [1, 2, 3]),
                     ("PRODUCT", [2, 6, 12])):
        a = torch.tensor([1, 2, 3], dtype=torch.int64)
        b = torch.tensor([2, 3, 4], dtype=torch.int64)
        works = [_allreduce(sessions[0], group, a, op), _allreduce(sessions[1], group, b, op)]
        for work in works:
            assert work.wait(10) is True
            assert work.is_completed() and work.exception() is None
        assert a.tolist() == want and b.tolist() == want, op


def test_broadcast_allgather_and_reduce_scatter_across_two_sidecars(sessions):
    group = _two_rank_group(sessions)
    name = group.encode()
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([7.0, 8.0])
    for work in (sessions[0].broadcast(name, a, 1), sessions[1].broadcast(name, b, 1)):
        assert work.wait(10) is True and work.exception() is None
    assert a.tolist() == [7.0, 8.0] and b.tolist() == [7.0, 8.0]

    ins = [torch.tensor([r, r + 10], dtype=torch.int32) for r in (1, 2)]
    outs = [torch.zeros(4, dtype=torch.int32) for _ in range(2)]
    works = [sessions[r].allgather_into_tensor(name, outs[r], ins[r]) for r in (0, 1)]
    for work in works:
        work.wait(10)
    assert [o.tolist() for o in outs] == [[1, 11, 2, 12]] * 2

    ins = [torch.arange(4, dtype=torch.float64) * (r + 1) for r in (0, 1)]
    outs = [torch.zeros(2, dtype=torch.float64) for _ in range(2)]
    for op, want in (("SUM", [[0.0, 3.0], [6.0, 9.0]]), ("MAX", [[0.0, 2.0], [4.0, 6.0]])):
        works = [sessions[r].reduce_scatter_tensor(name, outs[r], ins[r], op=op) for r in (0, 1)]
        for work in works:
            work.wait(10)
        assert [o.tolist() for o in outs] == want, op
    works = [sessions[r].reduce_scatter_tensor(name, outs[r], ins[r], op="PREMUL_SUM", scale=0.5)
             for r in (0, 1)]
    for work in works:
        work.wait(10)
    assert [o.tolist() for o in outs] == [[0.0, 1.5], [3.0, 4.5]]


def test_two_tensor_ops_refuse_tensors_that_do_not_fit_together(sessions):
    group = _two_rank_group(sessions)
    name = group.encode()
    with pytest.raises(ValueError, match="one dtype"):
        sessions[0].allgather_into_tensor(name, torch.zeros(4), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        sessions[0].reduce_scatter_tensor(name, torch.zeros(2), torch.zeros(2, 2).t())
    with pytest.raises(ValueError, match="unknown reduce op"):
        sessions[0].reduce_scatter_tensor(name, torch.zeros(2), torch.zeros(4), op="AVERAGE")
    # An output of the wrong size: refused, naming the op and the group, by both ranks' checks.
    works = [sessions[r].allgather_into_tensor(name, torch.zeros(3), torch.zeros(2))
             for r in (0, 1)]
    for work in works:
        with pytest.raises(errors.InvalidArgumentError, match="has 3 elements, expected 4") as \
                raised:
            work.wait(10)
        # Named once: the sidecar's message names the op and the group, so no prefix repeats it.
        assert str(raised.value).count(f"allgather_into_tensor on group '{group}'") == 1, raised
    # The group still serves the ranks afterwards.
    a, b = torch.ones(2), torch.ones(2)
    for work in (_allreduce(sessions[0], group, a), _allreduce(sessions[1], group, b)):
        work.wait(10)
    assert a.tolist() == [2.0, 2.0]


def test_an_ops_own_timeout_bounds_it(sessions):
    group = _two_rank_group(sessions)
    failures = sessions[0].failure_count()
    start = time.monotonic()
    work = sessions[0].reduce_scatter_tensor(group.encode(), torch.zeros(2), torch.zeros(4),
                                             timeout=0.5)  # rank 1 never issues it
    with pytest.raises(errors.TimeoutError,
                       match=r"reduce_scatter_tensor.*Timed out after 500 ms.*ranks \[1\]"):
        work.wait(20)
    assert time.monotonic() - start < 10
    failure = sessions[0].group_failure(group.encode())
    assert failure is not None and failure.kind == "timeout", failure
    # Counted once, for the torch backend's check before each op.
    assert sessions[0].failure_count() == failures + 1
    with pytest.raises(errors.TimeoutError):
        sessions[0].allreduce(group.encode(), torch.zeros(2), timeout=0.2).wait(20)
    assert sessions[0].failure_count() == failures + 1  # the group's first failure only


def test_a_tensor_past_the_rings_record_limit_takes_the_session_stream(sessions):
    group = _two_rank_group(sessions)
    a, b = torch.ones(1 << 20), torch.full((1 << 20,), 2.0)  # 4 MiB each, inline
    works = [_allreduce(sessions[0], group, a), _allreduce(sessions[1], group, b)]
    for work in works:
        work.wait(20)
    assert bool((a == 3.0).all()) and bool((b == 3.0).all())


def test_refusals_are_errors_of_their_kind_naming_the_group(sessions):
    group = _two_rank_group(sessions)
    x = torch.ones(4)
    work = _allreduce(sessions[0], group, x, "BAND")
    with pytest.raises(errors.InvalidArgumentError, match=f"group '{group}'.*BAND.*float32"):
        work.wait(10)
    assert isinstance(work.exception(), errors.InvalidArgumentError)
    with pytest.raises(errors.InvalidArgumentError, match="unknown group 'nope'"):
        _allreduce(sessions[0], "nope", x).wait(10)
    with pytest.raises(ValueError, match="contiguous"):
        _allreduce(sessions[0], group, torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="does not support dtype"):
        _allreduce(sessions[0], group, torch.zeros(4, dtype=torch.complex32))
    with pytest.raises(ValueError, match="unknown reduce op 'sum'"):
        _allreduce(sessions[0], group, x, "sum")
    with pytest.raises(TypeError, match="bytes"):
        sessions[0].allreduce(None, x)
    with pytest.raises(errors.CollectivedError, match="create group"):
        sessions[0].create_group(unique(), 5, 2, timeout=5)
    with pytest.raises(errors.CollectivedError, match="destroy group 'nope'"):
        sessions[0].destroy_group("nope")
    assert sessions[0].group_failure(group.encode()) is None  # refusals do not fail the group
    assert sessions[0].failure_count() == 0


def test_a_wait_that_times_out_raises_and_the_op_still_completes(sessions):
    group = _two_rank_group(sessions)
    a, b = torch.full((3,), 1.0), torch.full((3,), 2.0)
    work = _allreduce(sessions[0], group, a)
    start = time.monotonic()
    with pytest.raises(errors.TimeoutError, match="Timeout: allreduce"):
        work.wait(0.2)
    assert time.monotonic() - start < 5
    assert not work.is_completed()
    _allreduce(sessions[1], group, b).wait(10)
    work.wait(10)
    assert a.tolist() == [3.0] * 3


def test_done_callbacks_run_once_whether_added_before_or_after_completion(sessions):
    group = _two_rank_group(sessions)
    a, b = torch.ones(2), torch.ones(2)
    seen = []
    done = threading.Event()
    work = _allreduce(sessions[0], group, a)
    work.add_done_callback(lambda w: (seen.append(("before", w.exception())), done.set()))
    _allreduce(sessions[1], group, b).wait(10)
    assert done.wait(10)
    work.add_done_callback(lambda w: seen.append(("after", w.exception())))
    assert seen == [("before", None), ("after", None)]


def test_a_peer_that_leaves_fails_the_group_and_the_failure_is_recorded(two_sidecars, sessions):
    group = _two_rank_group(sessions, timeout=30.0)
    x = torch.ones(2)
    work = _allreduce(sessions[0], group, x)
    sessions[1].close()  # the peer's session ends with the op pending on this rank
    with pytest.raises(errors.CollectivedError) as raised:
        work.wait(20)
    assert raised.value.kind in ("peer_lost", "aborted"), raised.value
    failure = sessions[0].group_failure(group.encode())
    assert failure is not None and failure.kind == raised.value.kind, failure


def test_calls_after_close_raise_instead_of_touching_a_freed_session(two_sidecars):
    session = NativeSession(two_sidecars[0].unix_address)
    session.create_group(unique(), 0, 1, timeout=10)
    session.close()
    session.close()  # twice is fine
    with pytest.raises(errors.UnavailableError, match="closed"):
        _allreduce(session, "g", torch.ones(1))
    with pytest.raises(errors.UnavailableError, match="closed"):
        session.create_group(unique(), 0, 1)


def test_closing_while_other_threads_issue_ops_fails_them_cleanly(two_sidecars):
    """close() racing with ops on other threads: each thread's next op fails (the session is
    closed, or its op was aborted), none touches freed memory, and every thread ends."""
    session = NativeSession(two_sidecars[0].unix_address)
    name = unique()
    session.create_group(name, 0, 1, timeout=10)
    started, ended = threading.Barrier(5), []

    def issue():
        t = torch.ones(4)
        started.wait(10)
        while True:
            try:
                session.allreduce(name.encode(), t).wait(10)
            except (errors.UnavailableError, errors.AbortedError) as error:
                ended.append(type(error).__name__)
                return
    threads = [threading.Thread(target=issue, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait(10)
    time.sleep(0.2)  # ops in flight on every thread
    session.close()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads), "a thread never saw the close"
    assert len(ended) == 4, ended
    with pytest.raises(errors.UnavailableError, match="closed"):
        session.create_group(unique(), 0, 1)


def test_a_work_outlives_its_session_and_fails_aborted(two_sidecars, sessions):
    group = _two_rank_group(sessions)
    work = _allreduce(sessions[0], group, torch.ones(2))
    sessions[0].close()
    with pytest.raises(errors.CollectivedError):
        work.wait(10)
    assert work.is_completed()


def test_connecting_where_no_sidecar_listens_is_a_clear_error(tmpdir_short):
    with pytest.raises(errors.UnavailableError, match="is collectived running"):
        NativeSession(f"unix://{tmpdir_short}/nothing.sock")


def test_the_native_session_and_the_python_client_live_in_one_process(two_sidecars, sessions):
    """Both load the generated messages (protobuf's C++ pool and Python's): neither refuses."""
    with Client(two_sidecars[0].unix_address) as client:
        name = unique()
        client.create_group(name, 0, 1, timeout=10)
        sessions[0].create_group(name + "-n", 0, 1, timeout=10)
        x = torch.ones(3)
        client.allreduce(name, x)
        _allreduce(sessions[0], name + "-n", x).wait(10)
        assert x.tolist() == [1.0] * 3


def test_a_work_dropped_before_its_op_completed_keeps_the_tensor_until_then(sessions):
    """The sidecar writes the result into the tensor's memory when the op completes: dropping
    the work must not free it before; the next op lets go of it once completed."""
    import gc
    import weakref
    group = _two_rank_group(sessions)
    a = torch.ones(4)
    kept = weakref.ref(a)
    work = _allreduce(sessions[0], group, a)
    del a, work
    gc.collect()
    assert kept() is not None, "the tensor of a running op was freed"
    _allreduce(sessions[1], group, torch.ones(4)).wait(10)
    deadline = time.monotonic() + 10  # rank 0's completion arrives on its reader thread
    while kept().tolist() != [2.0] * 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept().tolist() == [2.0] * 4, "the result landed in it"
    for _ in range(50):  # each op of rank 0 lets go of the orphans that completed before it
        b, c = torch.ones(1), torch.ones(1)
        works = [_allreduce(sessions[0], group, b), _allreduce(sessions[1], group, c)]
        for w in works:
            w.wait(10)
        gc.collect()
        if kept() is None:
            break
    assert kept() is None, "a completed op's orphaned tensor was never let go of"


def _both(sessions, group, issue):
    """Issues ``issue(session, rank)`` on both ranks, waits for both works, returns them."""
    works = [issue(session, rank) for rank, session in enumerate(sessions)]
    for work in works:
        work.wait(20)
    return works


def test_every_collective_through_submit_across_two_sidecars(sessions):
    group = _two_rank_group(sessions)
    g = group.encode()

    # allreduce_coalesced and reduce (to rank 1): in place.
    tensors = [[torch.full((3,), 1.0 + r), torch.full((2,), 10.0 * (r + 1))] for r in range(2)]
    _both(sessions, group, lambda s, r: s.submit(g, "allreduce_coalesced", tensors[r]))
    for r in range(2):
        assert tensors[r][0].tolist() == [3.0] * 3 and tensors[r][1].tolist() == [30.0] * 2
    reduced = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])]
    _both(sessions, group, lambda s, r: s.submit(g, "reduce", [reduced[r]], reduce_op="MAX",
                                                 root=1))
    assert reduced[1].tolist() == [3.0, 5.0]

    # allgather, allgather_coalesced, gather (to rank 0), scatter (from rank 1).
    outs = [[torch.zeros(2) for _ in range(2)] for _ in range(2)]
    _both(sessions, group, lambda s, r: s.submit(g, "allgather", [torch.full((2,), r + 1.0)],
                                                 outs[r]))
    assert [[o.tolist() for o in outs[r]] for r in range(2)] == [[[1.0, 1.0], [2.0, 2.0]]] * 2
    # Outputs by input, then by rank.
    coalesced = [[torch.zeros(1), torch.zeros(1), torch.zeros(3), torch.zeros(3)]
                 for _ in range(2)]
    _both(sessions, group, lambda s, r: s.submit(
        g, "allgather_coalesced", [torch.full((1,), r + 1.0), torch.full((3,), r + 5.0)],
        coalesced[r]))
    assert [o.tolist() for o in coalesced[1]] == [[1.0], [2.0], [5.0] * 3, [6.0] * 3]
    gathered = [torch.zeros(2) for _ in range(2)]
    _both(sessions, group, lambda s, r: s.submit(
        g, "gather", [torch.full((2,), 7.0 + r)], gathered if r == 0 else [], root=0))
    assert [o.tolist() for o in gathered] == [[7.0, 7.0], [8.0, 8.0]]
    scattered = [torch.zeros(2), torch.zeros(2)]
    _both(sessions, group, lambda s, r: s.submit(
        g, "scatter", [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])] if r == 1 else [],
        [scattered[r]], root=1))
    assert scattered[0].tolist() == [1.0, 2.0] and scattered[1].tolist() == [3.0, 4.0]

    # reduce_scatter (a list of inputs), alltoall, alltoall_single with uneven splits.
    rs = [torch.zeros(2), torch.zeros(2)]
    _both(sessions, group, lambda s, r: s.submit(
        g, "reduce_scatter", [torch.full((2,), 1.0 + r), torch.full((2,), 10.0 + r)], [rs[r]]))
    assert rs[0].tolist() == [3.0, 3.0] and rs[1].tolist() == [21.0, 21.0]
    a2a = [[torch.zeros(1), torch.zeros(1)] for _ in range(2)]
    _both(sessions, group, lambda s, r: s.submit(
        g, "alltoall", [torch.tensor([10.0 * r]), torch.tensor([10.0 * r + 1])], a2a[r]))
    assert [[o.item() for o in a2a[r]] for r in range(2)] == [[0.0, 10.0], [1.0, 11.0]]
    # rank 0 sends 1 element to itself and 2 to rank 1; rank 1 sends 3 to rank 0 and 1 to itself
    single_in = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0, 7.0])]
    single_out = [torch.zeros(4), torch.zeros(3)]
    splits = [([1, 2], [1, 3]), ([3, 1], [2, 1])]
    _both(sessions, group, lambda s, r: s.submit(
        g, "alltoall_single", [single_in[r]], [single_out[r]], input_splits=splits[r][0],
        output_splits=splits[r][1]))
    assert single_out[0].tolist() == [1.0, 4.0, 5.0, 6.0]
    assert single_out[1].tolist() == [2.0, 3.0, 7.0]

    barriers = _both(sessions, group, lambda s, r: s.submit(g, "barrier"))
    assert all(work.is_completed() and work.exception() is None for work in barriers)


def test_send_and_recv_with_tags_and_from_any_source(sessions):
    group = _two_rank_group(sessions)
    g = group.encode()
    first, second = torch.zeros(2), torch.zeros(2)
    # Rank 1 receives tag 8 first, then tag 7 from any source; rank 0 sends 7 then 8.
    recv8 = sessions[1].submit(g, "recv", outputs=[second], peer=0, tag=8)
    recv_any = sessions[1].submit(g, "recv", outputs=[first], peer=-1, tag=7)
    sends = [sessions[0].submit(g, "send", [torch.tensor([7.0, 7.0])], peer=1, tag=7),
             sessions[0].submit(g, "send", [torch.tensor([8.0, 8.0])], peer=1, tag=8)]
    for work in sends + [recv8, recv_any]:
        work.wait(20)
    assert first.tolist() == [7.0, 7.0] and second.tolist() == [8.0, 8.0]
    assert recv_any.source_rank() == 0


def test_tensors_in_a_registered_buffer_travel_zero_copy(sessions):
    group = _two_rank_group(sessions)
    g = group.encode()
    buffers = [session.allocate(1 << 20) for session in sessions]
    try:
        tensors = [buffer.tensor((1 << 16,), torch.float32) for buffer in buffers]
        for r, tensor in enumerate(tensors):
            tensor.fill_(r + 1.0)
        # 256 KiB each: past the inline limit of a request, so only shared memory takes it.
        _both(sessions, group, lambda s, r: s.submit(g, "allreduce", [tensors[r]],
                                                     buffers=[buffers[r]]))
        assert all(bool((t == 3.0).all()) for t in tensors)
        # An output in the buffer at an offset, an input inline.
        outs = [buffer.tensor((2, 4), torch.float32, offset=4096) for buffer in buffers]
        _both(sessions, group, lambda s, r: s.submit(
            g, "allgather_into_tensor", [torch.full((4,), r + 1.0)], [outs[r]],
            buffers=[buffers[r]]))
        assert outs[0].tolist() == [[1.0] * 4, [2.0] * 4] and outs[1].tolist() == outs[0].tolist()
        with pytest.raises(ValueError, match="do not fit"):
            buffers[0].tensor((1 << 20,), torch.float32)
    finally:
        for buffer in buffers:
            buffer.free()


def test_submit_refuses_what_it_cannot_take(sessions):
    group = _two_rank_group(sessions)
    with pytest.raises(ValueError, match="unknown op 'allreduce_everything'"):
        sessions[0].submit(group.encode(), "allreduce_everything", [torch.zeros(1)])
    with pytest.raises(ValueError, match="contiguous"):
        sessions[0].submit(group.encode(), "allreduce", [torch.zeros(4, 4).t()])
    # What only the sidecar can judge comes back as the op's error, naming it and the group.
    work = sessions[0].submit(group.encode(), "alltoall_single", [torch.zeros(3)],
                              [torch.zeros(3)], input_splits=[1, 1])
    with pytest.raises(errors.CollectivedError) as refused:
        work.wait(20)
    assert "alltoall_single" in str(refused.value) and group in str(refused.value)


def test_memory_the_process_already_shares_is_registered_from_its_descriptor(sessions):
    import mmap
    import os
    group = _two_rank_group(sessions)
    files, maps, buffers, tensors, own = [], [], [], [], None
    try:
        for session in sessions:
            fd = os.memfd_create("torch-storage", os.MFD_CLOEXEC)
            os.ftruncate(fd, 1 << 20)
            files.append(fd)
            maps.append(mmap.mmap(fd, 1 << 20))
            own = torch.frombuffer(maps[-1], dtype=torch.float32)
            buffers.append(session.register_fd(fd, 1 << 20, address=own.data_ptr()))
        tensors = [torch.frombuffer(m, dtype=torch.float32)[1024:1024 + 65536] for m in maps]
        for r, tensor in enumerate(tensors):
            tensor.fill_(r + 1.0)
        assert buffers[0].holds(tensors[0]) == 4096
        _both(sessions, group, lambda s, r: s.submit(group.encode(), "allreduce", [tensors[r]],
                                                     buffers=[buffers[r]]))
        assert all(bool((t == 3.0).all()) for t in tensors)
        with pytest.raises(errors.InvalidArgumentError, match="at least 2097152 bytes"):
            sessions[0].register_fd(files[0], 2 << 20)
    finally:
        for buffer in buffers:
            buffer.free()
        del tensors, own  # the views go before their mappings close
        for m in maps:
            m.close()
        for fd in files:
            os.close(fd)
