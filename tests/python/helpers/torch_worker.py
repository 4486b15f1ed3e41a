"""One rank of a torch.distributed job on the "collectived" backend that runs many checks.

Usage: torch_worker.py SCENARIO INIT_METHOD RANK WORLD_SIZE

The sidecar is $COLLECTIVED_ADDRESS. Every check runs on every rank; its outcome is printed as
one line ``@@RESULT {"check": ..., "ok": ..., "errors": [...]}`` so that the test can report each
check separately. Checks use soft assertions (``ctx.expect``): a wrong value is recorded and the
check goes on issuing the same collectives as the other ranks, so one failure does not desync
the checks after it. Ranks meet in the default store between checks.

Scenarios (lists below): "surface" (the whole c10d surface), "basic" (a smaller set, for the
other init methods), "basic+exit" and "basic+crash" (then the last rank goes away, by os._exit
or by an unhandled exception, and the others must get an error naming it).
"""

import datetime
import json
import os
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore")

CHECKS = {}  # name -> function(ctx)


def check(*scenarios):
    def register(fn):
        fn.scenarios = scenarios
        CHECKS[fn.__name__] = fn
        return fn
    return register


def checks_for(scenario):
    """Names of the checks of `scenario`, in the order they run (the tests import this)."""
    base = scenario.split("+")[0]
    names = [name for name, fn in CHECKS.items() if base in fn.scenarios]
    if scenario.endswith("+exit") or scenario.endswith("+crash"):
        names.append("a_rank_that_exits_makes_the_others_raise_naming_it")
    return names


class NotApplicable(Exception):
    """Raised by a check whose feature the running torch does not have; the test reports the
    check as skipped with this reason (on every rank alike, never to hide a failure)."""


class Ctx:
    def __init__(self, torch, dist, rank, world):
        self.torch, self.dist, self.rank, self.world = torch, dist, rank, world
        self.failures = []

    def expect(self, condition, message):
        if not condition:
            self.failures.append(f"rank {self.rank}: {message}")
        return condition

    def equal(self, got, want, what):
        torch = self.torch
        ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        return self.expect(ok, f"{what}: got {got!r}, expected {want!r}")

    def close(self, got, want, what, rtol=1e-2, atol=1e-2):
        ok = got.dtype == want.dtype and got.shape == want.shape and torch_allclose(
            self.torch, got, want, rtol, atol)
        return self.expect(ok, f"{what}: got {got!r}, expected {want!r}")

    def raises(self, exc_types, needles, fn, what):
        """Expects fn() (or the wait() of the work it returns) to raise one of exc_types with
        every needle in its message."""
        try:
            work = fn()
            if work is not None and hasattr(work, "wait"):
                work.wait()
        except exc_types as error:
            message = str(error)
            for needle in needles:
                self.expect(needle in message, f"{what}: {needle!r} not in {message!r}")
            return error
        except Exception as error:  # noqa: BLE001 - reported
            self.expect(False, f"{what}: raised {type(error).__name__} ({error}), expected "
                               f"{[t.__name__ for t in exc_types]}")
            return error
        self.expect(False, f"{what}: did not raise")
        return None


def torch_allclose(torch, a, b, rtol, atol):
    if a.dtype.is_complex or b.dtype.is_complex:
        return torch.allclose(a, b, rtol=rtol, atol=atol)
    return torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)


# -- the checks ----------------------------------------------------------------------------


@check("surface", "basic")
def backend_identity(ctx):
    dist = ctx.dist
    from collectived.torch import ProcessGroupCollectived
    pg = dist.distributed_c10d._get_default_group()
    ctx.expect(dist.get_backend() == "collectived", f"get_backend() = {dist.get_backend()}")
    ctx.expect(isinstance(pg, ProcessGroupCollectived), f"default group is {type(pg)}")
    ctx.expect(dist.get_rank() == ctx.rank and dist.get_world_size() == ctx.world,
               f"rank/world {dist.get_rank()}/{dist.get_world_size()}")
    ctx.expect(pg.rank() == ctx.rank and pg.size() == ctx.world, "pg rank/size")


@check("surface", "basic")
def every_op_takes_the_one_native_session(ctx):
    """Every op, small or large (staged or adopted), contiguous or not, goes through the
    process's one native session and returns one kind of Work; ops of every kind in flight at
    once complete correctly."""
    torch, dist = ctx.torch, ctx.dist
    from collectived.torch import backend
    pg = dist.distributed_c10d._get_default_group()
    t = torch.full((8,), float(ctx.rank + 1))
    other = torch.full((8,), float(ctx.rank))
    gathered = torch.zeros(2 * ctx.world, dtype=torch.int64)
    mine = torch.tensor([ctx.rank, 10 * ctx.rank])
    share = torch.zeros(2)
    whole = torch.arange(2.0 * ctx.world) + ctx.rank
    c10d = dist.distributed_c10d
    works = {  # all in flight at once, then waited for
        "all_reduce": dist.all_reduce(t, async_op=True),
        "broadcast": dist.broadcast(other, src=ctx.world - 1, async_op=True),
        "all_gather_into_tensor": c10d._all_gather_base(gathered, mine, async_op=True),
        "reduce_scatter_tensor": c10d._reduce_scatter_base(share, whole, async_op=True),
        "barrier": dist.barrier(async_op=True)}
    for work in works.values():
        work.wait()
    kinds = {op: type(work).__name__ for op, work in works.items()}
    barrier = kinds.pop("barrier")
    total = float(sum(range(1, ctx.world + 1)))
    ctx.equal(t, torch.full((8,), total), "an allreduce with other ops in flight")
    ctx.equal(other, torch.full((8,), float(ctx.world - 1)), "the broadcast")
    ctx.equal(gathered, torch.tensor([v for r in range(ctx.world) for v in (r, 10 * r)]),
              "the allgather into a tensor")
    ranks = sum(range(ctx.world))
    ctx.equal(share, torch.tensor([2.0 * ctx.rank * ctx.world + ranks,
                                   (2.0 * ctx.rank + 1) * ctx.world + ranks]),
              "the reduce-scatter of a tensor")
    # Every rank takes the same path whatever its tensor's layout: a non-contiguous tensor on
    # the odd ranks, a contiguous one of the same shape on the even ones.
    m = torch.full((4, 2), float(ctx.rank + 1))
    x = m.t() if ctx.rank % 2 else m.reshape(2, 4)
    dist.all_reduce(x, async_op=True).wait()
    ctx.equal(x.contiguous(), torch.full((2, 4), total), "non-contiguous on some ranks")
    ctx.equal(m, torch.full((4, 2), total), "the storage under the views")
    out = torch.zeros(2, ctx.world).t() if ctx.rank % 2 else torch.zeros(ctx.world, 2)
    dist.distributed_c10d._all_gather_base(out, mine.float())
    ctx.equal(out.contiguous(), torch.tensor([[r, 10.0 * r] for r in range(ctx.world)]),
              "an allgather into a non-contiguous tensor on some ranks")
    # Reduce-scatter with MAX: a non-contiguous input on the even ranks, output on the odd ones.
    storage = torch.zeros(2 * ctx.world, 2)
    storage[:, 0] = torch.arange(2.0 * ctx.world) * (ctx.rank + 1)
    source = storage[:, 0] if ctx.rank % 2 == 0 else storage[:, 0].contiguous()
    out = torch.zeros(2, 2)[:, 0] if ctx.rank % 2 else torch.zeros(2)
    c10d._reduce_scatter_base(out, source, op=dist.ReduceOp.MAX)
    ctx.equal(out, torch.tensor([2.0 * ctx.rank, 2.0 * ctx.rank + 1]) * ctx.world,
              "a reduce-scatter (MAX) of non-contiguous tensors on some ranks")
    big = torch.ones(1 << 16)
    big_kind = type(dist.all_reduce(big, async_op=True)).__name__
    dist.all_reduce(big)
    ctx.equal(big, torch.full((1 << 16,), float(ctx.world) ** 2), "large allreduces")
    for op, kind in kinds.items():
        ctx.expect(kind == "Work", f"a small {op} returned a {kind}")
    ctx.expect(barrier == "Work", f"a barrier returned a {barrier}")
    ctx.expect(big_kind == "Work", f"a large allreduce returned a {big_kind}")
    sub = dist.new_group(list(range(ctx.world)))
    ctx.expect(pg._session is backend.shared_session() and sub._session is pg._session,
               "the groups of one process do not share one session")
    ctx.expect(not hasattr(backend, "shared_client"), "a second client is still offered")


