"""The Python client (collectived.Client) against two real sidecars.

Ranks are threads here, one Client (one session) each; rank r attaches to sidecar r % 2, so
every group of 4 spans two "nodes" with two local ranks each (the node-aware path) and every
group of 2 has one rank per node (the plain Gloo path).
"""

import ctypes
import re
import threading
import time
import uuid

import numpy as np
import pytest

import collectived
from collectived import Client, wire
from raw.raw_client import RawClient
from conftest import Sidecar, start_all
from torch_helpers import Sidecars, python_path

JOIN_TIMEOUT_S = 60.0


def unique(prefix="g"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run_ranks(fn, n, timeout=90.0):
    """Runs fn(rank) on n threads; returns the results in rank order or raises the first error."""
    results = [None] * n
    errors = [None] * n

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors[rank] = error

    threads = [threading.Thread(target=body, args=(rank,), daemon=True) for rank in range(n)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    assert not hung, f"ranks {hung} did not finish within {timeout} s"
    for rank, error in enumerate(errors):
        if error is not None:
            raise AssertionError(f"rank {rank} failed: {error!r}") from error
    return results


def run_ranks_catching(fn, n, timeout=90.0):
    """Like run_ranks, but returns (result or exception) per rank."""
    def wrapped(rank):
        try:
            return fn(rank)
        except Exception as error:  # noqa: BLE001 - the caller inspects it
            return error
    return run_ranks(wrapped, n, timeout)


class World:
    """n ranks (Clients) spread over the sidecars, rank r on sidecar r % len(sidecars). With
    ``client`` RawClient: ranks that say on the wire what no real client would."""

    def __init__(self, sidecars, n, client=Client):
        self.sidecars = sidecars
        self.n = n
        self.clients = [client(sidecars[r % len(sidecars)].unix_address, name=f"test rank {r}")
                        for r in range(n)]
        self.store_address = sidecars[0].tcp_address

    def group(self, name=None, members=None, timeout=JOIN_TIMEOUT_S):
        """Creates a group among `members` (default: everyone); returns (name, responses)."""
        name = name or unique()
        members = list(range(self.n)) if members is None else list(members)
        responses = run_ranks(
            lambda i: self.clients[members[i]].create_group(
                name, members[i], self.n, members=members, store_address=self.store_address,
                timeout=timeout), len(members))
        return name, responses

    def close(self):
        for client in self.clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass


@pytest.fixture(scope="module")
def two_nodes():
    """Two sidecars shared by the module's tests: each test's World has clients of its own and
    every group a name of its own, and no test here stops, reconfigures or counts on a sidecar's
    totals (tests that kill a process kill their own client's). A test that leaves a sidecar
    broken fails the module's teardown, which asserts both exit cleanly."""
    sides = Sidecars(2)
    yield sides
    logs = sides.logs()
    assert sides.stop() == [0, 0], logs


@pytest.fixture
def world4(two_nodes):
    world = World(two_nodes, 4)
    yield world
    world.close()


@pytest.fixture
def world2(two_nodes):
    world = World(two_nodes, 2)
    yield world
    world.close()


@pytest.fixture
def raw_world2(two_nodes):
    world = World(two_nodes, 2, RawClient)
    yield world
    world.close()


# -- sessions --------------------------------------------------------------------------------


def test_sessions_over_unix_socket_and_tcp(two_sidecars):
    node0, node1 = two_sidecars  # conftest's fixture, as is
    a = Client(node0.unix_address)
    b = Client(node0.tcp_address)
    c = Client(node1.unix_address)
    try:
        assert len({a.session_id, b.session_id, c.session_id}) == 3
        assert a.sidecar_id == b.sidecar_id != c.sidecar_id
        assert a.session_label and a.session_label != b.session_label
        # Collectives take the submission ring on the Unix socket; over TCP the session stream.
        assert a.ring_error is None and c.ring_error is None, (a.ring_error, c.ring_error)
        assert "Unix socket" in b.ring_error, b.ring_error
        info = a.sidecar_info()
        assert info.advertise_address.startswith("127.0.0.1")
    finally:
        for client in (a, b, c):
            client.close()
    # A closed client refuses new work instead of hanging.
    with pytest.raises(collectived.CollectivedError):
        a.allreduce("whatever", np.zeros(4, np.float32))
    a.close()  # idempotent


def test_context_manager_and_address_from_environment(sidecar, monkeypatch):
    monkeypatch.setenv("COLLECTIVED_ADDRESS", sidecar.unix_address)
    with Client() as client:
        assert client.address == sidecar.unix_address
        assert client.session_id


def test_one_sidecar_per_gpu_each_trainer_finds_its_own_through_local_rank(tmpdir_short,
                                                                          monkeypatch):
    """The layout of nodes with several GPUs: sidecar gpuN serves the trainer of LOCAL_RANK N,
    all through one COLLECTIVED_ADDRESS; a group spans the node's sidecars like any others."""
    sides = start_all([Sidecar(tmpdir_short, f"gpu{i}") for i in range(2)])
    try:
        monkeypatch.setenv("COLLECTIVED_ADDRESS", f"unix://{tmpdir_short}/gpu{{local_rank}}.sock")
        clients = []
        for local_rank in range(2):
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))
            clients.append(Client())
            assert clients[-1].address == sides[local_rank].unix_address
        name = unique()
        joiner = threading.Thread(target=clients[1].create_group, args=(name, 1, 2),
                                  kwargs={"store_address": sides[0].tcp_address, "timeout": 20},
                                  daemon=True)
        joiner.start()
        clients[0].create_group(name, 0, 2, store_address=sides[0].tcp_address, timeout=20)
        joiner.join(20)
        tensors = [np.full(4, r + 1, np.float32) for r in range(2)]
        works = [c.allreduce(name, t, async_op=True) for c, t in zip(clients, tensors)]
        for work, tensor in zip(works, tensors):
            work.wait(timeout=20)
            np.testing.assert_array_equal(tensor, np.full(4, 3, np.float32))
        for c in clients:
            c.close()
        monkeypatch.delenv("LOCAL_RANK")
        with pytest.raises(ValueError, match="LOCAL_RANK"):
            Client()
    finally:
        for side in sides:
            assert side.stop() == 0, side.log()


