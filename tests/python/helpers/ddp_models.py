"""Models, data and training loops shared by the DDP tests (tests/python/test_ddp.py, the
worker helpers/ddp_worker.py) and the benchmark (bench/ddp_bench.py).

Everything is deterministic: a model is built from a seed, the data of every step is generated
from a seed for the *global* batch, and rank r trains on rows [r * B / W, (r + 1) * B / W). Plain
SGD (no momentum, no weight decay) so that a parameter without a gradient (None) and one with a
zero gradient update the same way.
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

GLOBAL_BATCH = 16
STEPS = 5
LR = 0.1


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=64, d_out=8):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x, branch=None):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self, channels=3, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x, branch=None):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.adaptive_avg_pool2d(F.relu(self.conv2(x)), 4)
        return self.fc(torch.flatten(x, 1))


class Branchy(nn.Module):
    """Two heads, one used per forward (chosen by `branch`), and a layer never used at all."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(16, 32)
        self.head_a = nn.Linear(32, 4)
        self.head_b = nn.Linear(32, 4)
        self.never = nn.Linear(4, 4)

    def forward(self, x, branch=0):
        h = F.relu(self.trunk(x))
        return self.head_a(h) if branch == 0 else self.head_b(h)


# name -> how DDP is configured and how the branch of Branchy is chosen.
CONFIGS = {
    "mlp": dict(model="mlp", gradient_as_bucket_view=False, find_unused_parameters=False,
                bucket_cap_mb=25, branch=None),
    "mlp-bucket-view-small-buckets": dict(model="mlp", gradient_as_bucket_view=True,
                                          find_unused_parameters=False, bucket_cap_mb=0.001,
                                          branch=None),
    "cnn": dict(model="cnn", gradient_as_bucket_view=False, find_unused_parameters=False,
                bucket_cap_mb=0.01, branch=None),
    "cnn-bucket-view": dict(model="cnn", gradient_as_bucket_view=True,
                            find_unused_parameters=False, bucket_cap_mb=25, branch=None),
    # The head changes with the step (same on every rank); `never` is globally unused.
    "unused-by-step": dict(model="branchy", gradient_as_bucket_view=False,
                           find_unused_parameters=True, bucket_cap_mb=0.001, branch="step"),
    # Rank r uses head r % 2: each head is unused on some ranks but used globally.
    "unused-by-rank-bucket-view": dict(model="branchy", gradient_as_bucket_view=True,
                                       find_unused_parameters=True, bucket_cap_mb=25,
                                       branch="rank"),
    # PowerSGD's communication hook from step 2: its callbacks issue allreduces and wait for
    # them inside the futures' callbacks. Lossy: compared with gloo only (COMPRESSED).
    "mlp-powersgd": dict(model="mlp", gradient_as_bucket_view=False,
                         find_unused_parameters=False, bucket_cap_mb=25, branch=None,
                         hook="powersgd"),
}
# Configurations whose gradients are compressed: no one-process reference to compare with.
COMPRESSED = [name for name, config in CONFIGS.items() if config.get("hook") == "powersgd"]


def make_model(kind, seed=0):
    torch.manual_seed(seed)
    return {"mlp": MLP, "cnn": CNN, "branchy": Branchy}[kind]()


def make_batches(kind, steps=STEPS, global_batch=GLOBAL_BATCH, seed=1):
    """[(x, y)] of the global batch for every step."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        if kind == "mlp":
            x = torch.randn(global_batch, 32, generator=generator)
            y = torch.randn(global_batch, 8, generator=generator)
        elif kind == "cnn":
            x = torch.randn(global_batch, 3, 16, 16, generator=generator)
            y = torch.randint(0, 10, (global_batch,), generator=generator)
        else:
            x = torch.randn(global_batch, 16, generator=generator)
            y = torch.randn(global_batch, 4, generator=generator)
        batches.append((x, y))
    return batches


def loss_of(kind, output, y):
    return F.cross_entropy(output, y) if kind == "cnn" else F.mse_loss(output, y)


def branch_of(config, step, rank):
    if config["branch"] == "step":
        return step % 2
    if config["branch"] == "rank":
        return rank % 2
    return None


def local_slice(tensor, rank, world):
    per_rank = tensor.shape[0] // world
    return tensor[rank * per_rank:(rank + 1) * per_rank]


def train_reference(name, world, steps=STEPS):
    """One process, combined batch: the parameters DDP on `world` ranks must reach."""
    config = CONFIGS[name]
    model = make_model(config["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step, (x, y) in enumerate(make_batches(config["model"], steps)):
        optimizer.zero_grad(set_to_none=True)
        if config["branch"] == "rank":
            # DDP averages the ranks' gradients: the mean of the ranks' local losses.
            loss = sum(loss_of(config["model"],
                               model(local_slice(x, r, world), branch_of(config, step, r)),
                               local_slice(y, r, world)) for r in range(world)) / world
        else:
            loss = loss_of(config["model"], model(x, branch_of(config, step, 0)), y)
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_ddp(name, rank, world, process_group=None, steps=STEPS, timer=None):
    """DDP on this rank's slice of every global batch; returns (state_dict, losses)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    config = CONFIGS[name]
    model = make_model(config["model"])
    ddp = DDP(model, process_group=process_group,
              gradient_as_bucket_view=config["gradient_as_bucket_view"],
              find_unused_parameters=config["find_unused_parameters"],
              bucket_cap_mb=config["bucket_cap_mb"])
    if config.get("hook") == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(process_group=process_group,
                                            matrix_approximation_rank=1, start_powerSGD_iter=2,
                                            min_compression_rate=0.5)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    losses = []
    for step, (x, y) in enumerate(make_batches(config["model"], steps)):
        optimizer.zero_grad(set_to_none=not config["gradient_as_bucket_view"])
        output = ddp(local_slice(x, rank, world), branch_of(config, step, rank))
        loss = loss_of(config["model"], output, local_slice(y, rank, world))
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def clone_model(model):
    return copy.deepcopy(model)
