"""The submission ring: a session's shared-memory path for ops, beside the gRPC control plane.

Against real collectived processes: collectives travel through the ring and complete correctly;
concurrent submitters; wrap-around of both queues; ops that alternate between the ring and the
stream keep their order; a client that scribbles on its ring or writes a record that is not a
request loses its ring, never its session or the sidecar; one ring per session; TCP sessions
have none; a client killed mid-submission leaves the sidecar serving others; a sidecar killed
while clients wait gives them an error, not a hang.
"""

import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from collectived import CollectivedError
from raw.raw_client import RawClient as Client  # its ring is in reach: scribbled on, stalled
from raw import ring as ring_module
from conftest import healthy, two_rank_group, unique

pytestmark = pytest.mark.skipif(not ring_module.available(),
                                reason="libcollectived_ring.so is not built")

# rpc/submission_ring.h's layout.
QUEUE_BYTES = 1 << 20  # each direction (rpc/submission_ring.h)
RING_BYTES = 4096 + 2 * QUEUE_BYTES
# SessionQuotas::max_pending_ops (engine/sidecar/session_quotas.h)
MAX_PENDING_OPS_PER_SESSION = 16384
SUBMISSION_TAIL, CLOSED, REASON_BYTES, REASON = 64, 576, 580, 584
SUBMISSION_REGION = 4096


def run_ranks(*bodies, timeout=60):
    """Runs one body per rank on threads; re-raises the first failure."""
    errors = [None] * len(bodies)

    def run(index):
        try:
            bodies[index]()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors[index] = error
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    for error in errors:
        if error is not None:
            raise error


def raw_ring(client):
    """Opens the session's ring by hand (the client was made without one) and maps it."""
    fd = client._fd_channel_locked().open_ring()
    try:
        return mmap.mmap(fd, RING_BYTES)
    finally:
        os.close(fd)


SIDECAR_BELL = 448  # DoorbellWords: the bell, then the count of sleepers


def ring_sidecar_bell(mapping):
    """Rings the sidecar's doorbell as a client does after publishing submissions: bumps the
    bell word and wakes a sleeper (a shared futex)."""
    import ctypes
    bell = struct.unpack_from("<I", mapping, SIDECAR_BELL)[0]
    struct.pack_into("<I", mapping, SIDECAR_BELL, (bell + 1) & 0xFFFFFFFF)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping, SIDECAR_BELL))
    futex, futex_wake = 202, 1  # x86_64 SYS_futex, FUTEX_WAKE (shared: no private flag)
    ctypes.CDLL(None, use_errno=True).syscall(futex, ctypes.c_void_p(address), futex_wake,
                                              1 << 30, None, None, 0)


