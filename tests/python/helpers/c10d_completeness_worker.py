"""One rank of a torch.distributed job that checks what PyTorch's own tests ask of a backend
beyond the common collectives: recv from any source, sparse allreduce (against Gloo's result)
and the wording of timeouts.

Usage: c10d_completeness_worker.py INIT_METHOD RANK WORLD_SIZE

The default group is "collectived" (the sidecar is $COLLECTIVED_ADDRESS); a Gloo group over the
same ranks gives the reference for sparse allreduce. Each check prints one line
``@@RESULT {"check": ..., "ok": ..., "errors": [...]}``; ranks meet in the default store
between checks, so one failed check does not desync the next.
"""

import datetime
import json
import re
import sys
import time
import traceback
import warnings

from torch_worker import Ctx  # the checks' context, shared with the torch backend's worker

warnings.filterwarnings("ignore")

# The regex of torch's own barrier-timeout test (distributed_test.py, _test_barrier_timeout).
TORCH_TIMEOUT_REGEX = " (Timed out|closed|timeout) "

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def check_names():
    return [fn.__name__ for fn in CHECKS]


@check
def recv_from_any_source_returns_each_sender_once_in_order(ctx):
    torch, dist, rank, world = ctx.torch, ctx.dist, ctx.rank, ctx.world
    if rank != 0:
        for k in range(2):
            dist.send(torch.full((3,), float(rank * 10 + k)), dst=0, tag=5)
        return
    senders = []
    for _ in range(2 * (world - 1)):
        received = torch.zeros(3)
        source = dist.recv(received, tag=5)
        senders.append(source)
        value = received[0].item()
        ctx.expect(torch.equal(received, torch.full((3,), value)),
                   f"recv from any source got mixed data {received}")
        ctx.expect(int(value) // 10 == source,
                   f"dist.recv returned sender {source} but the data {value} came from rank "
                   f"{int(value) // 10}")
        ctx.expect(int(value) % 10 == senders.count(source) - 1,
                   f"rank {source}'s messages out of order: message {int(value) % 10} arrived "
                   f"as its number {senders.count(source) - 1}")
    ctx.expect(sorted(senders) == sorted(list(range(1, world)) * 2),
               f"each send must be received exactly once: senders {senders}")


@check
def irecv_from_any_source_names_the_sender(ctx):
    torch, dist, rank, world = ctx.torch, ctx.dist, ctx.rank, ctx.world
    last = world - 1
    if rank == last:
        dist.send(torch.tensor([42], dtype=torch.int64), dst=0, tag=9)
    elif rank == 0:
        received = torch.zeros(1, dtype=torch.int64)
        work = dist.irecv(received, tag=9)  # src None: recv_anysource
        work.wait()
        ctx.expect(work._source_rank() == last, f"_source_rank() {work._source_rank()}")
        ctx.expect(received.item() == 42, f"received {received}")


@check
def recv_from_any_source_in_a_subgroup_returns_the_global_rank(ctx):
    torch, dist, rank, world = ctx.torch, ctx.dist, ctx.rank, ctx.world
    members = list(range(1, world))  # ranks 1.. span both sidecars
    group = dist.new_group(ranks=members)
    if rank == 0:
        return
    receiver = members[-1]
    if rank == receiver:
        got = []
        for _ in members[:-1]:
            received = torch.zeros(2)
            source = dist.recv(received, group=group, tag=3)
            got.append(source)
            ctx.expect(received[0].item() == source, f"data {received} from {source}")
        ctx.expect(sorted(got) == members[:-1], f"senders {got}, expected {members[:-1]}")
    else:
        dist.send(torch.full((2,), float(rank)), dst=receiver, group=group, tag=3)


