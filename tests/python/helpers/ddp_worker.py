"""One rank of the DDP tests.

Usage: ddp_worker.py BACKEND OUT_DIR INIT_METHOD RANK WORLD_SIZE

BACKEND is "collectived" (the sidecar is $COLLECTIVED_ADDRESS) or "gloo" (the control). The
rank trains every configuration of ddp_models.CONFIGS with DDP and saves its final parameters
and losses to OUT_DIR/<config>.rank<R>.pt, then runs the DDP tests of PyTorch's
test_c10d_pypg.py (test_ddp_invoke_work_object, test_ddp_with_pypg,
test_ddp_with_pypg_with_grad_views) on the backend's process group, reporting each as
``@@RESULT {json}`` like torch_worker.py.
"""

import copy
import datetime
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SEED_CHECKS = ["seed_ddp_invoke_work_object", "seed_ddp_invoke_work_object_with_wrapper",
               "seed_ddp_with_pypg", "seed_ddp_with_pypg_with_grad_views"]


def report(name, ok, errors, seconds=0.0, **extra):
    print("@@RESULT " + json.dumps({"check": name, "ok": ok, "errors": errors,
                                    "seconds": round(seconds, 3), **extra}), flush=True)


# -- test_c10d_pypg.py, reproduced on a real backend ---------------------------------------


class Net(nn.Module):
    """test_c10d_common.Net."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = nn.Linear(10, 50, bias=False)
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        x = self.fc3(x)
        return F.softmax(x, dim=1)


def _wrapper_pg(inner):
    """A Python ProcessGroup whose works are torch's _create_work_from_future over the
    collectived works' futures (test_c10d_pypg's use_wrapper=True flavour)."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future

    class WrapperPG(dist.ProcessGroup):
        def __init__(self):
            super().__init__(inner.rank(), inner.size())
            self.calls = 0

        def _wrap(self, work):
            self.calls += 1
            return _create_work_from_future(work.get_future())

        def broadcast(self, tensor_list, opts=None):
            return self._wrap(inner.broadcast(tensor_list, opts))

        def allgather(self, output_tensors, input_tensor, opts=None):
            return self._wrap(inner.allgather(output_tensors, input_tensor, opts))

        def allreduce(self, tensors, opts=None):
            return self._wrap(inner.allreduce(tensors, opts))

        def getBackendName(self):
            return "collectived-wrapper"

    return WrapperPG()


def seed_ddp_invoke_work_object(pg, rank, world, expect, use_wrapper=False):
    """test_c10d_pypg.AbstractDDPSingleRank.test_ddp_invoke_work_object."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from collectived.torch import backend, works

    counts = {"wait": 0, "get_future": 0}
    original_wait, original_get_future = works.Work.wait, works.Work.get_future

    def counting_wait(self, timeout=None):
        counts["wait"] += 1
        return original_wait(self, timeout)

    def counting_get_future(self):
        counts["get_future"] += 1
        return original_get_future(self)

    works.Work.wait, works.Work.get_future = counting_wait, counting_get_future
    try:
        if use_wrapper:
            pg = _wrapper_pg(pg)
        torch.manual_seed(123)
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        wrapped_model = model
        input_tensor = torch.rand(2)
        model = DDP(model, process_group=pg)
        model(input_tensor).sum().backward()
        ddp_grad = wrapped_model[0].bias.grad.clone()
        wrapped_model.zero_grad()
        wrapped_model(input_tensor).sum().backward()
        # Same seed and input on every rank: the averaged gradient is the local one.
        expect(torch.allclose(wrapped_model[0].bias.grad, ddp_grad, rtol=1.3e-6, atol=1e-7),
               f"grad {wrapped_model[0].bias.grad} != ddp grad {ddp_grad}")
        if use_wrapper:
            expect(pg.calls > 0, "the wrapper's collectives were never called")
        elif isinstance(pg, backend.ProcessGroupCollectived):
            expect(counts["wait"] > 0, "DDP never waited on a collectived work")
            expect(counts["get_future"] > 0, "DDP never asked a collectived work for its future")
    finally:
        works.Work.wait, works.Work.get_future = original_wait, original_get_future


def seed_ddp_with_process_group(pg, rank, world, expect, gradient_as_bucket_view=False):
    """test_c10d_common.CommonDistributedDataParallelTest._test_ddp_with_process_group on CPU
    (devices=[cpu], device_ids=None), as test_ddp_with_pypg[_with_grad_views] call it."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(1234)  # MultiProcessTestCase seeds every process alike
    local_batch_size = 1
    global_batch_size = world * local_batch_size
    device = torch.device("cpu")
    model = Net()
    ddp_model = DistributedDataParallel(copy.deepcopy(model).to(device), device_ids=None,
                                        process_group=pg, bucket_cap_mb=0.001,
                                        gradient_as_bucket_view=gradient_as_bucket_view)
    model.to(device)
    input = torch.randn(global_batch_size, 2).to(device)
    target = torch.randn(global_batch_size, 4).to(device)
    ddp_logging_data = ddp_model._get_ddp_logging_data()
    expect(not ddp_logging_data.get("is_multi_device_module"), "multi device module?")

    def step_model(model, input, target):
        model.train()
        output = model(input)
        loss = F.mse_loss(output, target.to(output.device))
        loss.backward()

    def update_parameters(model):
        for param in model.parameters():
            with torch.no_grad():
                param -= param.grad
            param.grad = None

    for iteration in range(2):
        step_model(model, input, target)
        step_model(ddp_model,
                   input[rank * local_batch_size:(rank + 1) * local_batch_size],
                   target[rank * local_batch_size:(rank + 1) * local_batch_size])
        update_parameters(model)
        update_parameters(ddp_model)
        expect(len(list(model.parameters())) == len(list(ddp_model.parameters())),
               "parameter counts differ")
        for i, j in zip(model.parameters(), ddp_model.parameters()):
            expect(torch.allclose(i, j, rtol=1.3e-06, atol=5e-5),
                   f"iteration {iteration}: {i} != {j}")
        torch.manual_seed(1337 + iteration)
        input = input[torch.randperm(global_batch_size)]