def _reduce_cases(torch, dist):
    """(dtype, op, value of rank r, expected over W ranks)."""
    import math
    float_types = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    int_types = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
    cases = []
    for dt in float_types:
        cases += [
            (dt, dist.ReduceOp.SUM, lambda r, w: r + 1, lambda w: w * (w + 1) / 2),
            (dt, dist.ReduceOp.AVG, lambda r, w: r + 1, lambda w: (w + 1) / 2),
            (dt, dist.ReduceOp.PRODUCT, lambda r, w: r + 1, lambda w: math.factorial(w)),
            (dt, dist.ReduceOp.MIN, lambda r, w: r - 1, lambda w: -1),
            (dt, dist.ReduceOp.MAX, lambda r, w: r - 1, lambda w: w - 2),
        ]
    for dt in int_types:
        cases += [
            (dt, dist.ReduceOp.SUM, lambda r, w: r + 1, lambda w: w * (w + 1) // 2),
            (dt, dist.ReduceOp.PRODUCT, lambda r, w: r + 1, lambda w: math.factorial(w)),
            (dt, dist.ReduceOp.MIN, lambda r, w: r + 3, lambda w: 3),
            (dt, dist.ReduceOp.MAX, lambda r, w: r + 3, lambda w: w + 2),
            (dt, dist.ReduceOp.BAND, lambda r, w: 0b1111 ^ (1 << r), lambda w: 0b1111 & ~(
                (1 << w) - 1)),
            (dt, dist.ReduceOp.BOR, lambda r, w: 1 << r, lambda w: (1 << w) - 1),
            (dt, dist.ReduceOp.BXOR, lambda r, w: 1 << r | 16, lambda w: ((1 << w) - 1) | (
                16 if w % 2 else 0)),
        ]
    cases += [
        (torch.int32, dist.ReduceOp.AVG, lambda r, w: 2 * r + 1, lambda w: w),
        (torch.bool, dist.ReduceOp.SUM, lambda r, w: r == 1, lambda w: True),
        (torch.bool, dist.ReduceOp.PRODUCT, lambda r, w: r != 1, lambda w: False),
        (torch.bool, dist.ReduceOp.MIN, lambda r, w: True, lambda w: True),
        (torch.bool, dist.ReduceOp.MAX, lambda r, w: False, lambda w: False),
        (torch.bool, dist.ReduceOp.BOR, lambda r, w: r == 0, lambda w: True),
        (torch.bool, dist.ReduceOp.BAND, lambda r, w: r == 0, lambda w: False),
        (torch.bool, dist.ReduceOp.BXOR, lambda r, w: r < 3, lambda w: min(w, 3) % 2 == 1),
        (torch.complex64, dist.ReduceOp.SUM, lambda r, w: complex(r, 1), lambda w: complex(
            w * (w - 1) / 2, w)),
        # (torch refuses PRODUCT/MIN/MAX/bitwise on complex before the backend sees them)
        (torch.complex128, dist.ReduceOp.AVG, lambda r, w: complex(2 * r, -r),
         lambda w: complex(w - 1, -(w - 1) / 2)),
    ]
    return cases


@check("surface")
def all_reduce_every_op_and_dtype(ctx):
    torch, dist = ctx.torch, ctx.dist
    pending = []
    for i, (dt, op, value, expected) in enumerate(_reduce_cases(torch, dist)):
        t = torch.full((5, 3), value(ctx.rank, ctx.world), dtype=dt)
        want = torch.full((5, 3), expected(ctx.world), dtype=dt)
        if i % 2:
            pending.append((dist.all_reduce(t, op=op, async_op=True), t, want, dt, op))
        else:
            dist.all_reduce(t, op=op)
            ctx.equal(t, want, f"all_reduce {dt} {op}")
    for work, t, want, dt, op in pending:
        work.wait()
        ctx.equal(t, want, f"async all_reduce {dt} {op}")


@check("surface")
def tensors_of_finished_ops_are_freed(ctx):
    # The backend keeps Python Works alive for torch (see _KeepAlive in the backend); a Work
    # that was waited for or whose future was taken must not keep the op's tensors: a loop over
    # fresh tensors would otherwise hold thousands of them.
    import gc
    import weakref
    torch, dist = ctx.torch, ctx.dist
    refs = {}
    for i in range(3):
        big = torch.ones(1 << 16)  # 256 KiB: adopted or staged, not inline
        dist.all_reduce(big)
        small = torch.ones(4)  # inline
        dist.all_reduce(small)
        waited = torch.ones(1 << 16)
        work = dist.all_reduce(waited, async_op=True)
        work.wait()
        root = torch.ones(1 << 16)
        dist.broadcast(root, 0)
        outputs = [torch.empty(1 << 14) for _ in range(ctx.world)]
        dist.all_gather(outputs, torch.ones(1 << 14))
        futured = torch.ones(1 << 16)
        future = dist.all_reduce(futured, async_op=True).get_future()
        future.wait()
        refs.update({f"all_reduce {i}": weakref.ref(big), f"inline all_reduce {i}":
                     weakref.ref(small), f"waited async all_reduce {i}": weakref.ref(waited),
                     f"broadcast {i}": weakref.ref(root), f"all_gather output {i}":
                     weakref.ref(outputs[0]), f"all_reduce via its future {i}":
                     weakref.ref(futured)})
    del big, small, waited, work, root, outputs, futured, future
    # The thread that completed an op may still be returning from its callbacks (which hold
    # the Work) when a future's waiter goes on: give it a moment, not 4,096 ops.
    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        alive = [name for name, ref in refs.items() if ref() is not None]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    ctx.expect(not alive, f"tensors still held 5 s after their ops finished: {alive}")


@check("surface")
def work_futures_complete_whether_asked_for_before_or_after_the_op(ctx):
    # The backend makes a Work's future on the first get_future(): asked while the op waits for
    # the other ranks, it completes with the op; asked after, it is complete already.
    torch, dist = ctx.torch, ctx.dist
    early = torch.full((4,), float(ctx.rank + 1))
    if ctx.rank != 0:
        time.sleep(0.2)  # rank 0 asks for its future before the others issue the op
    work = dist.all_reduce(early, async_op=True)
    future = work.get_future()
    ctx.expect(work.get_future() is future, "get_future() made a second future")
    seen = []
    chained = future.then(lambda f: seen.append(f.value()) or "chained")
    value = future.wait()
    want = torch.full((4,), float(ctx.world * (ctx.world + 1) // 2))
    ctx.expect(isinstance(value, list) and len(value) == 1, f"future value {value!r}")
    ctx.equal(value[0], want, "the early future's value")
    ctx.equal(early, want, "the early op's tensor")
    ctx.expect(chained.wait() == "chained" and len(seen) == 1, "then() ran once")
    late = torch.full((4,), 2.0)
    work = dist.all_reduce(late, async_op=True)
    work.wait()
    future = work.get_future()
    ctx.expect(future.done(), "a future asked for after wait() is not done")
    ctx.equal(future.wait()[0], torch.full((4,), 2.0 * ctx.world), "the late future's value")


@check("surface", "basic")
def all_reduce_bfloat16_and_bool_which_gloo_rejects(ctx):
    torch, dist = ctx.torch, ctx.dist
    b = torch.linspace(-1, 1, 1000, dtype=torch.bfloat16) * (ctx.rank + 1)
    want = (torch.linspace(-1, 1, 1000, dtype=torch.bfloat16).float() *
            sum(range(1, ctx.world + 1))).bfloat16()
    dist.all_reduce(b)
    ctx.close(b, want, "bfloat16 SUM", rtol=2e-2, atol=2e-2)
    flags = torch.zeros(64, dtype=torch.bool)
    flags[ctx.rank] = True
    dist.all_reduce(flags)  # SUM on bool = logical or
    want = torch.zeros(64, dtype=torch.bool)
    want[:ctx.world] = True
    ctx.equal(flags, want, "bool SUM")


@check("surface")
def all_reduce_large_and_non_contiguous(ctx):
    torch, dist = ctx.torch, ctx.dist
    big = torch.full((1 << 20,), float(ctx.rank))  # 4 MiB
    dist.all_reduce(big)
    ctx.expect(bool(torch.all(big == sum(range(ctx.world)))), "4 MiB all_reduce")
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4) * (ctx.rank + 1)
    view = base.t()  # not contiguous: staged and copied back
    try:
        dist.all_reduce(view)
        ctx.equal(base, torch.arange(12, dtype=torch.float64).reshape(3, 4) *
                  sum(range(1, ctx.world + 1)), "non-contiguous all_reduce")
    except (RuntimeError, ValueError) as error:  # refusing it clearly is c10d-like as well
        ctx.expect("contiguous" in str(error), f"non-contiguous: {error}")


@check("surface")
def premul_sum_is_refused_with_a_clear_value_error(ctx):
    torch, dist = ctx.torch, ctx.dist
    t = torch.ones(3)
    ctx.raises((ValueError,), ["PREMUL_SUM"],
               lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0)), "PREMUL_SUM")
    ctx.equal(t, torch.ones(3), "tensor untouched")