def test_attach_to_a_missing_sidecar_fails_clearly(tmpdir_short):
    with pytest.raises(collectived.UnavailableError) as error:
        Client(f"unix://{tmpdir_short}/nobody.sock", connect_timeout=3)
    assert isinstance(error.value, RuntimeError)


def test_store_through_the_client(sidecar):
    with Client(sidecar.unix_address) as client:
        store = client.store(prefix="job")
        store.set("k", b"v")
        assert store.get("k") == b"v"
        assert store.add("n", 2) == 2
        store.multi_set(["a", "b"], [b"1", b"2"])
        assert store.multi_get(["b", "a"]) == [b"2", b"1"]
        assert collectived.StoreClient(sidecar.tcp_address).get("job/k") == b"v"
        with pytest.raises(collectived.TimeoutError, match="Timeout"):
            store.get("missing", timeout=0.5)


# -- memory ----------------------------------------------------------------------------------


def test_shared_memory_buffers_are_zero_copy_and_written_in_place(world2):
    name, _ = world2.group()

    def rank_fn(rank):
        client = world2.clients[rank]
        buffer = client.allocate(4096)
        # Sentinels around the tensor: the sidecar must write exactly the tensor's bytes.
        whole = buffer.array((1024,), np.float32)
        whole[:] = -7.0
        x = buffer.array((16,), np.float32, offset=256)
        x[:] = np.arange(16, dtype=np.float32) * (rank + 1)
        work = client.allreduce(name, x)
        # Nothing came back inline: the result was written in the segment by the sidecar.
        assert work.inline_result_bytes == 0
        other_view = buffer.array((16,), np.float32, offset=256)
        np.testing.assert_array_equal(other_view, np.arange(16, dtype=np.float32) * 3)
        assert np.all(whole[:64] == -7.0) and np.all(whole[64 + 16:] == -7.0)

        # Torch tensors in shared memory too.
        import torch
        t = client.empty_tensor((3, 5), torch.float64)
        t.copy_(torch.full((3, 5), float(rank + 1)))
        pointer = t.data_ptr()
        work = client.allreduce(name, t, op="PRODUCT")
        assert work.inline_result_bytes == 0
        assert t.data_ptr() == pointer
        assert torch.equal(t, torch.full((3, 5), 2.0, dtype=torch.float64))
        raw = (ctypes.c_double * 15).from_address(pointer)
        assert list(raw) == [2.0] * 15

        # Client.empty: a numpy array in a buffer of its own.
        y = client.empty((8,), np.int32)
        y[:] = rank
        client.broadcast(name, y, root=1)
        np.testing.assert_array_equal(y, np.ones(8, np.int32))
        return True

    assert run_ranks(rank_fn, 2) == [True, True]


def test_inline_tensors_travel_in_the_request_and_are_copied_back(world2):
    name, _ = world2.group()

    def rank_fn(rank):
        import torch
        client = world2.clients[rank]
        x = np.full(1000, rank + 1, np.float32)  # ordinary process memory
        work = client.allreduce(name, x)
        assert work.inline_result_bytes == 4000
        np.testing.assert_array_equal(x, np.full(1000, 3, np.float32))
        t = torch.arange(10, dtype=torch.int64) + rank
        client.allreduce(name, t, op="MAX")
        assert torch.equal(t, torch.arange(10) + 1)
        b = torch.zeros(7, dtype=torch.bfloat16) + (rank + 0.5)
        client.allreduce(name, b)
        assert torch.equal(b, torch.full((7,), 2.0, dtype=torch.bfloat16))
        return True

    assert run_ranks(rank_fn, 2) == [True, True]


