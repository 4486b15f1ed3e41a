"""One rank of a DDP job through collectived.torch.ft (test_fault_tolerance.py).

Usage: ft_grow_worker.py OUT_DIR KILL_RANK KILL_AT_STEP AFTER_JOIN INIT_METHOD RANK WORLD_SIZE

Trains ft_ddp_worker's linear model with SGD and momentum, each rank on batches of its own
(ft_batch), one bucket per parameter. Rank KILL_RANK's first process SIGKILLs itself in the
middle of step KILL_AT_STEP, once its first bucket's allreduce is issued, so that the step's ops
run in two memberships. A process started again as that rank (the test does, once it died) is a
replacement: it joins at a step boundary and starts at ddp.start_step. Every rank stops
AFTER_JOIN steps after the step at which the replacement was admitted (the same step for all),
and saves its parameters and its log of steps to OUT_DIR/rank<R>.pt and .json.

The cases of bad input and races, set in the environment of the processes they concern:
FT_TEST_OTHER_MODEL=1 makes a process build a model of another shape; FT_TEST_DONOR_DIES=R makes
rank R SIGKILL itself when, as the donor, it is about to send its state to a replacement;
FT_TEST_STOP_AT=N makes every rank stop after step N whether or not a replacement joined;
FT_TEST_STORE=HOST:PORT makes the job meet in that sidecar's store (collectived.torch.Store)
instead of INIT_METHOD's; FT_KILL_PID=PID makes KILL_RANK SIGKILL that process (its sidecar:
it dies of losing it) instead of itself; FT_KILL_EARLIER=STEP:PID makes KILL_RANK SIGKILL PID
before step STEP (a store's sidecar, say);
with FT_TEST_STOP_FILE=PATH every rank writes OUT_DIR/training.rank<R>.<pid> once it trains, and
the ranks stop together at the first step after which one of them saw PATH (a MAX allreduce of
that flag ends each step).
"""

import json
import os
import pathlib
import signal
import sys
import time

import torch
import torch.distributed as dist

import collectived.torch  # noqa: F401 - registers the backend
from collectived.torch import ft
from ft_ddp_worker import ft_batch, ft_model

MAX_STEPS = 3000  # a replacement that never joins fails the test at its timeout, not here


def main():
    out = pathlib.Path(sys.argv[1])
    kill_rank, kill_at, after_join = (int(a) for a in sys.argv[2:5])
    init_method, rank, world = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
    torch.set_num_threads(1)
    started = time.monotonic()
    if os.environ.get("FT_TEST_STORE"):
        from collectived.torch import Store
        dist.init_process_group("collectived", store=Store(os.environ["FT_TEST_STORE"]),
                                rank=rank, world_size=world)
    else:
        dist.init_process_group("collectived", init_method=init_method, rank=rank,
                                world_size=world)
    model = torch.nn.Linear(4, 3) if os.environ.get("FT_TEST_OTHER_MODEL") else ft_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if os.environ.get("FT_TEST_DONOR_DIES") == str(rank):
        def die():
            os.kill(os.getpid(), signal.SIGKILL)
        ft.DistributedDataParallel._serialized_state = lambda self: die()
    stop_at = int(os.environ.get("FT_TEST_STOP_AT", MAX_STEPS))
    ddp = ft.DistributedDataParallel(model, optimizer, bucket_bytes=1)
    joined_after = time.monotonic() - started
    replacement = ddp.start_step > 0
    stop_file = os.environ.get("FT_TEST_STOP_FILE")
    if stop_file:
        (out / f"training.rank{rank}.{os.getpid()}").write_text(str(ddp.start_step))
    admitted_at = ddp.start_step if replacement else None
    log = []
    kill_earlier = os.environ.get("FT_KILL_EARLIER", "").partition(":")
    for step in range(ddp.start_step, MAX_STEPS):
        if rank == kill_rank and not replacement and kill_earlier[0] == str(step):
            os.kill(int(kill_earlier[2]), signal.SIGKILL)
        x, y = ft_batch(step, rank)
        optimizer.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        if rank == kill_rank and step == kill_at and not replacement:
            first = next(p for p in model.parameters())
            dist.all_reduce(first.grad.reshape(-1).clone())  # its first bucket, then nothing
            os.kill(int(os.environ.get("FT_KILL_PID", os.getpid())), signal.SIGKILL)
        optimizer.step()
        log.append({"step": step, **ddp.last_step})
        if admitted_at is None and ddp.last_step["admitted"]:
            admitted_at = step
        if stop_file:
            seen = torch.tensor([int(os.path.exists(stop_file))])
            dist.all_reduce(seen, op=dist.ReduceOp.MAX)
            if seen.item():
                break
        elif admitted_at is not None and step >= admitted_at + after_join or step >= stop_at:
            break
        time.sleep(0.02)  # a replacement has time to start while the others train
    torch.save(model.state_dict(), out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps({
        "start_step": ddp.start_step, "log": log, "joined_after_s": joined_after}))
    print(f"rank {rank} finished at step {log[-1]['step']}", flush=True)


if __name__ == "__main__":
    main()