@check("surface", "basic")
def broadcast(ctx):
    torch, dist = ctx.torch, ctx.dist
    for src in (1, ctx.world - 1, 0):
        t = torch.full((4, 4), float(ctx.rank * 10), dtype=torch.float64)
        dist.broadcast(t, src=src)
        ctx.equal(t, torch.full((4, 4), float(src * 10), dtype=torch.float64),
                  f"broadcast from {src}")
    t = torch.arange(7, dtype=torch.int64) if ctx.rank == 1 else torch.zeros(7, dtype=torch.int64)
    work = dist.broadcast(t, src=1, async_op=True)
    work.wait()
    ctx.equal(t, torch.arange(7), "async broadcast")


@check("surface")
def reduce(ctx):
    torch, dist = ctx.torch, ctx.dist
    dst = ctx.world - 2
    t = torch.full((6,), float(ctx.rank + 1))
    dist.reduce(t, dst=dst, op=dist.ReduceOp.MAX)
    if ctx.rank == dst:
        ctx.equal(t, torch.full((6,), float(ctx.world)), "reduce MAX at dst")
    else:
        ctx.equal(t, torch.full((6,), float(ctx.rank + 1)), "reduce: non-dst unchanged")
    t = torch.full((3,), ctx.rank + 1, dtype=torch.int32)
    dist.reduce(t, dst=0)
    if ctx.rank == 0:
        ctx.equal(t, torch.full((3,), sum(range(1, ctx.world + 1)), dtype=torch.int32),
                  "reduce SUM at 0")


@check("surface", "basic")
def all_gather(ctx):
    torch, dist = ctx.torch, ctx.dist
    outs = [torch.zeros(2, 3, dtype=torch.int64) for _ in range(ctx.world)]
    dist.all_gather(outs, torch.full((2, 3), ctx.rank, dtype=torch.int64))
    for r, o in enumerate(outs):
        ctx.equal(o, torch.full((2, 3), r, dtype=torch.int64), f"all_gather[{r}]")


@check("surface")
def all_gather_into_tensor_and__all_gather_base(ctx):
    torch, dist = ctx.torch, ctx.dist
    out = torch.zeros(ctx.world * 3)
    # The old private name (deprecated in torch 2.x), then the public one (torch 1.13+).
    gather_base = getattr(dist, "_all_gather_base", None) or dist.all_gather_into_tensor
    gather_base(out, torch.full((3,), float(ctx.rank)))
    ctx.equal(out, torch.arange(ctx.world).float().repeat_interleave(3), "_all_gather_base")
    if hasattr(dist, "all_gather_into_tensor"):
        out2 = torch.zeros(ctx.world, 2, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out2, torch.full((1, 2), ctx.rank, dtype=torch.bfloat16))
        ctx.equal(out2, torch.arange(ctx.world).to(torch.bfloat16)[:, None].repeat(1, 2),
                  "all_gather_into_tensor")


@check("surface", "basic")
def all_gather_object(ctx):
    dist = ctx.dist
    objects = [None] * ctx.world
    mine = {"rank": ctx.rank, "text": "x" * (100 * ctx.rank + 1), "tuple": (ctx.rank, None)}
    dist.all_gather_object(objects, mine)
    for r, obj in enumerate(objects):
        ctx.expect(obj == {"rank": r, "text": "x" * (100 * r + 1), "tuple": (r, None)},
                   f"all_gather_object[{r}] = {obj!r}")


@check("surface")
def broadcast_object_list(ctx):
    dist = ctx.dist
    objects = [{"a": 1}, [1, 2, 3], "long" * 500] if ctx.rank == 1 else [None, None, None]
    dist.broadcast_object_list(objects, src=1)
    ctx.expect(objects == [{"a": 1}, [1, 2, 3], "long" * 500], f"got {objects!r:.200}")