def test_unregistered_or_bad_memory_is_rejected(world2):
    client = world2.clients[0]
    with pytest.raises(ValueError):
        client.allocate(0)
    with pytest.raises(ValueError, match="contiguous"):
        client.allreduce("g", np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(ValueError, match="dtype"):
        client.allreduce("g", np.zeros(4, np.uint64))
    buffer = client.allocate(1024)
    client.free(buffer)
    # The sidecar survives and keeps serving.
    assert client.sidecar_info().advertise_address


def test_a_session_can_only_touch_its_own_buffers_within_bounds(raw_world2):
    from collectived.v1 import common_pb2
    world2 = raw_world2
    name, _ = world2.group()
    client0, client1 = world2.clients
    foreign = client0.allocate(4096)

    def raw_allreduce(client, buffer_id, offset, count):
        def encode(writeback):
            return wire.op("allreduce", [wire.tensor(
                common_pb2.FLOAT32, count, wire.shm(buffer_id, offset, count * 4))],
                wire.reduce_op(common_pb2.ReduceOp.SUM, 0.0))
        return client._submit(name, "allreduce", encode, 10, False)

    # Session 1 (which registered nothing yet) names session 0's buffer.
    assert not client1._buffers
    with pytest.raises(collectived.CollectivedError) as error:
        raw_allreduce(client1, foreign.id, 0, 4)
    assert "not registered by session" in str(error.value), str(error.value)
    own = client1.allocate(4096)
    # Out of bounds of a real buffer: rejected before anything moves.
    for offset, count in [(4096 - 8, 100), (1 << 40, 1), (4094, 1)]:
        with pytest.raises(collectived.InvalidArgumentError) as error:
            raw_allreduce(client1, own.id, offset, count)
        assert isinstance(error.value, ValueError)
    # The sidecar is fine and the group still works.
    def rank_fn(rank):
        x = np.full(3, rank + 1.0, np.float32)
        world2.clients[rank].allreduce(name, x, timeout=30)
        return x
    assert all(np.all(x == 3.0) for x in run_ranks(rank_fn, 2))


# -- every collective, sync and async, 2 sidecars x 2 ranks ----------------------------------


def _check_every_collective(world, rank, name, async_op, shm):
    """Runs every collective once on `rank` of a 4-rank group; asserts the results."""
    client = world.clients[rank]
    n = world.n

    def arr(values, dtype=np.float32):
        values = np.asarray(values, dtype=dtype)
        if not shm:
            return values.copy()
        out = client.empty(values.shape, dtype)
        out[...] = values
        return out

    def zeros(shape, dtype=np.float32):
        return arr(np.zeros(shape, dtype), dtype)

    pending = []

    def run(work):
        if async_op:
            pending.append(work)
        return work

    def finish():
        for work in pending:
            assert work.wait(60) is True
            assert work.is_completed() and work.exception() is None
        seqs = [w.sequence_number for w in pending]
        pending.clear()
        return seqs

    # allreduce
    a = arr(np.arange(6) + rank)
    run(client.allreduce(name, a, async_op=async_op))
    # allreduce_coalesced
    # (c10d's coalesced allreduce wants one dtype for all tensors)
    c1, c2 = arr([rank, rank], np.float64), arr([1.0 + rank] * 3, np.float64)
    run(client.allreduce_coalesced(name, [c1, c2], op="MAX", async_op=async_op))
    # broadcast from a non-zero root
    b = arr(np.full(5, rank * 10))
    run(client.broadcast(name, b, root=2, async_op=async_op))
    # reduce to root 1
    r = arr(np.full(3, rank + 1), np.int32)
    run(client.reduce(name, r, root=1, op="PRODUCT", async_op=async_op))
    # allgather
    ag_out = [zeros(2) for _ in range(n)]
    run(client.allgather(name, ag_out, arr([rank, -rank]), async_op=async_op))
    # allgather_into_tensor
    agt = zeros(3 * n)
    run(client.allgather_into_tensor(name, agt, arr([rank] * 3), async_op=async_op))
    # allgather_coalesced
    # (one dtype for all inputs, as c10d's Gloo allgather_coalesced)
    agc = [[zeros(1) for _ in range(n)], [zeros(2) for _ in range(n)]]
    run(client.allgather_coalesced(name, agc, [arr([rank]), arr([rank, 2 * rank])],
                                   async_op=async_op))
    # reduce_scatter
    rs = zeros(2)
    run(client.reduce_scatter(name, rs, [arr([rank + j, 1]) for j in range(n)],
                              async_op=async_op))
    # reduce_scatter_tensor
    rst = zeros(2)
    run(client.reduce_scatter_tensor(name, rst, arr(np.arange(2 * n) * (rank + 1)), op="SUM",
                                     async_op=async_op))
    # alltoall (sizes differ per pair: rank -> j sends j + 1 elements)
    a2a_out = [zeros(rank + 1) for _ in range(n)]
    run(client.alltoall(name, a2a_out, [arr([100 * rank + j] * (j + 1)) for j in range(n)],
                        async_op=async_op))
    # alltoall_single with uneven splits: rank i sends (i + j + 1) elements to rank j
    in_splits = [rank + j + 1 for j in range(n)]
    out_splits = [j + rank + 1 for j in range(n)]
    a2as_in = arr(np.concatenate([np.full(in_splits[j], 10 * rank + j) for j in range(n)]))
    a2as_out = zeros(sum(out_splits))
    run(client.alltoall_single(name, a2as_out, a2as_in, output_splits=out_splits,
                               input_splits=in_splits, async_op=async_op))
    # gather to root 3
    g_out = [zeros(2) for _ in range(n)] if rank == 3 else None
    run(client.gather(name, arr([rank, rank]), g_out, root=3, async_op=async_op))
    # scatter from root 0
    s_out = zeros(2)
    s_in = [arr([j, j * j]) for j in range(n)] if rank == 0 else None
    run(client.scatter(name, s_out, s_in, root=0, async_op=async_op))
    seqs = finish() if async_op else None

    # send / recv ring with tags (no sequence number)
    right, left = (rank + 1) % n, (rank - 1) % n
    sent = arr([rank] * 4)
    got = zeros(4)
    got_tag7 = zeros(1)
    if rank % 2 == 0:
        w1 = client.send(name, sent, right, tag=3, async_op=True)
        w2 = client.recv(name, got, left, tag=3, async_op=True)
    else:
        w2 = client.recv(name, got, left, tag=3, async_op=True)
        w1 = client.send(name, sent, right, tag=3, async_op=True)
    # Tag 7: as requested (sync or async); a ring of blocking sends would deadlock (Gloo's
    # send completes once the receiver has posted its recv), so even ranks send first.
    if rank % 2 == 0:
        w3 = client.send(name, arr([rank + 0.5]), right, tag=7, async_op=async_op)
        w4 = client.recv(name, got_tag7, left, tag=7, async_op=async_op)
    else:
        w4 = client.recv(name, got_tag7, left, tag=7, async_op=async_op)
        w3 = client.send(name, arr([rank + 0.5]), right, tag=7, async_op=async_op)
    for w in (w1, w2, w3, w4):
        w.wait(60)
        assert w.sequence_number == 0  # point-to-point ops take no sequence number
    assert w2.source_rank == left and w4.source_rank == left

    total = sum(range(1, n + 1))
    np.testing.assert_array_equal(a, np.arange(6) * n + sum(range(n)))
    np.testing.assert_array_equal(c1, [n - 1, n - 1])
    np.testing.assert_array_equal(c2, [float(n)] * 3)
    np.testing.assert_array_equal(b, np.full(5, 20))
    expected_r = np.full(3, np.prod(np.arange(1, n + 1)) if rank == 1 else rank + 1)
    np.testing.assert_array_equal(r, expected_r)
    for j in range(n):
        np.testing.assert_array_equal(ag_out[j], [j, -j])
        np.testing.assert_array_equal(agt[3 * j:3 * j + 3], [j] * 3)
        np.testing.assert_array_equal(agc[0][j], [j])
        np.testing.assert_array_equal(agc[1][j], [j, 2 * j])
        np.testing.assert_array_equal(a2a_out[j], [100 * j + rank] * (rank + 1))
    np.testing.assert_array_equal(rs, [sum(i + rank for i in range(n)), n])
    np.testing.assert_array_equal(rst, np.arange(2 * rank, 2 * rank + 2) * total)
    offset = 0
    for j in range(n):
        np.testing.assert_array_equal(a2as_out[offset:offset + out_splits[j]], 10 * j + rank)
        offset += out_splits[j]
    if rank == 3:
        for j in range(n):
            np.testing.assert_array_equal(g_out[j], [j, j])
    np.testing.assert_array_equal(s_out, [rank, rank * rank])
    np.testing.assert_array_equal(got, [left] * 4)
    np.testing.assert_array_equal(got_tag7, [left + 0.5])
    return seqs


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("shm", [True, False], ids=["shm", "inline"])
def test_every_collective_on_two_sidecars_with_two_ranks_each(world4, async_op, shm):
    name, responses = world4.group()
    assert [r.group_rank for r in responses] == [0, 1, 2, 3]
    assert all(r.group_size == 4 and r.num_sidecars == 2 for r in responses)
    assert all(list(r.members) == [0, 1, 2, 3] for r in responses)
    assert sorted(responses[0].local_group_ranks) == [0, 2]
    assert sorted(responses[1].local_group_ranks) == [1, 3]
    seqs = run_ranks(lambda rank: _check_every_collective(world4, rank, name, async_op, shm), 4)
    if async_op:
        # Every collective got the group's next sequence number, identically on every rank.
        assert seqs[0] == list(range(1, len(seqs[0]) + 1)), seqs[0]
        assert all(s == seqs[0] for s in seqs)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_barrier(world4, async_op):
    name, _ = world4.group()
    entered = []

    def rank_fn(rank):
        if rank == 3:
            time.sleep(0.5)
        entered.append(rank)
        work = world4.clients[rank].barrier(name, async_op=async_op, timeout=30)
        if async_op:
            work.wait(30)
        # Nobody leaves before the last rank has entered.
        assert len(entered) == 4
        return work.sequence_number

    assert run_ranks(rank_fn, 4) == [1, 1, 1, 1]


def test_every_collective_with_one_rank_per_sidecar(world2):
    # One rank per node: the sidecars run plain Gloo on the clients' buffers.
    name, _ = world2.group()

    def rank_fn(rank):
        client = world2.clients[rank]
        x = client.empty((1 << 16,), np.float32)
        x[:] = rank + 1
        client.allreduce(name, x, op="AVG")
        assert np.all(x == 1.5)
        out = np.zeros(4, np.int64)
        client.alltoall_single(name, out, np.array([rank] * 4, np.int64))
        np.testing.assert_array_equal(out, [0, 0, 1, 1])
        return True

    assert run_ranks(rank_fn, 2) == [True, True]


# -- ReduceOps and dtypes --------------------------------------------------------------------

REDUCE_CASES = [
    # (dtype, op, values of rank 0..3 as lists, expected)
    (np.float32, "SUM", lambda r: [r + 0.5, -r], lambda: [8.0, -6.0]),
    (np.float64, "AVG", lambda r: [r, 2 * r], lambda: [1.5, 3.0]),
    (np.int32, "AVG", lambda r: [r, 3], lambda: [1, 3]),  # integers truncate toward zero
    (np.float16, "PRODUCT", lambda r: [r + 1, 1], lambda: [24.0, 1.0]),
    (np.int8, "MIN", lambda r: [r - 2, 5], lambda: [-2, 5]),
    (np.uint8, "MAX", lambda r: [r * 50, 1], lambda: [150, 1]),
    (np.int16, "BAND", lambda r: [0b1111 ^ (1 << r), 0xFF], lambda: [0, 0xFF]),
    (np.int64, "BOR", lambda r: [1 << r, 0], lambda: [0b1111, 0]),
    (np.int64, "BXOR", lambda r: [1 << r, 1], lambda: [0b1111, 0]),
    (np.bool_, "SUM", lambda r: [r == 2, False], lambda: [True, False]),  # logical or
    (np.bool_, "PRODUCT", lambda r: [True, r != 1], lambda: [True, False]),  # logical and
    (np.bool_, "BXOR", lambda r: [r < 3, r < 2], lambda: [True, False]),
    (np.complex64, "SUM", lambda r: [complex(r, 1)], lambda: [complex(6, 4)]),
    (np.complex128, "PRODUCT", lambda r: [1j], lambda: [1 + 0j]),
    (np.float32, "PREMUL_SUM", lambda r: [r, 1], lambda: [3.0, 2.0]),  # scale 0.5
]


def test_every_reduce_op_and_dtype(world4):
    name, _ = world4.group()

    def rank_fn(rank):
        client = world4.clients[rank]
        works = []
        tensors = []
        for i, (dtype, op, values, _) in enumerate(REDUCE_CASES):
            x = client.empty((len(values(0)),), dtype) if i % 2 else np.empty(len(values(0)),
                                                                             dtype)
            x[:] = np.asarray(values(rank), dtype)
            tensors.append(x)
            works.append(client.allreduce(name, x, op=op, async_op=True,
                                          scale=0.5 if op == "PREMUL_SUM" else None))
        for work in works:
            work.wait(60)
        return [t.copy() for t in tensors]

    results = run_ranks(rank_fn, 4)
    for i, (dtype, op, _, expected) in enumerate(REDUCE_CASES):
        for rank in range(4):
            got = results[rank][i]
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, np.asarray(expected(), dtype),
                                          err_msg=f"{np.dtype(dtype)} {op} on rank {rank}")


