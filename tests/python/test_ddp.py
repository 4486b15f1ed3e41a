"""DistributedDataParallel on the "collectived" backend with real processes and two sidecars.

DDP(model, process_group=...) must reach the same parameters as (a) one process training on the
combined batch and (b) PyTorch's gloo backend, on 2 and 4 ranks, with gradient_as_bucket_view
on and off, with find_unused_parameters, and with PowerSGD's communication hook (against gloo
only: it compresses), whose callbacks wait for the ops they issue (helpers/ddp_models.py has the
configurations); and the DDP tests of PyTorch's test_c10d_pypg.py pass on this backend with 1
and 2 ranks.

All jobs start at once (collectived with 1, 2 and 4 ranks, gloo with 2 and 4 ranks) and every
rank runs every configuration, so the process sets are paid for once.
"""

import pathlib
import tempfile

import pytest
import torch

from torch_helpers import HELPERS, assert_check, launch, load_helper, module_sidecars  # noqa: F401

WORKER = HELPERS / "ddp_worker.py"
models = load_helper("ddp_models")
worker_names = ["seed_ddp_invoke_work_object", "seed_ddp_invoke_work_object_with_wrapper",
                "seed_ddp_with_pypg", "seed_ddp_with_pypg_with_grad_views"]

JOBS = {
    # name: (backend, world size, init method, extra environment)
    "collectived1": ("collectived", 1, "file", {}),
    "collectived2": ("collectived", 2, "tcp", {}),
    "collectived4": ("collectived", 4, "env", {}),
    # Every tensor adopted, however small: DDP's buckets (and the gradients that are views of
    # them) live in shared memory that the sidecar reads and writes in place, across steps.
    "collectived2-adopt-all": ("collectived", 2, "env",
                               {"COLLECTIVED_TORCH_ADOPT_MIN_BYTES": "0"}),
    # Adoption off: everything is staged.
    "collectived2-staged": ("collectived", 2, "tcp", {"COLLECTIVED_TORCH_ADOPT_MAX_BYTES": "0"}),
    "gloo2": ("gloo", 2, "tcp", {}),
    "gloo4": ("gloo", 4, "env", {}),
}

# Tolerances: 5 SGD steps in float32; only the order of the additions differs.
VS_REFERENCE = dict(rtol=1e-4, atol=1e-5)
VS_GLOO = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def ddp_jobs(module_sidecars):
    out_root = tempfile.TemporaryDirectory(prefix="ddp-")
    started = {}
    for name, (backend, world, init, env) in JOBS.items():
        out = pathlib.Path(out_root.name) / name
        out.mkdir()
        started[name] = (launch(WORKER, [backend, out], world, module_sidecars, init=init,
                                timeout=150, env=env), out)
    finished = {}

    def get(name):
        if name not in finished:
            ranks, out = started[name]
            finished[name] = (ranks.wait(), out)
        return finished[name]

    yield get
    for name in started:
        get(name)
    out_root.cleanup()


def _load(ddp_jobs, job, config):
    ranks, out = ddp_jobs(job)
    assert_check(ranks, f"train-{config}")
    world = JOBS[job][1]
    return [torch.load(out / f"{config}.rank{r}.pt") for r in range(world)]


def _assert_close(got, want, what, **tolerance):
    assert got.keys() == want.keys()
    for key in want:
        assert torch.allclose(got[key], want[key], **tolerance), (
            f"{what}: {key} differs by {(got[key] - want[key]).abs().max().item():.3g}")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("config", [c for c in models.CONFIGS if c not in models.COMPRESSED])
def test_ddp_matches_one_process_on_the_combined_batch(ddp_jobs, config, world):
    results = _load(ddp_jobs, f"collectived{world}", config)
    # Every rank holds exactly the same parameters.
    for rank, result in enumerate(results[1:], 1):
        for key, value in results[0]["state"].items():
            assert torch.equal(result["state"][key], value), f"rank {rank} differs in {key}"
    reference = models.train_reference(config, world)
    _assert_close(results[0]["state"], reference, f"{config} on {world} ranks vs one process",
                  **VS_REFERENCE)
    # Training did something.
    initial = models.make_model(models.CONFIGS[config]["model"]).state_dict()
    assert any(not torch.equal(initial[k], reference[k]) for k in initial)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("config", list(models.CONFIGS))
def test_ddp_matches_the_gloo_backend(ddp_jobs, config, world):
    ours = _load(ddp_jobs, f"collectived{world}", config)
    gloo = _load(ddp_jobs, f"gloo{world}", config)
    for rank in range(world):
        _assert_close(ours[rank]["state"], gloo[rank]["state"],
                      f"{config} rank {rank}: collectived vs gloo", **VS_GLOO)
        assert ours[rank]["losses"] == pytest.approx(gloo[rank]["losses"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("job", ["collectived2-adopt-all", "collectived2-staged"])
@pytest.mark.parametrize("config", list(models.CONFIGS))
def test_ddp_on_adopted_and_on_staged_tensors_matches_the_gloo_backend(ddp_jobs, job, config):
    ours = _load(ddp_jobs, job, config)
    gloo = _load(ddp_jobs, "gloo2", config)
    for rank in range(2):
        _assert_close(ours[rank]["state"], gloo[rank]["state"],
                      f"{config} rank {rank}: {job} vs gloo", **VS_GLOO)
        assert ours[rank]["losses"] == pytest.approx(gloo[rank]["losses"], rel=1e-5, abs=1e-6)


def test_ddp_buckets_are_adopted_once_and_reused_across_steps(ddp_jobs):
    results = {}
    for job in ("collectived2-adopt-all", "collectived2-staged"):
        ranks = ddp_jobs(job)[0]
        assert_check(ranks, "adoption")
        results[job] = ranks.results()["adoption"]
    adopt_all, staged = results["collectived2-adopt-all"], results["collectived2-staged"]
    for rank in range(2):
        # Each configuration's buckets are adopted on the first step and found registered on
        # every later one (the initial broadcasts and checks add one-shot adoptions).
        assert adopt_all[rank]["adopted"] > 0, adopt_all[rank]
        assert adopt_all[rank]["reused"] >= len(models.CONFIGS) * (models.STEPS - 1), \
            adopt_all[rank]
        assert staged[rank]["adopted"] == 0 and staged[rank]["reused"] == 0, staged[rank]


@pytest.mark.parametrize("job", ["collectived1", "collectived2"])
@pytest.mark.parametrize("check", worker_names)
def test_test_c10d_pypg_ddp_tests(ddp_jobs, job, check):
    ranks, _ = ddp_jobs(job)
    assert_check(ranks, check)


@pytest.mark.parametrize("check", worker_names)
def test_test_c10d_pypg_reproduction_passes_on_gloo_as_a_control(ddp_jobs, check):
    ranks, _ = ddp_jobs("gloo2")
    assert_check(ranks, check)


@pytest.mark.parametrize("job", list(JOBS))
def test_every_rank_finished_cleanly(ddp_jobs, job):
    ranks, _ = ddp_jobs(job)
    for rank, code in enumerate(ranks.returncodes):
        assert code == 0 and "@@DONE" in ranks.outputs[rank], (
            f"rank {rank} of {job} exited with {code}:\n{ranks.output_of(rank)}")