@check("surface")
def scatter_object_list(ctx):
    dist = ctx.dist
    src = ctx.world - 1
    inputs = [{"to": r, "pad": "p" * r * 50} for r in range(ctx.world)] if ctx.rank == src \
        else None
    output = [None]
    dist.scatter_object_list(output, inputs, src=src)
    ctx.expect(output[0] == {"to": ctx.rank, "pad": "p" * ctx.rank * 50}, f"got {output!r}")


@check("surface")
def gather(ctx):
    torch, dist = ctx.torch, ctx.dist
    dst = ctx.world - 1
    gather_list = [torch.zeros(2) for _ in range(ctx.world)] if ctx.rank == dst else None
    dist.gather(torch.tensor([ctx.rank, -ctx.rank], dtype=torch.float32), gather_list, dst=dst)
    if ctx.rank == dst:
        for r, t in enumerate(gather_list):
            ctx.equal(t, torch.tensor([r, -r], dtype=torch.float32), f"gather[{r}]")


@check("surface")
def scatter(ctx):
    torch, dist = ctx.torch, ctx.dist
    src = 1
    out = torch.zeros(3, dtype=torch.int16)
    scatter_list = [torch.full((3,), 7 * r, dtype=torch.int16) for r in range(ctx.world)] \
        if ctx.rank == src else None
    dist.scatter(out, scatter_list, src=src)
    ctx.equal(out, torch.full((3,), 7 * ctx.rank, dtype=torch.int16), "scatter")


@check("surface")
def reduce_scatter(ctx):
    torch, dist = ctx.torch, ctx.dist
    W = ctx.world
    out = torch.zeros(4)
    inputs = [torch.full((4,), float(ctx.rank * 10 + j)) for j in range(W)]
    dist.reduce_scatter(out, inputs)
    ctx.equal(out, torch.full((4,), float(sum(r * 10 + ctx.rank for r in range(W)))),
              "reduce_scatter SUM")
    out = torch.zeros(2, dtype=torch.int64)
    dist.reduce_scatter(out, [torch.full((2,), ctx.rank + j, dtype=torch.int64)
                              for j in range(W)], op=dist.ReduceOp.MAX)
    ctx.equal(out, torch.full((2,), W - 1 + ctx.rank, dtype=torch.int64), "reduce_scatter MAX")


@check("surface")
def reduce_scatter_tensor_and__reduce_scatter_base(ctx):
    torch, dist = ctx.torch, ctx.dist
    W = ctx.world
    out = torch.zeros(3)
    inp = torch.arange(3 * W, dtype=torch.float32) * (ctx.rank + 1)
    scatter_base = getattr(dist, "_reduce_scatter_base", None) or dist.reduce_scatter_tensor
    scatter_base(out, inp)
    ctx.equal(out, torch.arange(3 * ctx.rank, 3 * ctx.rank + 3, dtype=torch.float32) *
              (W * (W + 1) / 2), "_reduce_scatter_base")
    if hasattr(dist, "reduce_scatter_tensor"):
        out = torch.zeros(2, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, torch.ones(2 * W, dtype=torch.bfloat16))
        ctx.equal(out, torch.full((2,), W, dtype=torch.bfloat16), "reduce_scatter_tensor")


@check("surface")
def all_to_all(ctx):
    torch, dist = ctx.torch, ctx.dist
    W = ctx.world
    inputs = [torch.full((j + 1,), float(100 * ctx.rank + j)) for j in range(W)]
    outputs = [torch.zeros(ctx.rank + 1) for _ in range(W)]
    dist.all_to_all(outputs, inputs)
    for j in range(W):
        ctx.equal(outputs[j], torch.full((ctx.rank + 1,), float(100 * j + ctx.rank)),
                  f"all_to_all from {j}")


@check("surface", "basic")
def all_to_all_single_even_and_uneven(ctx):
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    inp = torch.arange(W * 2, dtype=torch.float32) + 100 * R
    out = torch.zeros(W * 2)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(2 * R, 2 * R + 2, dtype=torch.float32) + 100 * j
                      for j in range(W)])
    ctx.equal(out, want, "even all_to_all_single")
    # Uneven: rank i sends (i + j + 1) rows of 3 to rank j.
    in_splits = [R + j + 1 for j in range(W)]
    out_splits = [j + R + 1 for j in range(W)]
    inp = torch.cat([torch.full((in_splits[j], 3), 10 * R + j, dtype=torch.int64)
                     for j in range(W)])
    out = torch.zeros(sum(out_splits), 3, dtype=torch.int64)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    want = torch.cat([torch.full((out_splits[j], 3), 10 * j + R, dtype=torch.int64)
                      for j in range(W)])
    ctx.equal(out, want, "uneven all_to_all_single")


@check("surface", "basic")
def barrier(ctx):
    dist = ctx.dist
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == 0:
        time.sleep(0.3)
        store.add("barrier/late", 1)
    dist.barrier()
    # Nobody leaves the barrier before rank 0 (who arrived late) has entered it.
    ctx.expect(store.add("barrier/late", 0) == 1, "left the barrier before rank 0 entered")
    work = dist.barrier(async_op=True)
    work.wait()


@check("surface")
def monitored_barrier_torch_refuses_plugins(ctx):
    # distributed_c10d.monitored_barrier: `if get_backend(group) != Backend.GLOO: raise ...(
    # "monitored_barrier is only implemented for GLOO backend.")`, a RuntimeError in torch 1.13
    # and a ValueError in torch 2.x.
    dist = ctx.dist
    ctx.raises((RuntimeError, ValueError), ["GLOO"], lambda: dist.monitored_barrier(),
               "monitored_barrier")


@check("surface")
def monitored_barrier_on_the_process_group(ctx):
    dist = ctx.dist
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30))
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)


@check("surface")
def monitored_barrier_names_the_rank_that_never_arrived(ctx):
    dist = ctx.dist
    group = dist.new_group(list(range(ctx.world)))
    missing = ctx.world - 1
    if ctx.rank != missing:
        start = time.monotonic()
        ctx.raises((RuntimeError,), [str(missing)],
                   lambda: group.monitored_barrier(datetime.timedelta(seconds=2)),
                   "monitored_barrier without the last rank")
        elapsed = time.monotonic() - start
        ctx.expect(elapsed < 10, f"monitored_barrier took {elapsed:.1f} s to fail (timeout 2 s)")


@check("surface", "basic")
def send_recv_isend_irecv(ctx):
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    # Pairs 0<->1, 2<->3: blocking send/recv, then two tags received in the opposite order
    # (the sends are isend: a blocking send completes once the receiver has posted its recv,
    # as with Gloo, so blocking sends in the opposite order would deadlock on any backend).
    peer = R ^ 1
    if peer < W:
        x = torch.zeros(2, dtype=torch.float64)
        if R % 2 == 0:
            dist.send(torch.full((2,), R + 0.75, dtype=torch.float64), peer)
        else:
            ctx.expect(dist.recv(x, peer) == peer, "recv returns the source")
            ctx.equal(x, torch.full((2,), peer + 0.75, dtype=torch.float64), "blocking recv")
        a, b = torch.zeros(5), torch.zeros(5)
        if R % 2 == 0:
            w11 = dist.isend(torch.full((5,), R + 0.5), peer, tag=11)
            w22 = dist.isend(torch.full((5,), R + 0.25), peer, tag=22)
            w22.wait()
            w11.wait()
        else:
            src = dist.recv(b, peer, tag=22)
            ctx.expect(src == peer, f"recv returned {src}")
            dist.recv(a, peer, tag=11)
            ctx.equal(a, torch.full((5,), peer + 0.5), "recv tag 11")
            ctx.equal(b, torch.full((5,), peer + 0.25), "recv tag 22")
    # A ring with isend/irecv.
    right, left = (R + 1) % W, (R - 1) % W
    got = torch.zeros(3, dtype=torch.int32)
    works = [dist.isend(torch.full((3,), R, dtype=torch.int32), right, tag=5),
             dist.irecv(got, left, tag=5)]
    for w in works:
        w.wait()
    ctx.equal(got, torch.full((3,), left, dtype=torch.int32), "irecv in a ring")