def _sparse_inputs(torch, rank, world):
    """Like torch's simple_sparse_reduce_tests: a varying number of sparse and dense dims, nnz
    growing with the rank, and indices that overlap between ranks."""
    cases = []
    for sparse_dims, dense_dims in [(1, 0), (2, 0), (3, 0), (1, 1), (1, 2), (2, 1)]:
        indices = torch.reshape(torch.arange(rank + 1), (1, rank + 1))
        shape = [world] + [2] * dense_dims
        for _ in range(sparse_dims - 1):
            indices = torch.cat((indices, torch.zeros(1, rank + 1, dtype=torch.int64)))
            shape.insert(1, world)
        values = torch.ones([rank + 1] + [2] * dense_dims) * (rank + 1)
        cases.append(torch.sparse_coo_tensor(indices, values, shape))
    # Uncoalesced input (a repeated index) in float64.
    cases.append(torch.sparse_coo_tensor(torch.tensor([[rank, rank, 0]]),
                                         torch.tensor([1.5, 2.5, float(rank)],
                                                      dtype=torch.float64), [world]))
    return cases


@check
def sparse_allreduce_matches_gloo(ctx):
    torch, dist, rank, world = ctx.torch, ctx.dist, ctx.rank, ctx.world
    gloo = dist.new_group(backend="gloo")
    for i, case in enumerate(_sparse_inputs(torch, rank, world)):
        ours, theirs = case.clone(), case.clone()
        expected = sum(_sparse_inputs(torch, r, world)[i].to_dense() for r in range(world))
        work = dist.all_reduce(ours, async_op=True)
        work.wait()
        dist.all_reduce(theirs, group=gloo)
        ctx.expect(ours.layout == torch.sparse_coo and ours.is_coalesced() == theirs.is_coalesced(),
                   f"case {i}: layout {ours.layout}, coalesced {ours.is_coalesced()} (gloo: "
                   f"{theirs.is_coalesced()})")
        ctx.expect(torch.equal(ours._indices(), theirs._indices()) and
                   torch.equal(ours._values(), theirs._values()),
                   f"case {i}: collectived {ours} but gloo {theirs}")
        ctx.expect(torch.equal(ours.to_dense(), expected),
                   f"case {i}: {ours.to_dense()} expected {expected}")
        ctx.expect(work.result()[0] is ours, "the work's result is the input tensor")


@check
def sparse_allreduce_refuses_other_ops_clearly(ctx):
    torch, dist, world = ctx.torch, ctx.dist, ctx.world
    tensor = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), [world])
    try:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        ctx.expect(False, "sparse allreduce with MAX did not raise")
    except RuntimeError as error:
        ctx.expect("only works with ReduceOp.SUM" in str(error) and "MAX" in str(error),
                   f"unclear error: {error}")
    # Refused before anything moved: the group still works.
    dense = torch.ones(2)
    dist.all_reduce(dense)
    ctx.expect(torch.equal(dense, torch.full((2,), float(world))), f"allreduce after: {dense}")


@check
def premul_sum_takes_the_factor_torch_shows_or_is_refused_clearly(ctx):
    torch, dist, rank, world = ctx.torch, ctx.dist, ctx.rank, ctx.world
    from collectived.torch.op_options import premul_sum_factor as _premul_sum_factor
    make = getattr(dist, "_make_nccl_premul_sum", None)
    if make is None:
        return
    op = make(0.5)
    tensor = torch.full((3,), float(rank + 1))
    if _premul_sum_factor(op) is None:  # torch 1.13: the factor is out of the plugin's reach
        try:
            dist.all_reduce(tensor, op=op)
            ctx.expect(False, "PREMUL_SUM without a visible factor did not raise")
        except ValueError as error:
            ctx.expect("PREMUL_SUM" in str(error) and "torch 2.x" in str(error),
                       f"unclear error: {error}")
        return
    dist.all_reduce(tensor, op=op)
    expected = torch.full((3,), 0.5 * sum(range(1, world + 1)))
    ctx.expect(torch.equal(tensor, expected), f"PREMUL_SUM(0.5): {tensor}, expected {expected}")