def test_bfloat16_through_torch_tensors(world2):
    import torch
    name, _ = world2.group()

    def rank_fn(rank):
        client = world2.clients[rank]
        x = client.empty_tensor((64,), torch.bfloat16)
        x.fill_(rank + 1.5)
        client.allreduce(name, x, op="MAX")
        return x.clone()

    for x in run_ranks(rank_fn, 2):
        assert torch.equal(x, torch.full((64,), 2.5, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype,op", [(np.float32, "BAND"), (np.float64, "BXOR"),
                                      (np.complex64, "MIN"), (np.complex128, "MAX"),
                                      (np.int32, "PREMUL_SUM")])
def test_invalid_op_dtype_pairs_are_rejected_before_data_moves(world2, dtype, op):
    name, _ = world2.group()
    client = world2.clients[0]
    x = np.ones(4, dtype)
    with pytest.raises(collectived.InvalidArgumentError) as error:
        client.allreduce(name, x, op=op, scale=2.0 if op == "PREMUL_SUM" else None)
    assert isinstance(error.value, ValueError)
    assert op in str(error.value)
    np.testing.assert_array_equal(x, np.ones(4, dtype))

    # Rejected locally: the group is still usable by both ranks.
    def rank_fn(rank):
        y = np.full(2, rank + 1.0)
        world2.clients[rank].allreduce(name, y)
        return y
    assert all(np.all(y == 3.0) for y in run_ranks(rank_fn, 2))