def run_seed_checks(pg, rank, world):
    for name in SEED_CHECKS:
        errors = []

        def expect(condition, message):
            if not condition:
                errors.append(f"rank {rank}: {message}")

        start = time.monotonic()
        try:
            if name == "seed_ddp_invoke_work_object":
                seed_ddp_invoke_work_object(pg, rank, world, expect)
            elif name == "seed_ddp_invoke_work_object_with_wrapper":
                seed_ddp_invoke_work_object(pg, rank, world, expect, use_wrapper=True)
            elif name == "seed_ddp_with_pypg":
                seed_ddp_with_process_group(pg, rank, world, expect)
            else:
                seed_ddp_with_process_group(pg, rank, world, expect, gradient_as_bucket_view=True)
        except Exception as error:  # noqa: BLE001 - reported
            errors.append(f"rank {rank}: {type(error).__name__}: {error}\n"
                          + traceback.format_exc(limit=6))
        report(name, not errors, errors, time.monotonic() - start)


def main():
    backend_name, out_dir, init_method = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(sys.argv[4]), int(sys.argv[5])
    import torch.distributed as dist
    import ddp_models

    torch.set_num_threads(1)
    if backend_name == "collectived":
        import collectived.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend_name, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    report("init_process_group", True, [])
    for name in ddp_models.CONFIGS:
        start = time.monotonic()
        try:
            state, losses = ddp_models.train_ddp(name, rank, world, process_group=pg)
            torch.save({"state": state, "losses": losses},
                       os.path.join(out_dir, f"{name}.rank{rank}.pt"))
            report(f"train-{name}", True, [], time.monotonic() - start)
        except Exception as error:  # noqa: BLE001 - reported
            report(f"train-{name}", False, [f"rank {rank}: {type(error).__name__}: {error}\n"
                                            + traceback.format_exc(limit=6)],
                   time.monotonic() - start)
    if backend_name == "collectived":
        # How many storages were moved into shared memory (DDP's buckets among them) and how
        # often an op found its storage registered already.
        from collectived.torch import backend as collectived_backend
        adopter = collectived_backend.shared_session().adopter
        report("adoption", True, [], adopted=adopter.adopted, reused=adopter.reused)
    if backend_name == "collectived" or world == 2:
        run_seed_checks(pg, rank, world)
    # Rank 0 may host the rendezvous store: it leaves last.
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.wait([f"left/{r}" for r in range(1, world)])
    else:
        store.set(f"left/{rank}", "1")
    print("@@DONE", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
