"""A PyTorch rank of the mixed-language job (examples/go): plain torch.distributed on the
"collectived" backend, with Go and C++ ranks in the same group.

Usage: COLLECTIVED_ADDRESS=unix:///tmp/a.sock python3 torch_rank.py RANK STORE_HOST:PORT [WORLD]

The job's store is a sidecar's store (collectived.torch.Store); the Go and C++ ranks read the
group's bootstrap record from it (key "0/collectived/bootstrap") and join the same group.
"""

import datetime
import sys

import torch
import torch.distributed as dist

import collectived.torch  # noqa: F401 - registers the "collectived" backend
from collectived.torch import Store


def main():
    rank, store_address = int(sys.argv[1]), sys.argv[2]
    world = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    dist.init_process_group("collectived", store=Store(store_address), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    # allreduce: rank r contributes (r + 1) * (i + 1); the sum over n ranks is n(n+1)/2 * (i + 1).
    x = torch.tensor([(rank + 1) * (i + 1) for i in range(4)], dtype=torch.float32)
    dist.all_reduce(x)
    ranks_sum = world * (world + 1) / 2
    assert x.tolist() == [ranks_sum * (i + 1) for i in range(4)], f"allreduce gave {x.tolist()}"
    # broadcast from every root in turn: everyone ends with root * 10 + i.
    for root in range(world):
        b = torch.tensor([rank * 10 + i for i in range(3)], dtype=torch.int64)
        dist.broadcast(b, root)
        assert b.tolist() == [root * 10 + i for i in range(3)], f"broadcast {root}: {b.tolist()}"
    # all_gather: rank k contributes [k, k * k].
    outs = [torch.full((2,), -1, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(outs, torch.tensor([rank, rank * rank], dtype=torch.int32))
    got = [o.tolist() for o in outs]
    assert got == [[k, k * k] for k in range(world)], f"all_gather gave {got}"
    dist.barrier()
    print(f"torch rank {rank}: allreduce, broadcast x{world}, all_gather ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