# -- Work ------------------------------------------------------------------------------------


def test_work_handles(world2):
    name, _ = world2.group()
    client0, client1 = world2.clients
    x0 = np.ones(4, np.float32)
    work = client0.allreduce(name, x0, async_op=True)
    time.sleep(0.2)
    # Rank 1 has not issued its allreduce yet: the op cannot complete.
    assert not work.is_completed()
    assert work.exception() is None
    with pytest.raises(collectived.TimeoutError, match="Timeout"):
        work.wait(timeout=0.2)
    done = []
    work.add_done_callback(lambda w: done.append(w.is_completed()))
    x1 = np.full(4, 2.0, np.float32)
    client1.allreduce(name, x1)
    assert work.wait(30) is True
    assert work.is_completed() and work.exception() is None
    assert work.sequence_number == 1
    assert done == [True]
    late = []
    work.add_done_callback(lambda w: late.append(True))  # runs at once
    assert late == [True]
    np.testing.assert_array_equal(x0, [3.0] * 4)


def test_host_ops_that_ask_for_stream_ordering_get_their_completion_only(raw_world2,
                                                                         monkeypatch):
    """CollectiveRequest.stream_ordered asks for an early response once a CUDA op's GPU work is
    enqueued; an op on host memory that asks for it gets its one completion, over the ring and
    over the session stream, and Work.wait_stream waits as wait() does."""
    from raw import raw_client as client_module
    world2 = raw_world2
    plain = client_module.collectives_pb2.CollectiveRequest
    monkeypatch.setattr(client_module.collectives_pb2, "CollectiveRequest",
                        lambda **fields: plain(stream_ordered=True, **fields))
    assert client_module.collectives_pb2.CollectiveRequest(group="g").stream_ordered
    name, _ = world2.group()
    responses = []
    for client in world2.clients:
        deliver = client._deliver

        def recording(response, deliver=deliver):
            responses.append(response.enqueued)
            deliver(response)
        client._deliver = recording
    large = client_module.RING_INLINE_LIMIT // 4 + 1024  # float32s: over the ring's limit

    def rank(r):
        small = np.full(8, r + 1.0, np.float32)
        big = np.full(large, r + 1.0, np.float32)
        works = [world2.clients[r].allreduce(name, x, async_op=True) for x in (small, big)]
        assert [w._via_ring for w in works] == [True, False]
        for work in works:
            assert work.wait_stream(0, timeout=30) is True
        return small, big
    for small, big in run_ranks(rank, 2):
        np.testing.assert_array_equal(small, np.full(8, 3.0, np.float32))
        np.testing.assert_array_equal(big, np.full(large, 3.0, np.float32))
    assert len(responses) == 4 and not any(responses), responses