@check("surface")
def recv_from_any_source_returns_the_sender(ctx):
    torch, dist = ctx.torch, ctx.dist
    right, left = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    work = dist.isend(torch.full((2,), float(ctx.rank)), right, tag=11)
    got = torch.zeros(2)
    source = dist.recv(got, tag=11)  # no src: torch calls recv_anysource
    work.wait()
    ctx.expect(source == left, f"recv without src returned {source}, expected {left}")
    ctx.equal(got, torch.full((2,), float(left)), "recv without src")


@check("surface")
def batch_isend_irecv(ctx):
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    right, left = (R + 1) % W, (R - 1) % W
    from_left, from_right = torch.zeros(4), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(R)), right),
           dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.isend, torch.full((4,), float(-R)), left),
           dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    ctx.equal(from_left, torch.full((4,), float(left)), "from left")
    ctx.equal(from_right, torch.full((4,), float(-right)), "from right")


@check("surface")
def all_reduce_coalesced(ctx):
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    tensors = [torch.full((3,), float(R)), torch.full((2, 2), float(R + 1))]
    dist.all_reduce_coalesced(tensors, op=dist.ReduceOp.MAX)
    ctx.equal(tensors[0], torch.full((3,), float(W - 1)), "coalesced[0]")
    ctx.equal(tensors[1], torch.full((2, 2), float(W)), "coalesced[1]")
    tensors = [torch.full((5,), R, dtype=torch.int64), torch.full((1,), 2 * R, dtype=torch.int64)]
    dist.all_reduce_coalesced(tensors, async_op=True).wait()
    ctx.equal(tensors[0], torch.full((5,), W * (W - 1) // 2, dtype=torch.int64), "async[0]")
    ctx.equal(tensors[1], torch.full((1,), W * (W - 1), dtype=torch.int64), "async[1]")


@check("surface")
def all_gather_coalesced(ctx):
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    # torch's layout: output_tensor_lists[r][i] receives rank r's input_tensor_list[i].
    # Same-sized inputs first (a wrong layout would go unnoticed by any size check).
    inputs = [torch.full((2,), float(10 * R + i)) for i in range(3)]
    outputs = [[torch.zeros(2) for _ in range(3)] for _ in range(W)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(W):
        for i in range(3):
            ctx.equal(outputs[r][i], torch.full((2,), float(10 * r + i)),
                      f"same sizes: output_tensor_lists[{r}][{i}]")
    inputs = [torch.full((2,), float(R)), torch.full((3,), float(10 * R))]
    outputs = [[torch.zeros(2), torch.zeros(3)] for _ in range(W)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(W):
        ctx.equal(outputs[r][0], torch.full((2,), float(r)), f"output_tensor_lists[{r}][0]")
        ctx.equal(outputs[r][1], torch.full((3,), float(10 * r)), f"output_tensor_lists[{r}][1]")


@check("surface")
def coalesced_tensor_ops_and_the_names_newer_torch_calls_from_cpp(ctx):
    # torch 2.x's coalescing manager and functional collectives call these on the group
    # (allgather_into_tensor_coalesced, ...; the newest C++ names all_gather_single, ...).
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    pg = dist.distributed_c10d._get_default_group()
    inputs = [torch.full((2,), float(R)), torch.full((3, 2), float(10 * R), dtype=torch.float64)]
    outputs = [torch.zeros(2 * W), torch.zeros(3 * W, 2, dtype=torch.float64)]
    pg.allgather_into_tensor_coalesced(outputs, inputs).wait()
    ctx.equal(outputs[0], torch.arange(W).float().repeat_interleave(2), "gather-coalesced[0]")
    ctx.equal(outputs[1], (10 * torch.arange(W)).double().repeat_interleave(6).view(3 * W, 2),
              "gather-coalesced[1]")
    inputs = [torch.ones(2 * W) * (R + 1), torch.arange(W, dtype=torch.int64).repeat(3)]
    outputs = [torch.zeros(2), torch.zeros(3, dtype=torch.int64)]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    pg.reduce_scatter_tensor_coalesced(outputs, inputs, opts).wait()
    ctx.equal(outputs[0], torch.full((2,), float(W * (W + 1) // 2)), "reduce-scatter-coalesced[0]")
    # Rank R's chunk of arange(W).repeat(3) is [3R, 3R+3) mod W, summed over W ranks.
    want = (torch.arange(3 * R, 3 * R + 3, dtype=torch.int64) % W) * W
    ctx.equal(outputs[1], want, "reduce-scatter-coalesced[1]")
    out = torch.zeros(W * 2)
    pg.all_gather_single(out, torch.full((2,), float(R))).wait()
    ctx.equal(out, torch.arange(W).float().repeat_interleave(2), "all_gather_single")
    out = torch.zeros(1)
    pg.reduce_scatter_single(out, torch.ones(W)).wait()
    ctx.equal(out, torch.full((1,), float(W)), "reduce_scatter_single")
    out = torch.zeros(W)
    pg.all_to_all_single(out, torch.full((W,), float(R)), [], []).wait()
    ctx.equal(out, torch.arange(W).float(), "all_to_all_single")
    ctx.raises((ValueError,), ["outputs", "inputs"],
               lambda: pg.allgather_into_tensor_coalesced([torch.zeros(W)], []),
               "mismatched coalesced lists")
    # The group is fine afterwards.
    t = torch.ones(1)
    dist.all_reduce(t)
    ctx.equal(t, torch.full((1,), float(W)), "all_reduce afterwards")


@check("surface")
def process_group_overloads_and_what_torch_2_asks_of_a_group(ctx):
    # The ProcessGroup's own call forms (DDP's join mode calls pg.allreduce(tensor)), and the
    # per-device backend and device types torch 2.x asks a group for.
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    pg = dist.distributed_c10d._get_default_group()
    t = torch.full((3,), float(R))
    pg.allreduce(t).wait()
    ctx.equal(t, torch.full((3,), float(sum(range(W)))), "allreduce(tensor)")
    t = torch.full((2,), float(R))
    pg.allreduce(t, dist.ReduceOp.MAX).wait()
    ctx.equal(t, torch.full((2,), float(W - 1)), "allreduce(tensor, ReduceOp.MAX)")
    t = torch.full((2,), float(R))
    pg.broadcast(t, W - 1).wait()
    ctx.equal(t, torch.full((2,), float(W - 1)), "broadcast(tensor, root)")
    t = torch.full((2,), float(R + 1))
    pg.reduce(t, 0, op=dist.ReduceOp.PRODUCT).wait()
    if R == 0:
        ctx.equal(t, torch.full((2,), float(torch.arange(1, W + 1).prod())), "reduce(t, root)")
    outs = [torch.zeros(1) for _ in range(W)]
    pg.allgather(outs, torch.full((1,), float(R))).wait()
    ctx.equal(torch.cat(outs), torch.arange(W).float(), "allgather(outputs, tensor)")
    ctx.expect(pg._get_backend(torch.device("cpu")) is pg, "the CPU backend is the group")
    # CUDA is served by the group itself when the client can pass CUDA tensors.
    from collectived import cuda as collectived_cuda
    if collectived_cuda.available():
        ctx.expect(pg._get_backend(torch.device("cuda")) is pg, "the CUDA backend is the group")
        served = [torch.device("cpu"), torch.device("cuda")]
    else:
        ctx.raises((RuntimeError,), ["cuda"], lambda: pg._get_backend(torch.device("cuda")),
                   "_get_backend(cuda)")
        served = [torch.device("cpu")]
    ctx.raises((RuntimeError,), ["xla"], lambda: pg._get_backend(torch.device("xla")),
               "_get_backend(xla)")
    ctx.expect(pg._device_types == served, f"_device_types {pg._device_types}")
    ctx.expect(not pg.supports_splitting and not pg.supports_coalescing, "supports_*")


@check("surface", "basic")
def group_names_torch_gives_and_the_sidecars(ctx):
    dist = ctx.dist
    c10d = dist.distributed_c10d
    pg = c10d._get_default_group()
    sub = dist.new_group(list(range(ctx.world)))
    names = c10d._world.pg_names if hasattr(c10d, "_world") else c10d._pg_names
    torch_names_groups = hasattr(dist.ProcessGroup, "_set_group_name")  # torch 2.x
    for what, g in (("default group", pg), ("subgroup", sub)):
        ctx.expect(g.sidecar_group.startswith("pg-"), f"{what}: sidecar group {g.sidecar_group}")
        # torch 2.x registers the group under the name it set and looks it up by group_name.
        want = names[g] if torch_names_groups else g.sidecar_group
        ctx.expect(g.group_name == want, f"{what}: group_name {g.group_name!r}, want {want!r}")
    ctx.expect(pg.sidecar_group != sub.sidecar_group, "two torch groups share a sidecar group")
    seen = [None] * ctx.world
    dist.all_gather_object(seen, (pg.sidecar_group, sub.sidecar_group))
    ctx.expect(len(set(seen)) == 1, f"ranks disagree on the sidecar groups: {seen}")
    before = sub.group_name
    sub._set_group_name("renamed-by-torch")
    ctx.expect(sub.group_name == "renamed-by-torch" and sub.getGroupName() == "renamed-by-torch",
               f"after _set_group_name: {sub.group_name!r}, {sub.getGroupName()!r}")
    sub._set_group_desc("a description")
    ctx.expect(sub.group_desc == "a description" and sub.getGroupDesc() == "a description",
               f"group_desc {sub.group_desc!r}")
    t = ctx.torch.ones(2)
    dist.all_reduce(t, group=sub)
    ctx.equal(t, ctx.torch.full((2,), float(ctx.world)), "all_reduce after renaming")
    sub._set_group_name(before)


@check("surface", "basic")
def shutdown_leaves_the_sidecar_group(ctx):
    # torch 2.x may call shutdown()/abort() on the group; both leave the sidecars' group.
    torch, dist = ctx.torch, ctx.dist
    from collectived import Client
    sub = dist.new_group(list(range(ctx.world)))
    name = sub.sidecar_group
    t = torch.ones(3)
    dist.all_reduce(t, group=sub)
    ctx.equal(t, torch.full((3,), float(ctx.world)), "all_reduce before shutdown")
    _meet(dist, "shutdown/ready", ctx.world)
    sub.shutdown() if ctx.rank % 2 == 0 else sub.abort()
    sub.shutdown()  # twice is fine
    ctx.raises((RuntimeError,), ["shut down", "allreduce"],
               lambda: sub.allreduce([torch.ones(1)]), "allreduce after shutdown")
    _meet(dist, "shutdown/done", ctx.world)
    with Client(os.environ.get("COLLECTIVED_ADDRESS")) as admin:  # a session for asking only
        groups = [g.name for g in admin.list_groups()]
    ctx.expect(name not in groups, f"sidecar group {name} still listed: {groups}")
    # The default group is untouched.
    t = torch.ones(1)
    dist.all_reduce(t)
    ctx.equal(t, torch.full((1,), float(ctx.world)), "world after a subgroup shut down")


@check("surface")
def new_group_with_local_synchronization(ctx):
    # torch 2.x: with use_local_synchronization only the members call new_group; the group's
    # name (and so its store prefix) is a hash of its ranks and of how many groups the calling
    # rank holds, so this check runs while every rank holds as many groups as the others (before
    # new_group_on_subsets). Disjoint pairs are created at once, each spanning both sidecars,
    # then a pair that lives on one sidecar.
    import inspect
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    if "use_local_synchronization" not in inspect.signature(dist.new_group).parameters:
        raise NotApplicable(f"torch {torch.__version__} has no new_group(use_local_synchronization)")
    for ranks in [[0, 1], [2, 3], [0, 2]] if W >= 4 else [[0, 1]]:
        if R not in ranks:
            continue
        g = dist.new_group(ranks, use_local_synchronization=True,
                           timeout=datetime.timedelta(seconds=30))
        ctx.expect(g is not dist.GroupMember.NON_GROUP_MEMBER, f"member of {ranks} got no group")
        ctx.expect(dist.get_rank(g) == ranks.index(R), f"group rank on {ranks}")
        t = torch.full((2,), float(R + 1))
        dist.all_reduce(t, group=g)
        ctx.equal(t, torch.full((2,), float(sum(ranks) + len(ranks))), f"all_reduce on {ranks}")
        t = torch.full((3,), float(R))
        dist.broadcast(t, src=ranks[-1], group=g)
        ctx.equal(t, torch.full((3,), float(ranks[-1])), f"broadcast on {ranks}")
        dist.destroy_process_group(g)
    t = torch.ones(1)
    dist.all_reduce(t)
    ctx.equal(t, torch.full((1,), float(W)), "world after locally synchronized groups")


@check("surface", "basic")
def new_group_on_subsets(ctx):
    torch, dist = ctx.torch, ctx.dist
    W, R = ctx.world, ctx.rank
    if W < 3:
        subsets = [[1], [0, 1], [0, 1]]
    else:
        # [1, 2] spans both sidecars, [0, 2] lives on sidecar 0 only; [2, 1] = same members.
        subsets = [[1, 2], [0, 2], [2, 1]]
    groups = [dist.new_group(ranks) for ranks in subsets]
    for ranks, g in zip(subsets, groups):
        if R not in ranks:
            ctx.expect(g is dist.GroupMember.NON_GROUP_MEMBER, f"non-member got {g!r}")
            t = torch.full((2,), 5.0)
            ctx.expect(dist.all_reduce(t, group=g) is None, "collective on a non-member")
            ctx.equal(t, torch.full((2,), 5.0), "non-member tensor untouched")
            continue
        ctx.expect(dist.get_world_size(g) == len(ranks), "group size")
        ctx.expect(dist.get_rank(g) == sorted(ranks).index(R), "group rank")
        t = torch.full((2,), float(R))
        dist.all_reduce(t, group=g)
        ctx.equal(t, torch.full((2,), float(sum(ranks))), f"all_reduce on {ranks}")
        src = max(ranks)  # a global rank
        t = torch.full((3,), float(R))
        dist.broadcast(t, src=src, group=g)
        ctx.equal(t, torch.full((3,), float(src)), f"broadcast on {ranks}")
        objects = [None] * len(ranks)
        dist.all_gather_object(objects, R, group=g)
        ctx.expect(objects == sorted(ranks), f"all_gather_object on {ranks}: {objects}")
    # The world is still fine after the subgroups.
    t = torch.ones(1)
    dist.all_reduce(t)
    ctx.equal(t, torch.full((1,), float(W)), "world after subgroups")


@check("surface")
def async_work_wait_is_completed_and_future(ctx):
    torch, dist = ctx.torch, ctx.dist
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((4,), float(ctx.rank))
    if ctx.rank == 0:
        work = dist.all_reduce(t, async_op=True)
        time.sleep(0.2)
        ctx.expect(not work.is_completed(), "completed before the other ranks issued it")
        store.set("async/go", "1")
    else:
        store.wait(["async/go"])
        work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    ctx.expect(work.wait() is True, "wait() returns True")
    ctx.expect(work.is_completed(), "is_completed() after wait")
    ctx.expect(work.is_success(), "is_success() after wait")
    want = torch.full((4,), float(sum(range(ctx.world))))
    ctx.equal(t, want, "async all_reduce")
    value = fut.wait()
    ctx.expect(isinstance(value, list) and len(value) == 1, f"future value {value!r}")
    if isinstance(value, list) and value:
        ctx.equal(value[0], want, "future value")
    ctx.equal(chained.wait(), want * 2, "chained future")
    # Several in flight at once complete in order.
    tensors = [torch.full((10 + i,), float(ctx.rank + i)) for i in range(8)]
    works = [dist.all_reduce(x, async_op=True) for x in tensors]
    for w in works:
        w.wait()
    for i, x in enumerate(tensors):
        ctx.equal(x, torch.full((10 + i,), float(sum(range(ctx.world)) + ctx.world * i)),
                  f"in-flight {i}")


@check("surface", "basic")
def sequence_numbers_agree_across_ranks(ctx):
    torch, dist = ctx.torch, ctx.dist
    pg = dist.distributed_c10d._get_default_group()
    before = pg._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    after = pg._get_sequence_number_for_group()
    ctx.expect(after == before + 1, f"sequence number {before} -> {after}")
    numbers = [None] * ctx.world
    dist.all_gather_object(numbers, after)
    ctx.expect(len(set(numbers)) == 1, f"sequence numbers differ: {numbers}")
    sub = dist.new_group(list(range(ctx.world)))
    dist.all_reduce(torch.ones(1), group=sub)
    dist.all_reduce(torch.ones(1), group=sub)
    numbers = [None] * ctx.world
    dist.all_gather_object(numbers, sub._get_sequence_number_for_group())
    ctx.expect(numbers == [2] * ctx.world, f"subgroup sequence numbers {numbers}")


@check("surface", "basic")
def invalid_root_raises_value_error_with_the_sidecars_message(ctx):
    torch, dist = ctx.torch, ctx.dist
    bad = ctx.world + 3
    t = torch.ones(3)
    ctx.raises((ValueError,), ["root", str(bad)], lambda: dist.broadcast(t, src=bad),
               "broadcast with an invalid root")
    error = ctx.raises((ValueError,), ["root"],
                       lambda: dist.reduce(t, dst=bad, async_op=True), "async reduce")
    ctx.expect(isinstance(error, RuntimeError), f"{type(error)} is not a RuntimeError too")
    # The group still works afterwards.
    dist.all_reduce(t)
    ctx.equal(t, torch.full((3,), float(ctx.world)), "all_reduce after the errors")


@check("surface")
def mismatched_dtypes_raise(ctx):
    torch, dist = ctx.torch, ctx.dist
    outs = [torch.zeros(2, dtype=torch.int32) for _ in range(ctx.world)]
    ctx.raises((ValueError, RuntimeError), ["dtype"],
               lambda: dist.all_gather(outs, torch.zeros(2)), "all_gather with wrong dtypes")
    t = torch.ones(2)
    dist.all_reduce(t)
    ctx.equal(t, torch.full((2,), float(ctx.world)), "all_reduce after the error")


@check("surface")
def tensors_off_the_cpu_are_refused_naming_the_device(ctx):
    # A CUDA tensor takes the same path; "meta" tensors exist on every torch build.
    torch, dist = ctx.torch, ctx.dist
    t = torch.empty(4, device="meta")
    ctx.raises((ValueError,), ["CPU", "meta"], lambda: dist.all_reduce(t), "all_reduce on meta")
    ctx.raises((ValueError,), ["CPU", "meta"],
               lambda: dist.broadcast(t, src=0, async_op=True), "async broadcast on meta")
    t = torch.ones(2)
    dist.all_reduce(t)
    ctx.equal(t, torch.full((2,), float(ctx.world)), "all_reduce after the refusals")


@check("surface")
def work_wait_with_a_timeout_raises_and_the_op_still_completes(ctx):
    torch, dist = ctx.torch, ctx.dist
    group = dist.new_group(list(range(ctx.world)))
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((3,), float(ctx.rank + 1))
    if ctx.rank == 0:
        work = dist.all_reduce(t, group=group, async_op=True)
        start = time.monotonic()
        ctx.raises((RuntimeError,), ["Timeout", "allreduce"],
                   lambda: work.wait(datetime.timedelta(milliseconds=300)), "wait(300 ms)")
        ctx.expect(time.monotonic() - start < 5, "wait(timeout) took too long")
        ctx.expect(not work.is_completed(), "completed before the others joined")
        store.set("work_wait_timeout/rank0_timed_out", "1")
        work.wait()
    else:
        store.wait(["work_wait_timeout/rank0_timed_out"])
        dist.all_reduce(t, group=group)
    ctx.equal(t, torch.full((3,), float(sum(range(1, ctx.world + 1)))), "the late all_reduce")


@check("surface")
def desync_raises_on_every_rank(ctx):
    torch, dist = ctx.torch, ctx.dist
    group = dist.new_group(list(range(ctx.world)), timeout=datetime.timedelta(seconds=20))
    t = torch.ones(4)
    if ctx.rank == 0:
        call = lambda: dist.broadcast(t, src=0, group=group)  # noqa: E731
    else:
        call = lambda: dist.all_reduce(t, group=group)  # noqa: E731
    ctx.raises((RuntimeError,), ["broadcast", "allreduce", "different ops"], call,
               "mismatched collectives")


@check("surface")
def a_mismatch_of_sizes_is_a_desync_naming_both(ctx):
    """A 1 KiB allreduce on rank 0 against a 1 MiB one elsewhere: one inline, the others staged
    or adopted, all on the one path, so the sidecar compares them: a desync naming both."""
    torch, dist = ctx.torch, ctx.dist
    group = dist.new_group(list(range(ctx.world)), timeout=datetime.timedelta(seconds=5))
    t = torch.ones(256 if ctx.rank == 0 else 1 << 18)
    ctx.raises((RuntimeError,), ["different ops", "count=256", "count=262144"],
               lambda: dist.all_reduce(t, group=group), "mismatched allreduces")


@check("surface")
def timeout_raises_runtime_error_saying_timeout(ctx):
    torch, dist = ctx.torch, ctx.dist
    group = dist.new_group(list(range(ctx.world)), timeout=datetime.timedelta(seconds=2))
    if ctx.rank == 0:
        start = time.monotonic()
        error = ctx.raises((RuntimeError,), ["Timeout", "allreduce"],
                           lambda: dist.all_reduce(torch.ones(2), group=group), "lonely all_reduce")
        ctx.expect(time.monotonic() - start < 15, "the timeout took too long")
        if error is not None:
            ctx.expect(isinstance(error, TimeoutError) or "Timeout" in str(error), str(error))


@check("surface")
def staging_pool_is_reused(ctx):
    torch, dist = ctx.torch, ctx.dist
    from collectived.torch.backend import shared_session
    session = shared_session()
    dist.all_reduce(torch.ones(6001))  # staged (past the inline size, short of adoption's)
    registered = session.staging.registered_bytes()
    for i in range(30):
        t = torch.full((1 + 1000 * (i % 7),), 1.0)
        dist.all_reduce(t)
        ctx.equal(t, torch.full(t.shape, float(ctx.world)), f"all_reduce of {t.numel()}")
    ctx.expect(session.staging.registered_bytes() == registered,
               f"staging grew {registered} -> {session.staging.registered_bytes()}")


@check("surface")
def adopted_storages_stay_correct_through_views_and_in_place_ops(ctx):
    torch, dist = ctx.torch, ctx.dist
    from collectived.torch.backend import shared_session
    adopter = shared_session().adopter
    world, total = ctx.world, sum(range(1, ctx.world + 1))
    n = 1 << 16  # 256 KiB of float32: adopted (at least 64 KiB)
    adopted = adopter.adopted
    t = torch.arange(n, dtype=torch.float32) * (ctx.rank + 1)
    view = t[100:110]  # made before the storage moves: it must follow
    head = t.view(256, -1)[0]  # a view of another shape
    dist.all_reduce(t)
    expected = torch.arange(n, dtype=torch.float32) * total
    ctx.expect(t.is_shared(), "the tensor's storage was not moved into shared memory")
    ctx.expect(adopter.adopted == adopted + 1, f"adopted {adopter.adopted - adopted} storages")
    ctx.equal(t, expected, "adopted all_reduce")
    ctx.equal(view, expected[100:110], "a view made before adoption")
    ctx.expect(view.data_ptr() == t.data_ptr() + 400, "the view no longer aliases the tensor")
    ctx.equal(head, expected[:256], "a reshaped view")
    reused = adopter.reused
    t.mul_(2)  # the user keeps using it: in-place ops land in the shared memory
    view.fill_(1.0)
    dist.all_reduce(t)
    expected = expected * 2 * world
    expected[100:110] = world
    ctx.equal(t, expected, "all_reduce after in-place ops")
    ctx.expect(adopter.reused == reused + 1, "the second op did not reuse the registration")
    # A slice of an adopted storage (an offset into it) goes zero-copy too.
    tail = t[n // 2:]
    tail.fill_(float(ctx.rank))
    dist.all_reduce(tail)
    ctx.equal(tail, torch.full((n // 2,), float(sum(range(world)))), "a slice at an offset")
    # Freed, and a new storage maybe at the same address: registered anew, never confused.
    del t, view, head, tail
    for round_ in range(3):
        u = torch.full((n,), float(ctx.rank + round_))
        dist.all_reduce(u)
        ctx.equal(u, torch.full((n,), float(sum(range(world)) + world * round_)),
                  f"a fresh tensor, round {round_}")
    ctx.expect(adopter.registered_bytes() <= adopter.max_bytes, "over the adoption bound")


# -- the harness ---------------------------------------------------------------------------


def _meet(dist, key, world, timeout=60.0):
    store = dist.distributed_c10d._get_default_store()
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while int(store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ranks did not meet at {key}")
        time.sleep(0.005)


def report(name, ok, errors, seconds, skipped=None):
    print("@@RESULT " + json.dumps({"check": name, "ok": ok, "errors": errors,
                                    "seconds": round(seconds, 3), "skipped": skipped}),
          flush=True)


class Crash(Exception):
    pass


def exit_check(ctx, how):
    """The last rank goes away without destroying its process group ("exit": os._exit, no
    cleanup at all; "crash": an unhandled exception, the interpreter shuts down normally); the
    others' next op must raise naming it."""
    torch, dist = ctx.torch, ctx.dist
    lost = ctx.world - 1
    if ctx.rank == lost:
        sys.stdout.flush()
        if how == "crash":
            raise Crash("rank goes down on purpose")
        os._exit(0)
    time.sleep(0.2)
    start = time.monotonic()
    error = ctx.raises((RuntimeError,), [f"rank {lost}"],
                       lambda: dist.all_reduce(torch.ones(4)), "all_reduce after a rank exited")
    ctx.expect(time.monotonic() - start < 15, f"took {time.monotonic() - start:.1f} s")
    if error is not None:
        ctx.raises((RuntimeError,), [], lambda: dist.broadcast(torch.ones(4), src=0),
                   "later op")


def main():
    scenario, init_method, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(
        sys.argv[4])
    import torch
    import torch.distributed as dist
    import collectived.torch  # noqa: F401 - registers the backend

    start = time.monotonic()
    dist.init_process_group("collectived", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(
                                seconds=float(os.environ.get("WORKER_PG_TIMEOUT_S", "30"))))
    report("init_process_group", True, [], time.monotonic() - start)
    for name in checks_for(scenario):
        ctx = Ctx(torch, dist, rank, world)
        _meet(dist, f"meet/{name}", world)
        start = time.monotonic()
        skipped = None
        try:
            if name == "a_rank_that_exits_makes_the_others_raise_naming_it":
                exit_check(ctx, scenario.split("+")[-1])
            else:
                CHECKS[name](ctx)
        except Crash:
            raise
        except NotApplicable as reason:
            skipped = str(reason)
        except Exception as error:  # noqa: BLE001 - reported
            ctx.failures.append(f"rank {rank}: {type(error).__name__}: {error}\n"
                                + traceback.format_exc(limit=4))
        report(name, not ctx.failures, ctx.failures, time.monotonic() - start, skipped)
    if "+" not in scenario:
        _meet(dist, "meet/end", world)
        # Rank 0 may host the rendezvous store (env://, tcp://): it leaves last.
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.wait([f"left/{r}" for r in range(1, world)])
        dist.destroy_process_group()
        if rank != 0:
            store.set(f"left/{rank}", "1")
    print("@@DONE", flush=True)
    sys.stdout.flush()
    # Skip interpreter teardown: daemon threads of grpc make it slow.
    os._exit(0)


if __name__ == "__main__":
    main()
