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

from test_fault_tolerance_sidecar_loss import (World, ddp_job_through_a_sidecars_kill, kill,
                                              one_outcome_per_op_through_a_kill)
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
    """With env://, torch's store lives in rank 0 and the sidecars meet in rank 0's sidecar's
    store: rank 0 kills that sidecar after its step 4 and dies of it, torch's store with it; the
    other two go on with identical parameters, equal to the reference."""
    ddp_job_through_a_sidecars_kill(three_sidecars, kill_rank=0)


def admitted_step(log):
    return next((e["step"] for e in log if e["admitted"]), None)


@pytest.fixture
def three_sidecars_and_a_store():
    """Three sidecars with one rank each and a fourth that hosts none: the job's store (a store
    pod, say). The test kills the first (and those it adds to ``sides.killed``); the others
    must exit cleanly."""
    sides = Sidecars(4, metrics=True)
    sides.killed = {0}
    yield sides
    logs = sides.logs()
    codes = sides.stop()
    kept = [code for i, code in enumerate(codes) if i not in sides.killed]
    assert kept == [0] * len(kept), f"sidecars exited with {codes}\n{logs}"


def rank_0_replaced_on_another_node(sides, store, kill_earlier=None):
    """A job through collectived.torch.ft whose store is ``store`` (collectived.torch.Store): rank
    0 SIGKILLs its own sidecar in the middle of step 5 (and dies of it), after killing
    ``kill_earlier`` (STEP:PID) if given; rank 0 is started again on another node's sidecar, as a
    rescheduled pod would be, and joins at a step boundary with the survivors' state. Every rank
    ends with bit-identical parameters, equal to what one process computes with the same
    membership."""
    import json

    from test_fault_tolerance import assert_grow_reference

    world, kill_at, after_join, survivors = 3, 5, 10, [1, 2]
    env = {"COLLECTIVED_FAULT_TOLERANCE": "shrink", "FT_TEST_STORE": store,
           "FT_KILL_PID": str(sides[0].process.pid)}
    if kill_earlier:
        env["FT_KILL_EARLIER"] = kill_earlier
    with tempfile.TemporaryDirectory(prefix="ft-rank0-node-") as out:
        ranks = launch(HELPERS / "ft_grow_worker.py", [out, 0, kill_at, after_join], world,
                       sides, init="env", timeout=150, env=env)
        ranks.procs[0].wait(timeout=60)
        ranks.relaunch(0, env={"COLLECTIVED_ADDRESS": sides[1].unix_address})
        ranks.wait()
        code, output = ranks.earlier[0]
        assert code != 0, output[-3000:]
        for rank in range(world):
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        finals = [torch.load(pathlib.Path(out) / f"rank{rank}.pt") for rank in range(world)]
        runs = [json.loads((pathlib.Path(out) / f"rank{rank}.json").read_text())
                for rank in range(world)]

    for side in sides.sides[1:3]:
        assert "peer sidecar lost" in side.log(), side.log()[-3000:]
    log = runs[1]["log"]
    assert runs[2]["log"] == log, "the survivors' steps differ"
    print(f"replacement admitted at step {admitted_step(log)}, its start step "
          f"{runs[0]['start_step']}, {runs[0]['joined_after_s']:.2f} s after its start")
    by_step = {entry["step"]: entry for entry in log}
    assert not by_step[kill_at]["committed"], log
    admitted = [s for s, e in by_step.items() if e["admitted"]]
    assert len(admitted) == 1 and by_step[admitted[0]]["admitted"] == [0], log
    joined = admitted[0]
    assert runs[0]["start_step"] == joined
    assert all(e["committed"] for e in runs[0]["log"])
    for final in finals[1:]:
        for key in final:
            assert torch.equal(final[key], finals[0][key]), key

    assert_grow_reference(finals[0], log, kill_at, joined, survivors, world)


def test_a_replacement_for_rank_0_joins_after_its_node_is_lost(three_sidecars_and_a_store):
    """The job's store is a fourth sidecar's (a store pod, over TCP): the sidecars meet in it
    too, off every trainer's node, so losing rank 0's node moves nothing."""
    sides = three_sidecars_and_a_store
    rank_0_replaced_on_another_node(sides, sides[3].tcp_address)
    for side in sides.sides[1:3]:
        assert "the store of a fault-tolerant group was lost" not in side.log()


def test_a_replacement_finds_the_job_through_its_store_list_once_the_store_is_lost(
        three_sidecars_and_a_store):
    """The job's store is a list: the store pod, then the third and second trainers' sidecars.
    Rank 0 kills the store pod before step 2: the trainers' stores and the group's move to the
    third sidecar's, the list's next, where the survivors carry what a replacement reads. Rank
    0's node is lost at step 5; its replacement, given the same list, finds the job's keys and
    the group there, joins, and ends bit-identical."""
    sides = three_sidecars_and_a_store
    sides.killed.add(3)
    store = ",".join([sides[3].tcp_address, sides[2].tcp_address, sides[1].tcp_address])
    rank_0_replaced_on_another_node(sides, store,
                                    kill_earlier=f"2:{sides[3].process.pid}")
    for side in sides.sides[1:3]:
        log = side.log()
        assert "the store of a fault-tolerant group was lost" in log, log[-3000:]
        assert f'store="store {sides[2].tcp_address}"' in log, log[-3000:]