def test_a_large_allreduce_pipelined_across_sidecars_is_exact(world4):
    """17 MiB over two sidecars with two ranks each: the sidecars reduce it chunk by chunk over
    the network while they combine and copy back their ranks' other chunks (real Gloo)."""
    name, _ = world4.group()
    count = (17 << 20) // 4 + 5

    def rank_fn(rank):
        client = world4.clients[rank]
        x = client.empty(count, np.float32)
        x[:] = np.arange(count, dtype=np.float32) % 1000 + rank
        client.allreduce(name, x, timeout=120)
        want = 4 * (np.arange(count, dtype=np.float32) % 1000) + 6
        assert np.array_equal(x, want), np.flatnonzero(x != want)[:5]
        y = np.full(4, float(rank), np.float32)  # an op after it: tags did not collide
        client.allreduce(name, y)
        assert (y == 6).all()
        return True

    assert run_ranks(rank_fn, 4) == [True] * 4


def test_ops_complete_in_issue_order_and_sequence_numbers_agree(world4):
    name, _ = world4.group()

    def rank_fn(rank):
        client = world4.clients[rank]
        works, tensors = [], []
        for i in range(20):
            t = np.full(3 + i, rank * 100 + i, np.int64)
            tensors.append(t)
            works.append(client.allreduce(name, t, async_op=True))
        order = []
        for w in works:
            w.add_done_callback(lambda w: order.append(w.sequence_number))
        for w in works:
            w.wait(60)
        for i, t in enumerate(tensors):
            assert np.all(t == 600 + 4 * i)
        return [w.sequence_number for w in works], order

    results = run_ranks(rank_fn, 4)
    for seqs, order in results:
        assert seqs == list(range(1, 21))
        assert order == sorted(order)


# -- groups ----------------------------------------------------------------------------------


def test_subgroups_and_groups_with_the_same_members_coexist(world4):
    odd, odd_responses = world4.group(members=[3, 1])
    assert [r.group_rank for r in odd_responses] == [1, 0]  # sorted: 1 -> 0, 3 -> 1
    assert all(list(r.members) == [1, 3] for r in odd_responses)
    assert all(r.num_sidecars == 1 for r in odd_responses)  # 1 and 3 both live on node1
    mixed, mixed_responses = world4.group(members=[0, 3])
    assert all(r.num_sidecars == 2 for r in mixed_responses)
    twin, _ = world4.group(members=[1, 3])
    members = {odd: [1, 3], mixed: [0, 3], twin: [1, 3]}

    def rank_fn(rank):
        results = {}
        for name, group_members in members.items():
            if rank in group_members:
                x = np.array([rank], np.int64)
                world4.clients[rank].allreduce(name, x)
                results[name] = int(x[0])
        return results

    results = run_ranks(rank_fn, 4)
    assert results[1] == {odd: 4, twin: 4}
    assert results[3] == {odd: 4, mixed: 3, twin: 4}
    assert results[0] == {mixed: 3}
    # A non-member gets a clear error, never a hang (rank 2 shares node0 with member 0).
    with pytest.raises(collectived.InvalidArgumentError) as error:
        world4.clients[2].allreduce(mixed, np.zeros(1, np.float32))
    assert "not part of group" in str(error.value) and mixed in str(error.value)


def test_joining_a_group_one_is_not_a_member_of_is_rejected(world4):
    with pytest.raises(collectived.InvalidArgumentError) as error:
        world4.clients[0].create_group(unique(), 0, 4, members=[1, 2],
                                       store_address=world4.store_address, timeout=5)
    assert "not part of group" in str(error.value)


def test_destroyed_group_can_be_created_again(world2):
    name, _ = world2.group()
    run_ranks(lambda r: world2.clients[r].allreduce(name, np.ones(2)), 2)
    run_ranks(lambda r: world2.clients[r].destroy_group(name), 2)
    with pytest.raises(collectived.CollectivedError):
        world2.clients[0].allreduce(name, np.ones(2))
    _, responses = world2.group(name=name)
    assert all(r.sequence_number == 0 for r in responses)
    results = run_ranks(lambda r: world2.clients[r].allreduce(name, np.ones(2)).sequence_number,
                        2)
    assert results == [1, 1]


