"""One rank of PyTorch's own Gloo backend, rendezvoused through a collectived store.

Usage: gloo_rendezvous_worker.py ADDRESS RANK WORLD_SIZE
"""

import datetime
import sys

import torch
import torch.distributed as dist

from collectived.torch import Store


def main():
    address, rank, world_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = Store(address, timeout=datetime.timedelta(seconds=60), prefix="gloo-job")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    tensor = torch.full((1000,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = float(sum(range(1, world_size + 1)))
    assert torch.all(tensor == expected), tensor
    dist.barrier()
    dist.destroy_process_group()
    print(f"allreduce ok: {expected}")


if __name__ == "__main__":
    main()
