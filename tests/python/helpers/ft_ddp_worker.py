"""One rank of an unmodified DDP job on a shrinking group (test_fault_tolerance.py).

Usage: ft_ddp_worker.py OUT_DIR KILL_RANK KILL_AFTER_STEP STEPS INIT_METHOD RANK WORLD_SIZE

Trains a linear model with DistributedDataParallel on the "collectived" backend (the job's
environment sets COLLECTIVED_FAULT_TOLERANCE=shrink), each rank on batches of its own
(ft_batch); rank KILL_RANK SIGKILLs itself right after its step KILL_AFTER_STEP (or, when
FT_KILL_PID is set, that process: its sidecar, and it dies of having lost it). Every rank that
finishes saves its parameters to OUT_DIR/rank<R>.pt. Nothing in the loop knows of the loss.
"""

import os
import pathlib
import signal
import sys

import torch
import torch.distributed as dist

import collectived.torch  # noqa: F401 - registers the backend


def ft_batch(step, rank):
    """The batch rank `rank` trains on at step `step`: the same in the test's reference."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=generator)
    y = x @ torch.tensor([[1.0, -2.0], [0.5, 0.0], [-1.0, 1.0], [2.0, 0.25]])
    return x, y


def ft_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def main():
    out = pathlib.Path(sys.argv[1])
    kill_rank, kill_after, steps = (int(a) for a in sys.argv[2:5])
    init_method, rank, world = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
    torch.set_num_threads(1)
    dist.init_process_group("collectived", init_method=init_method, rank=rank, world_size=world)
    model = ft_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        x, y = ft_batch(step, rank)
        optimizer.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        optimizer.step()
        if rank == kill_rank and step == kill_after:
            os.kill(int(os.environ.get("FT_KILL_PID", os.getpid())), signal.SIGKILL)
    torch.save(model.state_dict(), out / f"rank{rank}.pt")
    print(f"rank {rank} finished {steps} steps", flush=True)


if __name__ == "__main__":
    main()