def test_group_creation_times_out_naming_missing_ranks(world4):
    name = unique()

    def rank_fn(rank):
        return world4.clients[rank].create_group(name, rank, 4, store_address=world4.store_address,
                                                 timeout=2)

    start = time.monotonic()
    results = run_ranks_catching(lambda r: rank_fn(r) if r < 3 else None, 4)
    assert time.monotonic() - start < 30
    for rank in range(3):
        error = results[rank]
        assert isinstance(error, collectived.TimeoutError), error
        assert "Timeout" in str(error) and "3" in str(error)


# -- errors ----------------------------------------------------------------------------------


def test_invalid_root_is_a_value_error_with_the_sidecars_message(world2):
    name, _ = world2.group()
    client = world2.clients[0]
    for call in (lambda: client.broadcast(name, np.zeros(3), root=7),
                 lambda: client.reduce(name, np.zeros(3), root=-1),
                 lambda: client.gather(name, np.zeros(3), [np.zeros(3)] * 2, root=2),
                 lambda: client.scatter(name, np.zeros(3), None, root=5)):
        with pytest.raises(collectived.InvalidArgumentError) as error:
            call()
        assert isinstance(error.value, ValueError) and isinstance(error.value, RuntimeError)
        assert "root" in str(error.value) and name in str(error.value)
    with pytest.raises(ValueError, match="root rank 7"):
        client.broadcast(name, np.zeros(3), root=7, async_op=True).wait(10)


def test_unknown_group_is_a_value_error(sidecar):
    # engine/vocabulary/status.h and common.proto classify "unknown group" as INVALID_ARGUMENT.
    with Client(sidecar.unix_address) as client:
        with pytest.raises(collectived.InvalidArgumentError) as error:
            client.allreduce("no-such-group", np.zeros(3, np.float32))
        assert isinstance(error.value, ValueError)
        assert "unknown group 'no-such-group'" in str(error.value)


def test_validation_errors_mirror_c10d(world2):
    name, _ = world2.group()
    client = world2.clients[0]
    cases = [
        (lambda: client.send(name, np.zeros(2), 0), "same as the rank of the caller"),
        (lambda: client.send(name, np.zeros(2), 9), "9"),
        (lambda: client.allgather(name, [np.zeros(2), np.zeros(2, np.int32)], np.zeros(2)),
         "dtype"),
        (lambda: client.allgather(name, [np.zeros(2)] * 3, np.zeros(2)), "3"),
        (lambda: client.allgather_into_tensor(name, np.zeros(3), np.zeros(2)), "size"),
        (lambda: client.alltoall_single(name, np.zeros(4), np.zeros(4), input_splits=[1, 2],
                                        output_splits=[2, 2]), "split"),
    ]
    for call, needle in cases:
        with pytest.raises(collectived.InvalidArgumentError) as error:
            call()
        assert needle in str(error.value).lower(), str(error.value)


def test_timeout_error_says_timeout_and_names_group_op_and_sequence(world2):
    name, _ = world2.group()
    start = time.monotonic()
    with pytest.raises(collectived.TimeoutError) as error:
        world2.clients[0].allreduce(name, np.zeros(3, np.float32), timeout=0.5)
    elapsed = time.monotonic() - start
    message = str(error.value)
    assert "Timeout" in message and name in message and "allreduce" in message, message
    assert "1" in message  # the sequence number
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, TimeoutError)
    assert 0.4 < elapsed < 10


def test_timeout_error_says_timed_out_as_c10d_and_names_the_missing_rank(world2):
    name, _ = world2.group()
    with pytest.raises(collectived.TimeoutError) as error:
        world2.clients[0].barrier(name, timeout=0.5)
    message = str(error.value)
    # The regex torch's own barrier-timeout test matches.
    assert re.search(" (Timed out|closed|timeout) ", message), message
    assert f"barrier (seq 1) on group '{name}'" in message and "ranks [1]" in message, message


def test_recv_from_any_source_receives_each_send_once_naming_its_sender(world4):
    name, _ = world4.group()

    def rank_fn(rank):
        client = world4.clients[rank]
        if rank != 0:
            works = [client.send(name, np.full(3, rank * 10 + k, np.int64), 0, tag=4,
                                 async_op=True) for k in range(2)]
            for work in works:
                work.wait(60)
            return None
        buffers = [np.zeros(3, np.int64) for _ in range(6)]
        works = [client.recv(name, b, tag=4, async_op=True) for b in buffers]
        for work in works:
            work.wait(60)
        return [(w.source_rank, int(b[0])) for w, b in zip(works, buffers)]

    received = run_ranks(rank_fn, 4)[0]
    assert sorted(src for src, _ in received) == [1, 1, 2, 2, 3, 3], received
    for src in (1, 2, 3):
        # Each sender's messages in the order it sent them, each received once.
        assert [value for s, value in received if s == src] == [src * 10, src * 10 + 1], received