def _expect_timeout(ctx, error, needles):
    message = str(error)
    ctx.expect(isinstance(error, RuntimeError), f"{type(error).__name__} is no RuntimeError")
    ctx.expect(re.search(TORCH_TIMEOUT_REGEX, message) is not None,
               f"{message!r} does not match torch's {TORCH_TIMEOUT_REGEX!r}")
    for needle in needles:
        ctx.expect(needle in message, f"{message!r} does not name {needle!r}")


def _timed_out(ctx, fn, seconds, needles):
    start = time.monotonic()
    try:
        fn()
        ctx.expect(False, "the op did not time out")
    except Exception as error:  # noqa: BLE001 - checked below
        _expect_timeout(ctx, error, needles)
    waited = time.monotonic() - start
    ctx.expect(seconds - 0.1 <= waited < seconds + 10, f"timed out after {waited:.2f} s")


@check
def barrier_that_a_rank_of_another_sidecar_never_joins_times_out_in_c10d_words(ctx):
    dist, rank = ctx.dist, ctx.rank
    # Ranks 0 and 1 live on different sidecars; rank 1 never enters the barrier.
    group = dist.new_group(ranks=[0, 1], timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        _timed_out(ctx, lambda: dist.barrier(group), 2.0,
                   [f"group '{group.sidecar_group}'", "barrier (seq 1)", "ranks [1]"])


@check
def allreduce_that_a_rank_of_the_same_sidecar_never_joins_times_out_in_c10d_words(ctx):
    torch, dist, rank = ctx.torch, ctx.dist, ctx.rank
    # Ranks 0 and 2 share sidecar 0 (group ranks 0 and 1); rank 2 never issues the allreduce.
    group = dist.new_group(ranks=[0, 2], timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        _timed_out(ctx, lambda: dist.all_reduce(torch.ones(2), group=group), 2.0,
                   [f"group '{group.sidecar_group}'", "allreduce (seq 1)", "ranks [1]"])


@check
def monitored_barrier_and_recv_time_out_in_c10d_words(ctx):
    torch, dist, rank = ctx.torch, ctx.dist, ctx.rank
    group = dist.new_group(ranks=[0, 1], timeout=datetime.timedelta(seconds=10))
    other = dist.new_group(ranks=[0, 1], timeout=datetime.timedelta(seconds=1))
    if rank == 0:
        # torch 1.13's dist.monitored_barrier serves Gloo only: the group's own method.
        _timed_out(ctx, lambda: group.monitored_barrier(datetime.timedelta(seconds=1)), 1.0,
                   [f"group '{group.sidecar_group}'", "barrier (seq 1)", "ranks [1]"])
        # An unmatched recv times out alone: the next one on the group is served.
        _timed_out(ctx, lambda: dist.recv(torch.zeros(1), src=1, group=other), 1.0,
                   [f"group '{other.sidecar_group}'", "recv (rank 0 from rank 1, tag 0)"])
        _timed_out(ctx, lambda: dist.recv(torch.zeros(1), group=other), 1.0,
                   [f"group '{other.sidecar_group}'", "recv (rank 0 from any rank, tag 0)"])


def _meet(dist, key, world):
    store = dist.distributed_c10d._get_default_store()
    store.add(key, 1)
    deadline = time.monotonic() + 120
    while int(store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ranks did not meet at {key}")
        time.sleep(0.01)


def report(name, ok, errors, seconds):
    print("@@RESULT " + json.dumps({"check": name, "ok": ok, "errors": errors,
                                    "seconds": round(seconds, 3)}), flush=True)


def main():
    init_method, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch
    import torch.distributed as dist
    import collectived.torch  # noqa: F401 - registers the backend

    dist.init_process_group("collectived", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    for fn in CHECKS:
        ctx = Ctx(torch, dist, rank, world)
        _meet(dist, f"meet/{fn.__name__}", world)
        start = time.monotonic()
        try:
            fn(ctx)
        except Exception:  # noqa: BLE001 - reported as the check's failure
            ctx.failures.append(f"rank {rank}: {traceback.format_exc()}")
        report(fn.__name__, not ctx.failures, ctx.failures, time.monotonic() - start)
    _meet(dist, "meet/end", world)
    print("@@DONE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
