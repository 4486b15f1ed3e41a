"""The torch.distributed backend "collectived" with real processes and two real sidecars.

Each job (one process set) runs many checks per process (tests/python/helpers/torch_worker.py)
and reports one result per check, so that every check is its own test here without paying
process start and torch import (2-3 s each) per check. Rank r attaches to sidecar r % 2: ranks
are interleaved across the two simulated nodes.

Jobs: 4 ranks with init_method env:// (the whole c10d surface); 2 ranks with tcp:// and 4
ranks with file:// (a basic set, then the last rank goes away without destroying its process
group, by os._exit or by an unhandled exception, and the others must raise naming it).
"""

import pytest

from torch_helpers import HELPERS, assert_check, launch, load_helper, module_sidecars  # noqa: F401

WORKER = HELPERS / "torch_worker.py"
worker = load_helper("torch_worker")

EXIT_CHECK = "a_rank_that_exits_makes_the_others_raise_naming_it"

# The jobs where a rank goes away use a shorter op timeout: if losing the rank is not detected,
# the others fail with a timeout after 15 s instead of hanging for 30.
SHORT_TIMEOUT = {"WORKER_PG_TIMEOUT_S": "15"}

JOBS = {
    # name: (scenario, init method, world size)
    "env4": ("surface", "env", 4),
    "tcp2": ("basic+exit", "tcp", 2),
    "file4": ("basic+crash", "file", 4),
}


@pytest.fixture(scope="module")
def jobs(module_sidecars):
    """Starts every job at once (they overlap on the 2 cores) and waits for them lazily."""
    started, finished = {}, {}
    for name, (scenario, init, world) in JOBS.items():
        env = dict(SHORT_TIMEOUT if "+" in scenario else {})
        started[name] = launch(WORKER, [scenario], world, module_sidecars, init=init,
                               timeout=150, env=env)

    def get(name):
        if name not in finished:
            finished[name] = started[name].wait()
        return finished[name]

    yield get
    for name in started:
        get(name)


def _cases():
    for job, (scenario, _, _) in JOBS.items():
        for check in ["init_process_group", *worker.checks_for(scenario)]:
            yield pytest.param(job, check, id=f"{job}-{check}")


@pytest.mark.parametrize("job,check", list(_cases()))
def test_check(jobs, module_sidecars, job, check):
    ranks = jobs(job)
    if check == EXIT_CHECK:
        # The last rank exits on purpose: only the others report this check.
        survivors = ranks.results().get(check, [None] * len(ranks.outputs))[:-1]
        problems = []
        for rank, result in enumerate(survivors):
            if result is None:
                problems.append(f"rank {rank} did not report; output:\n{ranks.output_of(rank)}")
            elif not result["ok"]:
                problems.extend(result["errors"])
        assert not problems, "\n".join(problems)
        return
    assert_check(ranks, check, module_sidecars)


@pytest.mark.parametrize("job", list(JOBS))
def test_every_rank_finished_cleanly(jobs, job):
    ranks = jobs(job)
    scenario = JOBS[job][0]
    last = len(ranks.outputs) - 1
    for rank, (code, out) in enumerate(zip(ranks.returncodes, ranks.outputs)):
        if scenario.endswith("+crash") and rank == last:
            assert code == 1 and "Crash: rank goes down on purpose" in out, (
                f"rank {rank} exited with {code}:\n{ranks.output_of(rank)}")
            continue
        assert code == 0, f"rank {rank} exited with {code}:\n{ranks.output_of(rank)}"
        if not (scenario.endswith("+exit") and rank == last):
            assert "@@DONE" in out, f"rank {rank} did not finish:\n{ranks.output_of(rank)}"