def test_recv_from_any_source_refuses_a_bad_tag_or_tensor_naming_group_and_op(world2):
    name, _ = world2.group()
    client = world2.clients[0]
    for tag in (1.5, "7", True, 2**63):
        with pytest.raises(ValueError) as error:
            client.recv(name, np.zeros(2), tag=tag)
        assert f"recv (from any rank, tag {tag!r}) on group '{name}'" in str(error.value)
        assert "tag must be an integer" in str(error.value)
    with pytest.raises(ValueError) as error:
        client.recv(name, np.zeros((4, 4))[:, 0])
    assert f"on group '{name}'" in str(error.value) and "contiguous" in str(error.value)
    # The group still works, and a recv from any rank is served after the refusals.
    got = np.zeros(2)
    run_ranks(lambda rank: (client.recv(name, got) if rank == 0 else
                            world2.clients[1].send(name, np.ones(2), 0)), 2)
    np.testing.assert_array_equal(got, [1, 1])


def test_desync_fails_every_rank_naming_what_differed(world2):
    name, _ = world2.group()

    def rank_fn(rank):
        client = world2.clients[rank]
        if rank == 0:
            client.allreduce(name, np.zeros(4, np.float32), timeout=20)
        else:
            client.broadcast(name, np.zeros(4, np.float32), root=0, timeout=20)

    results = run_ranks_catching(rank_fn, 2)
    for error in results:
        assert isinstance(error, collectived.DesyncError), error
        assert isinstance(error, RuntimeError)
        message = str(error)
        assert "allreduce" in message and "broadcast" in message, message


# -- lost peers ------------------------------------------------------------------------------


def test_a_client_that_closes_fails_its_peers_pending_and_later_ops(world4):
    name, _ = world4.group()
    # Ranks 0..2 start an allreduce that rank 3 will never join.
    works = [world4.clients[r].allreduce(name, np.ones(8, np.float32), async_op=True)
             for r in range(3)]
    time.sleep(0.3)
    assert not any(w.is_completed() for w in works)
    start = time.monotonic()
    world4.clients[3].close()
    for rank, work in enumerate(works):
        # Promptly (one shared 10 s budget), not after the op's 60 s timeout.
        with pytest.raises(collectived.PeerLostError) as error:
            work.wait(max(0.1, start + 10 - time.monotonic()))
        assert "rank 3" in str(error.value), (rank, str(error.value))
        assert isinstance(work.exception(), collectived.PeerLostError)
    # Later ops on the group fail too, at once.
    with pytest.raises(collectived.PeerLostError, match="rank 3"):
        world4.clients[1].allreduce(name, np.ones(2, np.float32), timeout=5)


def test_a_client_that_dies_without_closing_fails_its_peers(two_nodes, tmp_path):
    """A real process attached to node1 is killed with SIGKILL; its peer on node0 sees it."""
    import os
    import signal
    import subprocess
    import sys

    two_sidecars = two_nodes
    name = unique()
    store_address = two_sidecars[0].tcp_address
    script = tmp_path / "victim.py"
    script.write_text(
        "import sys, time\n"
        "from collectived import Client\n"
        "c = Client(sys.argv[1])\n"
        f"c.create_group({name!r}, 1, 2, store_address={store_address!r}, timeout=60)\n"
        "print('joined', flush=True)\n"
        "time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=python_path())
    victim = subprocess.Popen([sys.executable, str(script), two_sidecars[1].unix_address],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        with Client(two_sidecars[0].unix_address) as client:
            client.create_group(name, 0, 2, store_address=store_address, timeout=60)
            assert victim.stdout.readline().strip() == "joined"
            work = client.allreduce(name, np.ones(4), async_op=True)
            time.sleep(0.2)
            start = time.monotonic()
            victim.send_signal(signal.SIGKILL)
            with pytest.raises(collectived.PeerLostError) as error:
                work.wait(30)
            assert "rank 1" in str(error.value)
            assert time.monotonic() - start < 10
    finally:
        victim.kill()
        victim.wait()


def test_inline_outputs_larger_than_a_response_are_refused_before_allocation(sidecar):
    """A request gives an inline output only as a dtype and a count; the sidecar would allocate
    it. One naming 2^36 float32 (256 GiB) in a few bytes must be refused, not allocated."""
    import grpc
    from collectived.v1 import collectives_pb2, collectives_pb2_grpc, common_pb2

    name = unique("inline")
    with RawClient(sidecar.unix_address) as client:
        client.create_group(name, rank=0, world_size=1)
        # On the session's own connection: any other is refused before validation.
        stub = collectives_pb2_grpc.CollectivesStub(client._channel)
        request = collectives_pb2.CollectiveRequest(session_id=client.session_id, group=name)
        request.allgather_into_tensor.input.CopyFrom(
            common_pb2.Tensor(dtype=common_pb2.FLOAT32, count=1, inline=b"\0\0\0\0"))
        request.allgather_into_tensor.output.CopyFrom(
            common_pb2.Tensor(dtype=common_pb2.FLOAT32, count=1 << 36))
        with pytest.raises(grpc.RpcError) as refused:
            stub.Run(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than a message can carry back: use shared memory" in refused.value.details()
        assert f"group '{name}'" in refused.value.details()
        # The sidecar is fine and the group still works.
        x = np.arange(4, dtype=np.float32)
        client.allreduce(name, x)
        np.testing.assert_array_equal(x, np.arange(4, dtype=np.float32))
