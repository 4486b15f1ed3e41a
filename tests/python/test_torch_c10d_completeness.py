"""What PyTorch's own DistributedTest cases ask of a backend beyond the common collectives, on
the "collectived" backend with real processes and two real sidecars (rank r attaches to sidecar
r % 2): recv from any source (dist.recv without src returns the sender; several senders; each
send received once, in order per sender), sparse allreduce compared with torch's Gloo backend,
and timeouts worded as c10d words them (" Timed out ", which torch's tests match) that name the
group, the op, its sequence number and the missing ranks.

The checks run in one job of 4 ranks (tests/python/helpers/c10d_completeness_worker.py), one
test per check.
"""

import re

import pytest

import collectived
from torch_helpers import HELPERS, assert_check, launch, load_helper, module_sidecars  # noqa: F401

WORKER = HELPERS / "c10d_completeness_worker.py"
worker = load_helper("c10d_completeness_worker")


@pytest.fixture(scope="module")
def job(module_sidecars):
    return launch(WORKER, [], 4, module_sidecars, init="env", timeout=240).wait()


@pytest.mark.parametrize("check", worker.check_names())
def test_check(job, module_sidecars, check):
    assert_check(job, check, module_sidecars)


def test_every_rank_finished_cleanly(job):
    for rank, (code, out) in enumerate(zip(job.returncodes, job.outputs)):
        assert code == 0 and "@@DONE" in out, (
            f"rank {rank} exited with {code}:\n{job.output_of(rank)}")


def test_group_creation_that_a_rank_never_joins_times_out_in_c10d_words(module_sidecars):
    client = collectived.Client(module_sidecars[0].unix_address)
    try:
        with pytest.raises(collectived.TimeoutError) as error:
            client.create_group("lonely", 0, 3, timeout=1.0)
        message = str(error.value)
        assert re.search(worker.TORCH_TIMEOUT_REGEX, message), message
        assert "creating group 'lonely'" in message and "group ranks [1, 2]" in message, message
    finally:
        client.close()
