"""Shrinking groups that lose the sidecar whose store they meet in (docs/fault-tolerance.md,
losing the store's sidecar), with real sidecar processes on loopback: the first sidecar, whose
store the group met in, is SIGKILLed. The survivors move the group's store to the lowest of them
that answers, agree there on what the others agree on after any sidecar's loss, and go on; an
unmodified DDP job whose rank 0 (and torch's store with it) is lost goes on too."""

import pathlib
import tempfile
import time

import pytest
import torch

from test_fault_tolerance_sidecar_loss import World, kill, one_outcome_per_op_through_a_kill
from test_observability import metrics, value
from torch_helpers import HELPERS, Sidecars, launch

SIDECARS = 3


@pytest.fixture
def three_sidecars():
    """Three sidecars; the test kills the first one, whose store the groups meet in. The others
    must exit cleanly."""
    sides = Sidecars(SIDECARS, metrics=True)
    yield sides
    logs = sides.logs()
    codes = sides.stop()
    assert codes[1:] == [0] * (SIDECARS - 1), f"sidecars exited with {codes}\n{logs}"


class StoreWorld(World):
    """World's ranks and group; the first sidecar (ranks 0, 1) is the one lost: the survivors'
    SUM is 3 + 4 + 5 + 6, rescaled by 6 / 4 to 27."""

    WITHOUT_FIRST = 27.0
    SURVIVORS = [2, 3, 4, 5]


def test_the_stores_sidecar_killed_between_ops_leaves_the_others_going_on(three_sidecars):
    w = StoreWorld(three_sidecars)
    try:
        assert [t[0] for t in w.each(w.allreduce)] == [w.WHOLE] * w.WORLD
        kill(three_sidecars[0])
        started = time.monotonic()
        assert [t[0] for t in w.each(w.allreduce, w.SURVIVORS)] == [w.WITHOUT_FIRST] * 4
        resumed = time.monotonic() - started
        assert [t[0] for t in w.each(w.allreduce, w.SURVIVORS)] == [w.WITHOUT_FIRST] * 4
        print(f"first op after the store's sidecar's SIGKILL completed in {resumed:.3f} s")
        (summary,) = [g for g in w.clients[2].list_groups() if g.name == w.name]
        assert (summary.epoch, list(summary.lost_group_ranks)) == (1, [0, 1]), summary
        for side in three_sidecars.sides[1:]:
            log = side.log()
            assert "the store of a fault-tolerant group was lost" in log, log[-3000:]
            assert 'store="sidecar ' in log, log[-3000:]
            assert "lost_group_ranks=0,1" in log, log[-3000:]
            assert value(metrics(side), "collectived_membership_changes_total",
                         reason="sidecar_lost") == 1.0, metrics(side)
    finally:
        w.close()


def test_an_op_in_flight_when_the_stores_sidecar_is_killed_completes_among_the_survivors(
        three_sidecars):
    w = StoreWorld(three_sidecars)
    try:
        w.each(w.allreduce)
        waiting = [w.pool.submit(w.allreduce, rank, w.clients[rank]) for rank in w.SURVIVORS]
        time.sleep(0.2)
        assert not any(f.done() for f in waiting)
        kill(three_sidecars[0])
        assert [f.result(timeout=30)[0] for f in waiting] == [w.WITHOUT_FIRST] * 4
    finally:
        w.close()


def test_ops_running_when_the_stores_sidecar_is_killed_have_one_outcome_on_every_survivor(
        three_sidecars):
    w = StoreWorld(three_sidecars)
    try:
        one_outcome_per_op_through_a_kill(w, three_sidecars[0], 0, w.WITHOUT_FIRST, ops=120)
    finally:
        w.close()


def test_an_unmodified_ddp_job_goes_on_when_rank_0s_sidecar_is_killed(three_sidecars):
    """3 trainers, one per sidecar (env://: torch's store lives in rank 0), shrinking; rank 0
    SIGKILLs its own sidecar, whose store the sidecars met in, right after its step 4 of 12, and
    dies of it (torch's store with it). Ranks 1 and 2 finish every step with identical
    parameters, equal to what one process computes with the same membership."""
    import sys
    sys.path.insert(0, str(HELPERS))
    from ft_ddp_worker import ft_model
    from test_fault_tolerance import reference_step

    world, kill_rank, kill_after, steps = 3, 0, 4, 12
    survivors = [1, 2]
    with tempfile.TemporaryDirectory(prefix="ft-store-ddp-") as out:
        ranks = launch(HELPERS / "ft_ddp_worker.py", [out, kill_rank, kill_after, steps], world,
                       three_sidecars, init="env", timeout=120,
                       env={"COLLECTIVED_FAULT_TOLERANCE": "shrink",
                            "FT_KILL_PID": str(three_sidecars[0].process.pid)}).wait()
        assert ranks.returncodes[kill_rank] != 0, ranks.output_of(kill_rank)
        for rank in survivors:
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        finals = [torch.load(pathlib.Path(out) / f"rank{rank}.pt") for rank in survivors]
    three_sidecars[0].process.wait(timeout=10)

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
