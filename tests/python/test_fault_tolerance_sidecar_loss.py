"""Shrinking groups that lose a whole sidecar (docs/fault-tolerance.md, losing a sidecar), with
real sidecar processes on loopback, one of which is SIGKILLed: its trainers lose their session,
the surviving sidecars freeze the epoch, agree on the last op every one of them finished, hand
that out and run the later ops again among the live ranks from the inputs they kept. Each op has
one outcome on every survivor, and an unmodified DDP job goes on."""

import concurrent.futures
import pathlib
import signal
import tempfile
import threading
import time

import numpy as np
import pytest
import torch

from collectived import Client
from conftest import unique
from test_observability import metrics, value
from torch_helpers import HELPERS, Sidecars, launch

JOIN_TIMEOUT = 30
SIDECARS = 3


@pytest.fixture
def three_sidecars():
    """Three sidecars; the test kills the last one. The others must exit cleanly."""
    sides = Sidecars(SIDECARS, metrics=True)
    yield sides
    logs = sides.logs()
    codes = sides.stop()
    assert codes[:-1] == [0] * (SIDECARS - 1), f"sidecars exited with {codes}\n{logs}"


def kill(side):
    side.process.send_signal(signal.SIGKILL)
    side.process.wait(timeout=10)


class World:
    """2 ranks per sidecar (rank r on sidecar r // 2), one shrinking group that meets in the first
    sidecar's store. Rank r contributes r + 1 to a SUM: 21 over the 6 ranks, and 10 over the
    first two sidecars' ranks, rescaled by 6 / 4 to 15 once the last sidecar is lost."""

    WORLD = 6
    WHOLE = 21.0
    WITHOUT_LAST = 15.0
    SURVIVORS = [0, 1, 2, 3]

    def __init__(self, sidecars):
        self.name = unique("ft-node")
        self.sidecars = sidecars
        self.clients = [Client(sidecars[rank // 2].unix_address) for rank in range(self.WORLD)]
        self.pool = concurrent.futures.ThreadPoolExecutor(self.WORLD)
        self.each(lambda rank, client: client.create_group(
            self.name, rank, self.WORLD, timeout=JOIN_TIMEOUT, fault_tolerance="shrink",
            store_address=sidecars[0].tcp_address))

    def each(self, call, ranks=None):
        ranks = range(self.WORLD) if ranks is None else ranks
        futures = [self.pool.submit(call, rank, self.clients[rank]) for rank in ranks]
        return [future.result(timeout=60) for future in futures]

    def allreduce(self, rank, client, elements=4):
        tensor = np.full(elements, rank + 1, dtype=np.float32)
        client.allreduce(self.name, tensor)
        return tensor

    def close(self):
        for client in self.clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the killed sidecar's sessions are gone
                pass
        self.pool.shutdown()


def test_a_sidecar_killed_between_ops_leaves_the_others_going_on(three_sidecars):
    w = World(three_sidecars)
    try:
        assert [t[0] for t in w.each(w.allreduce)] == [w.WHOLE] * w.WORLD
        kill(three_sidecars[2])
        started = time.monotonic()
        assert [t[0] for t in w.each(w.allreduce, w.SURVIVORS)] == [w.WITHOUT_LAST] * 4
        resumed = time.monotonic() - started
        assert [t[0] for t in w.each(w.allreduce, w.SURVIVORS)] == [w.WITHOUT_LAST] * 4
        print(f"first op after the sidecar's SIGKILL completed in {resumed:.3f} s")
        (summary,) = [g for g in w.clients[0].list_groups() if g.name == w.name]
        assert (summary.epoch, list(summary.lost_group_ranks)) == (1, [4, 5]), summary
        for side in three_sidecars.sides[:2]:
            log = side.log()
            assert "peer sidecar lost: its fault-tolerant group freezes" in log, log[-3000:]
            assert "lost_group_ranks=4,5" in log, log[-3000:]
            assert value(metrics(side), "collectived_membership_changes_total",
                         reason="sidecar_lost") == 1.0, metrics(side)
    finally:
        w.close()


def test_an_op_in_flight_when_a_sidecar_is_killed_completes_among_the_survivors(
        three_sidecars):
    w = World(three_sidecars)
    try:
        w.each(w.allreduce)
        waiting = [w.pool.submit(w.allreduce, rank, w.clients[rank]) for rank in w.SURVIVORS]
        time.sleep(0.2)
        assert not any(f.done() for f in waiting)
        kill(three_sidecars[2])
        assert [f.result(timeout=30)[0] for f in waiting] == [w.WITHOUT_LAST] * 4
    finally:
        w.close()


def one_outcome_per_op_through_a_kill(w, victim, killer, without, ops=150):
    """Every rank of World `w` runs allreduces back to back (some of 1 MiB, whose data phase
    takes a while); rank `killer` SIGKILLs sidecar `victim` after its op 40. On the survivors,
    every op up to some point has the whole group's sum and every later one `without` (the
    survivors', rescaled, from the kept inputs): none fails, none is torn, none differs between
    survivors."""
    got = {rank: [] for rank in w.SURVIVORS}
    killed = threading.Event()

    def run(rank, client):
        for op in range(ops):
            elements = 256 * 1024 if op % 3 == 0 else 4
            try:
                tensor = w.allreduce(rank, client, elements)
            except Exception:
                if rank in w.SURVIVORS:
                    raise
                return  # the killed sidecar's ranks lose their session
            if rank in w.SURVIVORS:
                assert np.all(tensor == tensor[0]), (rank, op, np.unique(tensor))
                got[rank].append(float(tensor[0]))
            if rank == killer and op == 40:
                killed.set()
                kill(victim)
                return

    w.each(run)
    assert killed.is_set()
    first = got[w.SURVIVORS[0]]
    for rank in w.SURVIVORS:
        assert got[rank] == first, rank
    assert len(first) == ops
    cut = first.index(without)
    assert cut >= 40
    assert first == [w.WHOLE] * cut + [without] * (ops - cut), first


def test_ops_running_when_a_sidecar_is_killed_have_one_outcome_on_every_survivor(
        three_sidecars):
    w = World(three_sidecars)
    try:
        one_outcome_per_op_through_a_kill(w, three_sidecars[2], 5, w.WITHOUT_LAST)
    finally:
        w.close()


def ddp_job_through_a_sidecars_kill(sidecars, kill_rank):
    """3 trainers, one per sidecar, COLLECTIVED_FAULT_TOLERANCE=shrink; rank `kill_rank` SIGKILLs
    its own sidecar right after its step 4 of 12 (and dies of it). The other two finish every
    step with identical parameters, equal to what one process computes with the same
    membership: steps 0-4 average the gradients of 3 ranks, steps 5-11 those of the other two."""
    import sys
    sys.path.insert(0, str(HELPERS))
    from ft_ddp_worker import ft_model
    from test_fault_tolerance import reference_step

    world, kill_after, steps = 3, 4, 12
    survivors = [rank for rank in range(world) if rank != kill_rank]
    victim = sidecars[kill_rank]
    with tempfile.TemporaryDirectory(prefix="ft-node-ddp-") as out:
        ranks = launch(HELPERS / "ft_ddp_worker.py", [out, kill_rank, kill_after, steps], world,
                       sidecars, init="env", timeout=120,
                       env={"COLLECTIVED_FAULT_TOLERANCE": "shrink",
                            "FT_KILL_PID": str(victim.process.pid)}).wait()
        assert ranks.returncodes[kill_rank] != 0, ranks.output_of(kill_rank)
        for rank in survivors:
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        finals = [torch.load(pathlib.Path(out) / f"rank{rank}.pt") for rank in survivors]
    victim.process.wait(timeout=10)

    reference = ft_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps):
        live = range(world) if step <= kill_after else survivors
        reference_step(reference, optimizer, step, live)
    for key in finals[0]:
        assert torch.equal(finals[1][key], finals[0][key]), key
    for key, expected in reference.state_dict().items():
        assert torch.allclose(finals[0][key], expected, rtol=1e-5, atol=1e-6), (
            key, (finals[0][key] - expected).abs().max().item())


def test_an_unmodified_ddp_job_goes_on_when_a_sidecar_is_killed(three_sidecars):
    ddp_job_through_a_sidecars_kill(three_sidecars, kill_rank=2)


def test_an_op_in_flight_that_needs_a_lost_rank_fails_naming_it_and_the_group_goes_on(
        three_sidecars):
    """A broadcast from rank 4 waits for it when its sidecar is SIGKILLed: it runs again in the
    next epoch, where its root is lost, and fails with PEER_LOST naming it on every survivor;
    the group is not failed, and the next allreduce runs among the survivors."""
    from collectived.errors import PeerLostError
    w = World(three_sidecars)
    try:
        w.each(w.allreduce)

        def broadcast_from_4(rank, client):
            with pytest.raises(PeerLostError) as lost:
                client.broadcast(w.name, np.zeros(2, dtype=np.float32), root=4)
            return str(lost.value)

        waiting = [w.pool.submit(broadcast_from_4, rank, w.clients[rank])
                   for rank in w.SURVIVORS]
        time.sleep(0.2)
        kill(three_sidecars[2])
        messages = [f.result(timeout=30) for f in waiting]
        assert all("its root, group rank 4, was lost" in m for m in messages), messages
        assert [t[0] for t in w.each(w.allreduce, w.SURVIVORS)] == [w.WITHOUT_LAST] * 4
    finally:
        w.close()
