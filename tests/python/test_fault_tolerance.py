"""Groups that shrink when they lose a rank (docs/fault-tolerance.md), with real sidecars on
loopback: the survivors go on in a new membership epoch with the group's size and rank numbers
unchanged, a SUM is rescaled so that dividing by the group's size gives the mean over the live
ranks, ops that need the lost rank fail naming it, and the ops the lost rank issued before it
went still run with its input. The default stays fail-fast."""

import concurrent.futures
import pathlib
import signal
import tempfile
import time

import numpy as np
import pytest
import torch

from collectived import Client
from collectived.errors import InvalidArgumentError, PeerLostError
from conftest import unique
from torch_helpers import HELPERS, launch, module_sidecars  # noqa: F401

WORLD = 4
JOIN_TIMEOUT = 30


def layout(sidecars):
    """Ranks 0 and 1 on the first sidecar, 2 and 3 on the second."""
    return [sidecars[rank * len(sidecars) // WORLD] for rank in range(WORLD)]


class World:
    """WORLD clients (one session each) in one group; rank r on layout(sidecars)[r]."""

    def __init__(self, sidecars, **group_options):
        self.name = unique("ft")
        self.clients = [Client(side.unix_address) for side in layout(sidecars)]
        self.pool = concurrent.futures.ThreadPoolExecutor(WORLD)
        self.each(lambda rank, client: client.create_group(
            self.name, rank, WORLD, timeout=JOIN_TIMEOUT, store_address=sidecars[0].tcp_address,
            **group_options))

    def each(self, call, ranks=None):
        """call(rank, client) on every rank of ``ranks`` (default: all) at once; the results in
        rank order. An exception of any rank is raised."""
        ranks = range(WORLD) if ranks is None else ranks
        futures = [self.pool.submit(call, rank, self.clients[rank]) for rank in ranks]
        return [future.result(timeout=60) for future in futures]

    def lose(self, rank):
        """Rank ``rank``'s session ends, as when its trainer dies."""
        self.clients[rank].close()
        self.clients[rank] = None

    def close(self):
        for client in self.clients:
            if client is not None:
                client.close()
        self.pool.shutdown()


@pytest.fixture
def world(module_sidecars):  # noqa: F811
    made = []

    def make(**group_options):
        made.append(World(module_sidecars, **group_options))
        return made[-1]

    yield make
    for each in made:
        each.close()


def allreduce(value, op="SUM", dtype=np.float32):
    def run(rank, client):
        tensor = np.full(4, value(rank) if callable(value) else value, dtype=dtype)
        client.allreduce(world_name(client), tensor, op=op)
        return tensor
    return run


_names = {}


def world_name(client):
    return _names[id(client)]


def named(world_):
    for client in world_.clients:
        _names[id(client)] = world_.name
    return world_


SURVIVORS = [0, 1, 2]


def test_the_survivors_go_on_and_a_sum_is_rescaled_to_the_group_size(world):
    w = named(world(fault_tolerance="shrink"))
    assert [t[0] for t in w.each(allreduce(1.0))] == [4.0] * WORLD
    w.lose(3)
    # 3 live ranks of 4: the sum of ones is scaled by 4/3, so that DDP's division by 4 gives the
    # mean over the survivors.
    got = w.each(allreduce(1.0), SURVIVORS)
    assert [t.tolist() for t in got] == [[4.0] * 4] * 3, got
    got = w.each(allreduce(lambda rank: rank + 1.0, "AVG"), SURVIVORS)
    assert all(np.allclose(t, 2.0) for t in got), got  # the mean of 1, 2, 3
    got = w.each(allreduce(lambda rank: rank + 1.0, "MAX"), SURVIVORS)
    assert all((t == 3.0).all() for t in got), got
    # Integer sums are not scaled: the plain sum of the live ranks.
    got = w.each(allreduce(2, "SUM", np.int64), SURVIVORS)
    assert all((t == 6).all() for t in got), got
    # A broadcast from a live root goes on, with its root named in the group's numbering.
    def broadcast(rank, client):
        tensor = np.full(2, 7.0 if rank == 2 else 0.0, dtype=np.float32)
        client.broadcast(w.name, tensor, root=2)
        return tensor
    assert all((t == 7.0).all() for t in w.each(broadcast, SURVIVORS))
    # What an operator sees: the group's own size and members, its epoch and what it lost; each
    # op's record carries the epoch it ran in.
    for rank in (0, 2):
        (summary,) = [g for g in w.clients[rank].list_groups() if g.name == w.name]
        assert (summary.group_size, list(summary.members), summary.epoch,
                list(summary.lost_group_ranks)) == (WORLD, [0, 1, 2, 3], 1, [3]), summary
        assert list(summary.local_group_ranks) == ([0, 1] if rank == 0 else [2]), summary
    records = w.clients[0].flight_recorder(w.name)
    assert {op.epoch for op in records if op.sequence_number > 1} == {1}, records


def test_ops_that_need_the_lost_rank_fail_naming_it_and_the_group_goes_on(world):
    w = named(world(fault_tolerance="shrink"))
    w.lose(3)

    def allgather(rank, client):
        outputs = [np.zeros(2, dtype=np.float32) for _ in range(WORLD)]
        with pytest.raises(PeerLostError) as lost:
            client.allgather(w.name, outputs, np.full(2, rank, dtype=np.float32))
        return str(lost.value)

    messages = w.each(allgather, SURVIVORS)
    assert all("group ranks 3 were lost" in m and "allgather" in m for m in messages), messages

    def broadcast_from_lost(rank, client):
        with pytest.raises(PeerLostError) as lost:
            client.broadcast(w.name, np.zeros(2, dtype=np.float32), root=3)
        return str(lost.value)

    messages = w.each(broadcast_from_lost, SURVIVORS)
    assert all("its root, group rank 3, was lost" in m for m in messages), messages
    # Not a failed group: the next allreduce runs among the survivors.
    assert [t[0] for t in w.each(allreduce(3.0), SURVIVORS)] == [12.0] * 3


def test_an_op_waiting_for_the_lost_rank_completes_among_the_survivors(world):
    w = named(world(fault_tolerance="shrink"))
    tensors = [np.full(4, 1.0, dtype=np.float32) for _ in SURVIVORS]
    works = [w.clients[r].allreduce(w.name, tensors[r], async_op=True) for r in SURVIVORS]
    # The survivors' op waits for rank 3, which never issues it.
    time.sleep(0.3)
    assert not any(work.is_completed() for work in works)
    w.lose(3)
    for work in works:
        work.wait(timeout=30)
    assert [t.tolist() for t in tensors] == [[4.0] * 4] * 3, tensors


def test_ops_the_lost_rank_issued_before_it_went_run_with_its_input(world):
    w = named(world(fault_tolerance="shrink"))
    lost_input = np.full(4, 10.0, dtype=np.float32)
    w.clients[3].allreduce(w.name, lost_input, async_op=True)
    w.lose(3)
    # The op before the cut: every rank's input, the lost one's included, over the whole group.
    got = w.each(allreduce(1.0), SURVIVORS)
    assert [t.tolist() for t in got] == [[13.0] * 4] * 3, got
    # The next one is past the cut: over the survivors, rescaled.
    got = w.each(allreduce(1.0), SURVIVORS)
    assert [t.tolist() for t in got] == [[4.0] * 4] * 3, got


def test_two_losses_one_after_the_other(world):
    w = named(world(fault_tolerance="shrink"))
    w.lose(3)
    assert [t[0] for t in w.each(allreduce(1.0), SURVIVORS)] == [4.0] * 3
    w.lose(1)
    got = w.each(allreduce(1.0), [0, 2])
    assert [t.tolist() for t in got] == [[4.0] * 4] * 2, got  # 2 ones, scaled by 4/2


def test_a_lost_rank_that_joins_again_is_refused_at_once(world, module_sidecars):  # noqa: F811
    """Unless the job admits replacements (collectived.torch.ft does)."""
    w = named(world(fault_tolerance="shrink"))
    w.lose(3)
    assert [t[0] for t in w.each(allreduce(1.0), SURVIVORS)] == [4.0] * 3
    with Client(layout(module_sidecars)[3].unix_address) as again:
        started = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="its job admits no replacement"):
            again.create_group(w.name, 3, WORLD, timeout=JOIN_TIMEOUT, fault_tolerance="shrink",
                               store_address=module_sidecars[0].tcp_address)
        assert time.monotonic() - started < 5
    assert [t[0] for t in w.each(allreduce(1.0), SURVIVORS)] == [4.0] * 3


def reference_step(reference, optimizer, step, live):
    """One step of the tests' reference: the mean of the gradients of the `live` ranks' batches,
    as the group computes it with that membership."""
    from ft_ddp_worker import ft_batch
    grads = []
    for rank in live:
        reference.zero_grad()
        x, y = ft_batch(step, rank)
        ((reference(x) - y) ** 2).mean().backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    for parameter, per_rank in zip(reference.parameters(), zip(*grads)):
        parameter.grad = torch.stack(per_rank).mean(0)
    optimizer.step()


def rss_kib(side):
    with open(f"/proc/{side.process.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_soak_ranks_lost_one_after_another(module_sidecars):  # noqa: F811
    """8 ranks on 2 sidecars lose a rank after every 30 allreduces, alternating sidecars, down to
    2: every result is the group's size (a sum of ones rescaled), and the sidecars' memory stays
    flat."""
    world = 8
    name = unique("ft-soak")
    sides = [module_sidecars[rank % 2] for rank in range(world)]
    clients = [Client(side.unix_address) for side in sides]
    pool = concurrent.futures.ThreadPoolExecutor(world)
    try:
        for future in [pool.submit(c.create_group, name, r, world, timeout=JOIN_TIMEOUT,
                                   store_address=module_sidecars[0].tcp_address,
                                   fault_tolerance="shrink") for r, c in enumerate(clients)]:
            future.result(timeout=60)
        live = list(range(world))

        def run(rank):
            for _ in range(30):
                tensor = np.ones(16, dtype=np.float32)
                clients[rank].allreduce(name, tensor)
                assert np.allclose(tensor, float(world), rtol=1e-6), (rank, len(live), tensor)

        before = [rss_kib(side) for side in module_sidecars]
        while len(live) > 2:
            for future in [pool.submit(run, rank) for rank in live]:
                future.result(timeout=60)
            lost = live.pop(-1 if len(live) % 2 else -2)
            clients[lost].close()
            clients[lost] = None
        for future in [pool.submit(run, rank) for rank in live]:
            future.result(timeout=60)
        after = [rss_kib(side) for side in module_sidecars]
        assert all(a - b < 64 * 1024 for a, b in zip(after, before)), (before, after)
    finally:
        for client in clients:
            if client is not None:
                client.close()
        pool.shutdown()


def survivors_allreduce_errors(w):
    """Each survivor's allreduce fails with PeerLostError: its messages, in rank order."""
    def fails(rank, client):
        with pytest.raises(PeerLostError) as lost:
            client.allreduce(w.name, np.ones(4, dtype=np.float32))
        return str(lost.value)
    return w.each(fails, SURVIVORS)


def test_below_the_minimum_the_group_fails_as_a_fail_fast_group(world):
    w = named(world(fault_tolerance="shrink", min_ranks=4))
    w.lose(3)
    messages = survivors_allreduce_errors(w)
    assert all("fewer than its minimum of 4" in m for m in messages), messages


def test_the_default_fails_fast(world):
    w = named(world())
    w.lose(3)
    messages = survivors_allreduce_errors(w)
    assert all("rank 3 (global rank 3) left group" in m for m in messages), messages


def test_every_rank_must_ask_for_the_same_fault_tolerance(module_sidecars):  # noqa: F811
    name = unique("ft")
    clients = [Client(side.unix_address) for side in layout(module_sidecars)]
    try:
        with concurrent.futures.ThreadPoolExecutor(WORLD) as pool:
            futures = [pool.submit(client.create_group, name, rank, WORLD, timeout=JOIN_TIMEOUT,
                                   store_address=module_sidecars[0].tcp_address,
                                   fault_tolerance="shrink" if rank != 2 else "fail-fast")
                       for rank, client in enumerate(clients)]
            for future in futures:
                with pytest.raises(InvalidArgumentError) as refused:
                    future.result(timeout=60)
                assert ("group rank 2 asked for fault tolerance 'fail-fast' and group rank 0 "
                        "for 'shrink:1'") in str(refused.value)
        with pytest.raises(InvalidArgumentError, match="outside \\[1, 4\\]"):
            clients[0].create_group(unique("ft"), 0, WORLD, fault_tolerance="shrink",
                                    min_ranks=5, timeout=5)
        with pytest.raises(ValueError, match="not 'fail-fast' or 'shrink'"):
            clients[0].create_group(unique("ft"), 0, WORLD, fault_tolerance="grow")
    finally:
        for client in clients:
            client.close()


def test_an_unmodified_ddp_job_goes_on_when_a_trainer_is_killed(module_sidecars):  # noqa: F811
    """4 trainers on 2 sidecars, COLLECTIVED_FAULT_TOLERANCE=shrink; rank 3 is SIGKILLed after
    its step 4 of 12. The survivors finish every step, hold identical parameters, and those are
    what one process computes with the same membership: steps 0-4 average the gradients of 4
    ranks, steps 5-11 those of the 3 survivors."""
    import sys
    sys.path.insert(0, str(HELPERS))
    from ft_ddp_worker import ft_model

    kill_rank, kill_after, steps = 3, 4, 12
    with tempfile.TemporaryDirectory(prefix="ft-ddp-") as out:
        ranks = launch(HELPERS / "ft_ddp_worker.py", [out, kill_rank, kill_after, steps], WORLD,
                       module_sidecars, init="env", timeout=120,
                       env={"COLLECTIVED_FAULT_TOLERANCE": "shrink"}).wait()
        assert ranks.returncodes[kill_rank] == -signal.SIGKILL, ranks.output_of(kill_rank)
        for rank in SURVIVORS:
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        finals = [torch.load(pathlib.Path(out) / f"rank{rank}.pt") for rank in SURVIVORS]

    reference = ft_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps):
        live = range(WORLD) if step <= kill_after else SURVIVORS
        reference_step(reference, optimizer, step, live)
    for final in finals[1:]:
        for key in final:
            assert torch.equal(final[key], finals[0][key]), key
    for key, value in reference.state_dict().items():
        assert torch.allclose(finals[0][key], value, rtol=1e-5, atol=1e-6), (
            key, (finals[0][key] - value).abs().max().item())


def test_a_replacement_joins_a_ddp_job_through_the_wrapper(module_sidecars):  # noqa: F811
    """4 trainers through collectived.torch.ft on 2 sidecars; rank 3 is SIGKILLed in the middle
    of step 5 (one of its two buckets issued), and started again once dead. Step 5 ran in two
    memberships: every survivor skips it. The replacement is admitted as a step's optimizer step
    begins, gets rank 0's model and optimizer state, and that step is its first. Every rank stops
    10 steps later with bit-identical parameters, equal to what one process computes with the
    same membership: steps 0-4 over 4 ranks, 5 skipped, then 3 ranks until the admission, then 4."""
    import json

    kill_rank, kill_at, after_join = 3, 5, 10
    with tempfile.TemporaryDirectory(prefix="ft-grow-") as out:
        ranks = launch(HELPERS / "ft_grow_worker.py", [out, kill_rank, kill_at, after_join],
                       WORLD, module_sidecars, init="env", timeout=150,
                       env={"COLLECTIVED_FAULT_TOLERANCE": "shrink"})
        ranks.procs[kill_rank].wait(timeout=60)
        ranks.relaunch(kill_rank)
        ranks.wait()
        code, output = ranks.earlier[kill_rank]
        assert code == -signal.SIGKILL, output[-3000:]
        for rank in range(WORLD):
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        finals = [torch.load(pathlib.Path(out) / f"rank{rank}.pt") for rank in range(WORLD)]
        runs = [json.loads((pathlib.Path(out) / f"rank{rank}.json").read_text())
                for rank in range(WORLD)]

    log = runs[0]["log"]
    for run in runs[1:3]:
        assert run["log"] == log, "the survivors' steps differ"
    by_step = {entry["step"]: entry for entry in log}
    assert [s for s, e in by_step.items() if not e["committed"]] == [kill_at], log
    admitted = [s for s, e in by_step.items() if e["admitted"]]
    assert len(admitted) == 1 and by_step[admitted[0]]["admitted"] == [kill_rank], log
    joined = admitted[0]  # admitted as that step's optimizer step began: its first step
    assert runs[kill_rank]["start_step"] == joined
    assert [e["step"] for e in runs[kill_rank]["log"]] == list(range(joined, log[-1]["step"] + 1))
    assert all(e["committed"] for e in runs[kill_rank]["log"])
    for final in finals[1:]:
        for key in final:
            assert torch.equal(final[key], finals[0][key]), key

    assert_grow_reference(finals[0], log, kill_at, joined, SURVIVORS, WORLD)


def assert_grow_reference(final, log, kill_at, joined, survivors, world):
    """`final` is what one process computes for ft_grow_worker's job with the survivors' step log
    `log`: the steps not committed skipped, `survivors` after the kill at `kill_at` until the
    replacement's admission at `joined`, every rank otherwise."""
    import sys
    sys.path.insert(0, str(HELPERS))
    from ft_ddp_worker import ft_model

    committed = {entry["step"] for entry in log if entry["committed"]}
    reference = ft_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for step in range(log[-1]["step"] + 1):
        if step not in committed:
            continue  # skipped on every rank
        live = survivors if kill_at < step < joined else range(world)
        reference_step(reference, optimizer, step, live)
    for key, expected in reference.state_dict().items():
        assert torch.allclose(final[key], expected, rtol=1e-4, atol=1e-5), (
            key, (final[key] - expected).abs().max().item())


def run_replacement_case(sidecars, out, env=None, replacement_env=None, init="env"):
    """The grow job of test_a_replacement_joins_a_ddp_job_through_the_wrapper, rank 3 SIGKILLed
    mid-step 5 and started again with `replacement_env`; returns the finished Ranks."""
    ranks = launch(HELPERS / "ft_grow_worker.py", [out, 3, 5, 10], WORLD, sidecars, init=init,
                   timeout=150, env={"COLLECTIVED_FAULT_TOLERANCE": "shrink", **(env or {})})
    ranks.procs[3].wait(timeout=60)
    ranks.relaunch(3, env=replacement_env)
    return ranks.wait()


def assert_identical_parameters(out, ranks):
    finals = [torch.load(pathlib.Path(out) / f"rank{rank}.pt") for rank in ranks]
    for final in finals[1:]:
        for key in final:
            assert torch.equal(final[key], finals[0][key]), key


def test_a_replacement_with_another_model_fails_and_the_survivors_go_on(
        module_sidecars):  # noqa: F811
    """The replacement builds a model of another shape: the donor's state does not load, it
    fails saying so, and the survivors, having admitted it, go on without it again."""
    with tempfile.TemporaryDirectory(prefix="ft-grow-") as out:
        ranks = run_replacement_case(module_sidecars, out,
                                     replacement_env={"FT_TEST_OTHER_MODEL": "1"})
        assert ranks.returncodes[3] != 0, ranks.output_of(3)
        assert "does not run the survivors' model" in ranks.output_of(3), ranks.output_of(3)
        for rank in SURVIVORS:
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        assert_identical_parameters(out, SURVIVORS)


def test_a_donor_lost_during_the_transfer_fails_the_replacement_only(
        module_sidecars):  # noqa: F811
    """Rank 0, the donor, dies as it is about to send its state (the job's store is a file, so
    that it outlives rank 0): the replacement fails with an error that says to start it again,
    and ranks 1 and 2 go on together, their parameters identical."""
    with tempfile.TemporaryDirectory(prefix="ft-grow-") as out:
        ranks = run_replacement_case(module_sidecars, out, init="file",
                                     env={"FT_TEST_DONOR_DIES": "0"})
        assert ranks.returncodes[0] == -signal.SIGKILL, ranks.output_of(0)
        assert ranks.returncodes[3] != 0, ranks.output_of(3)
        assert "start the replacement again" in ranks.output_of(3), ranks.output_of(3)
        for rank in (1, 2):
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        assert_identical_parameters(out, (1, 2))


def test_a_replacement_with_another_job_token_is_refused(module_sidecars):  # noqa: F811
    """The job's ranks share a token; a process with another one that claims rank 3 is refused
    at init_process_group, and the survivors train on, untouched, to their last step."""
    with tempfile.TemporaryDirectory(prefix="ft-grow-") as out:
        ranks = run_replacement_case(
            module_sidecars, out, env={"COLLECTIVED_JOB_TOKEN": "job-a-token-0123456789",
                                       "FT_TEST_STOP_AT": "120"},
            replacement_env={"COLLECTIVED_JOB_TOKEN": "job-b-token-0123456789"})
        assert ranks.returncodes[3] != 0, ranks.output_of(3)
        assert "PermissionDeniedError" in ranks.output_of(3), ranks.output_of(3)
        assert "job token presented is not the one" in ranks.output_of(3), ranks.output_of(3)
        for rank in SURVIVORS:
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        assert_identical_parameters(out, SURVIVORS)


def test_soak_replacements_killed_and_started_again(module_sidecars):  # noqa: F811
    """Through the wrapper on 2 sidecars, ranks 3, 1, 2 and 3 are SIGKILLed one after another at
    a random point of their training and started again, each once the previous replacement
    trains. Every process that finished agrees on the steps they shared (committed or skipped
    alike), the four end with bit-identical parameters, and the sidecars' memory stays flat."""
    import json
    import random
    chooser = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="ft-soak-") as out:
        stop = pathlib.Path(out) / "stop"
        ranks = launch(HELPERS / "ft_grow_worker.py", [out, -1, 0, 0], WORLD, module_sidecars,
                       init="env", timeout=240,
                       env={"COLLECTIVED_FAULT_TOLERANCE": "shrink", "FT_TEST_STOP_FILE": str(stop)})

        def wait_training(rank):
            marker = pathlib.Path(out) / f"training.rank{rank}.{ranks.procs[rank].pid}"
            deadline = time.monotonic() + 90
            while not marker.exists():
                assert ranks.procs[rank].poll() is None, f"rank {rank} ended before it trained"
                if time.monotonic() > deadline:
                    ranks.procs[rank].kill()
                    output, _ = ranks.procs[rank].communicate()
                    raise AssertionError(f"rank {rank} did not start training: {output[-3000:]}"
                                         f"\n{module_sidecars.logs()[-6000:]}")
                time.sleep(0.05)

        for rank in range(WORLD):
            wait_training(rank)
        before = None
        for cycle, victim in enumerate((3, 1, 2, 3)):
            time.sleep(chooser.uniform(0.3, 1.0))
            ranks.procs[victim].send_signal(signal.SIGKILL)
            ranks.procs[victim].wait(timeout=30)
            ranks.relaunch(victim)
            wait_training(victim)
            if cycle == 0:
                before = [rss_kib(side) for side in module_sidecars]
        after = [rss_kib(side) for side in module_sidecars]
        time.sleep(0.5)
        stop.touch()
        ranks.wait()
        for rank in range(WORLD):
            assert ranks.returncodes[rank] == 0, ranks.output_of(rank)
        runs = [json.loads((pathlib.Path(out) / f"rank{rank}.json").read_text())
                for rank in range(WORLD)]
        assert_identical_parameters(out, range(WORLD))
    last = runs[0]["log"][-1]["step"]
    for rank in (1, 2, 3):
        assert runs[rank]["start_step"] > 0
        assert runs[rank]["log"][-1]["step"] == last
        shared = {e["step"]: e for e in runs[0]["log"]}
        for entry in runs[rank]["log"]:
            assert entry["committed"] == shared[entry["step"]]["committed"], (rank, entry)
    assert all(a - b < 64 * 1024 for a, b in zip(after, before)), (before, after)
