"""Trains a small model with DistributedDataParallel on any torch.distributed backend.

Launch one process per rank with the usual environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), e.g. through torchrun or a job controller, and pick the backend:

    BACKEND=collectived python3 ddp_train.py     # through the local collectived sidecar
    BACKEND=gloo        python3 ddp_train.py     # PyTorch's own Gloo backend

For "collectived", the process finds its sidecar through $COLLECTIVED_ADDRESS. Nothing else in
the program knows which backend runs it.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

BACKEND = os.environ.get("BACKEND", "collectived")
if BACKEND == "collectived":
    import collectived.torch  # noqa: F401  (registers the backend)


def batch(step, rank, size=32):
    """This rank's share of step `step` of a fixed synthetic regression problem."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 16, generator=generator)
    y = torch.sin(x[:, :4].sum(1, keepdim=True) / 2) + 0.1 * x[:, 4:8].sum(1, keepdim=True)
    return x, y


def main():
    steps = int(os.environ.get("STEPS", "60"))
    dist.init_process_group(BACKEND, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical initial parameters everywhere
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    for step in range(steps):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # SUM: every backend has it (Gloo has no AVG)
        mean_loss /= world
        if rank == 0 and (step % 10 == 0 or step == steps - 1):
            print(f"[{BACKEND}] step {step:3d}  loss {mean_loss.item():.4f}", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(gathered[0], g) for g in gathered)
    if rank == 0:
        print(f"[{BACKEND}] all {world} ranks hold identical parameters: {identical}", flush=True)
    dist.destroy_process_group()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