def ring_reason(mapping, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if struct.unpack_from("<I", mapping, CLOSED)[0]:
            size = struct.unpack_from("<I", mapping, REASON_BYTES)[0]
            return mapping[REASON:REASON + size].decode()
        time.sleep(0.02)
    return None


def test_collectives_travel_through_the_ring_and_are_exact(sidecar):
    with Client(sidecar.unix_address) as a, Client(sidecar.unix_address) as b:
        assert a._ring is not None and b._ring is not None, (a.ring_error, b.ring_error)
        group = two_rank_group(a, b)
        results = {}

        def rank(client, r):
            x = np.full(5, r + 1, np.float32)
            work = client.allreduce(group, x)
            assert work._via_ring
            outputs = [np.zeros(3, np.int64) for _ in range(2)]
            client.allgather(group, outputs, np.arange(3, dtype=np.int64) + 10 * r)
            y = np.full(2, 7.0 if r == 0 else 0.0, np.float64)
            client.broadcast(group, y, root=0)
            client.barrier(group)
            results[r] = (x, outputs, y)
        run_ranks(lambda: rank(a, 0), lambda: rank(b, 1))
        for r in (0, 1):
            x, outputs, y = results[r]
            assert (x == 3).all()
            assert (outputs[0] == [0, 1, 2]).all() and (outputs[1] == [10, 11, 12]).all()
            assert (y == 7.0).all()


def test_concurrent_submitters_and_wrap_around(sidecar):
    """Four threads per client, each on its own group, 1 KiB payloads: about 6 MiB of records
    through each 1 MiB queue, so both wrap around many times."""
    threads, ops = 4, 400
    with Client(sidecar.unix_address) as a, Client(sidecar.unix_address) as b:
        groups = [two_rank_group(a, b) for _ in range(threads)]

        def submitter(client, r, group, index):
            for i in range(ops):
                x = np.full(256, float(r + i + index), np.float32)
                client.allreduce(group, x)
                assert (x == 2 * (i + index) + 1).all(), (group, i)
        bodies = []
        for index, group in enumerate(groups):
            bodies.append(lambda g=group, k=index: submitter(a, 0, g, k))
            bodies.append(lambda g=group, k=index: submitter(b, 1, g, k))
        run_ranks(*bodies, timeout=240)


def test_ops_alternating_between_ring_and_stream_keep_their_order(sidecar):
    """Inline payloads over the ring's limit take the stream; issued asynchronously in a row,
    the two paths race unless the client keeps a group's order."""
    big = (200 << 10) // 4  # floats: 200 KiB inline, over RING_INLINE_LIMIT
    with Client(sidecar.unix_address) as a, Client(sidecar.unix_address) as b:
        group = two_rank_group(a, b)
        outcome = {}

        def rank(client, r):
            tensors, works = [], []
            for i in range(12):
                x = np.full(big if i % 3 == 2 else 4, float(i * 10 + r), np.float32)
                tensors.append(x)
                works.append(client.allreduce(group, x, async_op=True))
            for work in works:
                work.wait(60)
            outcome[r] = ([w._via_ring for w in works], tensors)
        run_ranks(lambda: rank(a, 0), lambda: rank(b, 1))
        paths, tensors = outcome[0]
        assert any(paths) and not all(paths)
        for i, x in enumerate(tensors):
            assert (x == 2 * i * 10 + 1).all(), i


def test_a_client_that_scribbles_on_its_ring_loses_the_ring_not_its_session(sidecar, monkeypatch):
    monkeypatch.setenv("COLLECTIVED_RING", "0")
    with Client(sidecar.unix_address) as hostile, Client(sidecar.unix_address) as bystander:
        mapping = raw_ring(hostile)
        struct.pack_into("<Q", mapping, SUBMISSION_TAIL, 1 << 40)  # far beyond the queue
        ring_sidecar_bell(mapping)
        reason = ring_reason(mapping)
        assert reason is not None and "broke the submission queue" in reason, reason
        # The session goes on over gRPC; the sidecar serves everyone.
        name = unique()
        hostile.create_group(name, 0, 1)
        x = np.ones(3, np.float32)
        hostile.allreduce(name, x)
        assert (x == 1).all()
        other = unique()
        bystander.create_group(other, 0, 1)
        bystander.barrier(other)
        mapping.close()
    assert healthy(sidecar)


def test_a_record_that_is_not_a_request_closes_the_ring(sidecar, monkeypatch):
    monkeypatch.setenv("COLLECTIVED_RING", "0")
    with Client(sidecar.unix_address) as hostile:
        mapping = raw_ring(hostile)
        payload = b"\xff\xff\xff\xff not protobuf"
        record = struct.pack("<II", len(payload), 1) + payload
        record += b"\0" * (-len(record) % 8)
        mapping[SUBMISSION_REGION:SUBMISSION_REGION + len(record)] = record
        struct.pack_into("<Q", mapping, SUBMISSION_TAIL, len(record))
        ring_sidecar_bell(mapping)
        reason = ring_reason(mapping)
        assert reason is not None and "not a valid collectived.v1.CollectiveRequest" in reason
        name = unique()
        hostile.create_group(name, 0, 1)
        hostile.barrier(name)
        mapping.close()
    assert healthy(sidecar)


def test_one_ring_per_session(sidecar):
    with Client(sidecar.unix_address) as client:
        assert client._ring is not None
        with pytest.raises(CollectivedError, match="already has a submission ring"):
            client._fd_channel_locked().open_ring()


def test_tcp_sessions_have_no_ring(sidecar, tls_client_environment):
    with Client(sidecar.tcp_address) as client:
        assert client._ring is None
        assert "Unix socket" in client.ring_error
        name = unique()
        client.create_group(name, 0, 1)
        x = np.ones(2, np.float32)
        client.allreduce(name, x)
        assert (x == 1).all()


CHILD = textwrap.dedent("""
    import sys, numpy as np
    from collectived import Client
    client = Client(sys.argv[1])
    assert client.ring_error is None, client.ring_error
    client.create_group(sys.argv[2], 0, 2, timeout=30)
    works = []
    print("submitting", flush=True)
    while True:  # rank 1 never joins in: these stay pending until the kill
        works.append(client.allreduce(sys.argv[2], np.ones(64, np.float32), async_op=True))
""")


def test_a_client_killed_mid_submission_leaves_the_sidecar_serving(sidecar):
    group = unique()
    child = subprocess.Popen([sys.executable, "-c", CHILD, sidecar.unix_address, group],
                             stdout=subprocess.PIPE, env=os.environ.copy())
    with Client(sidecar.unix_address) as peer:
        peer.create_group(group, 1, 2, timeout=30)
        assert child.stdout.readline().strip() == b"submitting"
        time.sleep(0.3)  # mid-stream: it submits as fast as it can
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # The peer learns its group lost a rank, with an error, not a hang. Its first ops may
        # still match ones the child submitted before it died: those already in the group (at
        # most the session's quota of pending ops) and those still in its ring (each request
        # carries 256 bytes inline, so at most a queue's bytes / 256 of them). A faster client
        # gets further before the kill, so the bound is those limits, not a guess of its speed.
        child_ops_at_most = MAX_PENDING_OPS_PER_SESSION + QUEUE_BYTES // 256
        with pytest.raises(CollectivedError):
            for _ in range(child_ops_at_most + 1):
                peer.allreduce(group, np.ones(64, np.float32), timeout=20)
    with Client(sidecar.unix_address) as a, Client(sidecar.unix_address) as b:
        fresh = two_rank_group(a, b)
        xs = [np.ones(4, np.float32), np.ones(4, np.float32)]
        run_ranks(lambda: a.allreduce(fresh, xs[0]), lambda: b.allreduce(fresh, xs[1]))
        assert (xs[0] == 2).all() and (xs[1] == 2).all()
    assert healthy(sidecar)


def test_clients_waiting_on_the_ring_get_an_error_when_the_sidecar_dies(sidecar):
    client = Client(sidecar.unix_address)
    peer = Client(sidecar.unix_address)
    group = two_rank_group(client, peer)
    work = client.allreduce(group, np.ones(4, np.float32), async_op=True)  # the peer never joins
    assert work._via_ring
    failure = []

    def wait():
        try:
            work.wait()
        except CollectivedError as error:
            failure.append(error)
    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(0.3)
    sidecar.process.send_signal(signal.SIGKILL)
    sidecar.process.wait(10)
    waiter.join(15)
    assert not waiter.is_alive(), "the wait hung after the sidecar died"
    assert failure, "the wait returned without an error"
    with pytest.raises(CollectivedError):
        client.allreduce(group, np.ones(4, np.float32), timeout=5)
    client.close()
    peer.close()
    sidecar.start()  # the fixture stops it cleanly


def test_a_client_that_never_takes_its_completions_is_held_back(sidecar, monkeypatch):
    """Refusals cost no op quota: a client that submits them and never takes the answers must
    not grow the sidecar's memory. Its ring stops taking submissions once its completions back
    up; the sidecar goes on serving others."""
    from collectived.v1 import collectives_pb2
    monkeypatch.setenv("COLLECTIVED_RING", "0")
    submission_head = 128
    with Client(sidecar.unix_address) as hostile, Client(sidecar.unix_address) as bystander:
        mapping = raw_ring(hostile)
        offset = 0
        for op_id in range(1, 20001):  # about 1 MB: fits the queue without wrapping
            payload = collectives_pb2.CollectiveRequest(group="no-such-group",
                                                        client_op_id=op_id).SerializeToString()
            record = struct.pack("<II", len(payload), 1) + payload
            record += b"\0" * (-len(record) % 8)
            mapping[SUBMISSION_REGION + offset:SUBMISSION_REGION + offset + len(record)] = record
            offset += len(record)
        assert offset < (1 << 20)
        struct.pack_into("<Q", mapping, SUBMISSION_TAIL, offset)
        ring_sidecar_bell(mapping)

        def head():
            return struct.unpack_from("<Q", mapping, submission_head)[0]
        deadline = time.monotonic() + 20
        last, steady_since = head(), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - steady_since < 1.0:
            time.sleep(0.05)
            if head() != last:
                last, steady_since = head(), time.monotonic()
        assert 0 < last < offset, (last, offset)  # it took some, then stopped
        assert ring_reason(mapping, timeout=0.1) is None  # held back, not closed
        other = unique()
        bystander.create_group(other, 0, 1)
        x = np.ones(2, np.float32)
        bystander.allreduce(other, x)
        assert (x == 1).all()
        mapping.close()
    assert healthy(sidecar)


def test_a_full_ring_waits_with_the_gil_released(sidecar):
    """A submission with room keeps the GIL; one that finds the queue full waits for room with
    the GIL released. Here the completion reader gets no GIL otherwise (a switch interval of
    30 s), so completions back up (the ring's 1 MiB, then the sidecar's backlog of 4,096), the
    sidecar stops taking submissions and the queue fills: the ops must all complete, through the
    waiting path, with their results exact."""

    class Counting:
        def __init__(self, lib):
            self._lib, self.waits = lib, 0

        def collectived_ring_submit(self, *args):
            self.waits += 1
            return self._lib.collectived_ring_submit(*args)

        def __getattr__(self, name):
            return getattr(self._lib, name)

    with Client(sidecar.unix_address) as client:
        assert client._ring is not None, client.ring_error
        group = unique()
        client.create_group(group, 0, 1)
        counting = Counting(client._ring._lib)
        client._ring._lib = counting
        arrays = [np.full(256, float(i), np.float32) for i in range(12000)]  # 1 KiB records
        interval = sys.getswitchinterval()
        sys.setswitchinterval(30)
        try:
            works = [client.allreduce(group, x, async_op=True) for x in arrays]
        finally:
            sys.setswitchinterval(interval)
        for work in works:
            work.wait(timeout=60)
        assert counting.waits > 0, "the queue never filled: the test did not test the wait"
        for i, x in enumerate(arrays):
            assert (x == i).all(), i
