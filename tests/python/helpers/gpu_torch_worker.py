"""One rank of the torch-on-CUDA checks (tests/python/test_gpu_torch.py): every rank's tensors on
cuda:0, served by one sidecar that combines them on the GPU.

Usage: gpu_torch_worker.py [expandable] INIT_METHOD RANK WORLD_SIZE. Prints one
``@@RESULT {"check": ..., "ok": ..., "errors": [...]}`` line per check. With ``expandable``
(run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) it runs EXPANDABLE_CHECKS instead:
the same ops on VMM memory, which the client shares as POSIX file descriptors.
"""

import datetime
import json
import sys
import time
import traceback


def check_allreduce_every_op(torch, dist, rank, world):
    errors = []
    ops = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
           "MAX": dist.ReduceOp.MAX}
    values = [float(r + 1) for r in range(world)]
    expected = {"SUM": sum(values), "PRODUCT": float(torch.tensor(values).prod()),
                "MIN": min(values), "MAX": max(values)}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        for name, op in ops.items():
            x = torch.full((1000,), rank + 1, dtype=dtype, device="cuda:0")
            dist.all_reduce(x, op=op)
            if not bool((x.float() == expected[name]).all()):
                errors.append(f"allreduce {name} {dtype}: got {x[:4].tolist()}, "
                              f"expected {expected[name]}")
    return errors


def check_async_op_is_ordered_after_the_stream(torch, dist, rank, world):
    """A kernel queued on the current stream just before the op must not race it."""
    errors = []
    for _ in range(10):
        x = torch.zeros(1 << 22, device="cuda:0")
        torch.cuda._sleep(10_000_000)  # keeps the stream busy: the add below runs late
        x.add_(rank + 1)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        total = world * (world + 1) / 2
        if not bool((x == total).all()):
            errors.append(f"async allreduce raced the stream: {x[:4].tolist()} != {total}")
    return errors


def check_kernels_queued_after_wait_neither_race_the_inputs_nor_miss_the_result(
        torch, dist, rank, world):
    """After work.wait(), a kernel on the current stream that overwrites the op's input must not
    reach what the op produced, and one that reads the op's output must see the result."""
    errors = []
    total = world * (world + 1) / 2
    for _ in range(10):
        inp = torch.full((1 << 20,), float(rank + 1), device="cuda:0")
        outs = [torch.empty_like(inp) for _ in range(world)]
        work = dist.all_gather(outs, inp, async_op=True)
        work.wait()
        inp.fill_(-1.0)
        for source, out in enumerate(outs):
            if not bool((out == source + 1).all()):
                errors.append(f"all_gather from rank {source} raced a later write of the input: "
                              f"{out[:4].tolist()}")
        x = torch.full((1 << 20,), float(rank + 1), device="cuda:0")
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        doubled = x * 2
        if not bool((doubled == 2 * total).all()):
            errors.append(f"a kernel after wait() missed the allreduce: {doubled[:4].tolist()}")
    return errors


SLEEP_CYCLES = 1_000_000_000  # a long kernel (about a second) queued before an op
_sleep_seconds = []  # how long it ran, once measured


def _sleep_kernel_seconds(torch):
    """How long a sleep kernel of SLEEP_CYCLES runs on this GPU, measured once from the CPU."""
    if not _sleep_seconds:
        torch.cuda.synchronize()
        start = time.monotonic()
        torch.cuda._sleep(SLEEP_CYCLES)
        torch.cuda.synchronize()
        _sleep_seconds.append(time.monotonic() - start)
    return _sleep_seconds[0]


def check_wait_orders_the_stream_without_waiting_for_the_op(torch, dist, rank, world):
    """c10d's NCCL semantics: work.wait() makes the current stream wait for the op; the CPU
    does not wait for the GPU work queued before it (here a long sleep kernel that produces the
    op's input) to run."""
    errors = []
    sleep_seconds = _sleep_kernel_seconds(torch)
    for _ in range(3):
        x = torch.zeros(1 << 20, device="cuda:0")
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        x.add_(rank + 1)
        work = dist.all_reduce(x, async_op=True)
        start = time.monotonic()
        work.wait()
        waited = time.monotonic() - start
        if waited > sleep_seconds / 2:
            errors.append(f"wait() took {waited:.3f} s behind a {sleep_seconds:.3f} s kernel: it "
                          "blocked the CPU until the op ran instead of ordering the stream")
        total = world * (world + 1) / 2
        if not bool((x == total).all()):
            errors.append(f"after wait() the stream read {x[:4].tolist()}, not {total}")
    return errors


def check_futures_complete_at_once_on_the_stream(torch, dist, rank, world):
    """ProcessGroupNCCL's futures: a CUDA op's get_future() is complete at once, without the CPU
    waiting for the GPU work queued before the op (a long sleep kernel producing its input); its
    callbacks run at once on the caller's thread, in the order the futures were asked for (DDP's
    hooks then issue their ops in the same order on every rank); a callback's value, and a
    stream that waits on the future, see the op's result; the caller's stream does not wait."""
    import threading
    errors = []
    sleep_seconds = _sleep_kernel_seconds(torch)
    tensors = [torch.zeros(1 << 18, device="cuda:0") for _ in range(3)]
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    for tensor in tensors:
        tensor.add_(rank + 1)
    start = time.monotonic()
    futures = [dist.all_reduce(t, async_op=True).get_future() for t in tensors]
    seen = []
    chained = [future.then(lambda f, i=i: (seen.append((i, threading.get_ident())),
                                           f.value()[0] * 2)[1])
               for i, future in enumerate(futures)]
    took = time.monotonic() - start
    if not all(future.done() for future in futures):
        errors.append("get_future() of a CUDA op was not complete at once (NCCL's is)")
    if took > sleep_seconds / 2:
        errors.append(f"issuing the ops and taking their futures took {took:.3f} s behind a "
                      f"{sleep_seconds:.3f} s kernel: the CPU waited for the GPU")
    if seen != [(i, threading.get_ident()) for i in range(3)]:
        errors.append(f"callbacks ran as {seen}, not at once, in order, on the caller's thread")
    total = world * (world + 1) / 2
    for i, future in enumerate(chained):
        value = future.wait()
        torch.cuda.current_stream().synchronize()
        if not bool((value == 2 * total).all()):
            errors.append(f"op {i}: the callback's value read {value[:4].tolist()}, not "
                          f"{2 * total}")
    # Taking a future does not make the caller's stream wait for the op (DDP takes its buckets'
    # futures while backward kernels are still to be queued): the op, issued on a side stream
    # behind a long kernel, is still running when a mark on the default stream is reached.
    side, x = torch.cuda.Stream(), torch.ones(1 << 18, device="cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        work = dist.all_reduce(x, async_op=True)
    future = work.get_future()
    mark = torch.cuda.Event()
    mark.record()
    start = time.monotonic()
    mark.synchronize()
    if time.monotonic() - start > sleep_seconds / 2:
        errors.append("get_future() made the caller's stream wait for the op (NCCL's does not)")
    value = future.wait()[0]
    torch.cuda.synchronize()
    if not bool((value == world).all()):
        errors.append(f"the side stream's op read {value[:4].tolist()}, not {world}")
    return errors


def check_back_to_back_ops_stay_in_stream_order(torch, dist, rank, world):
    """600 ops, each waited on with wait() and followed by a kernel on its result: more ops
    than a group has stream-signal words (256), so every word is reused."""
    x = torch.zeros(4096, device="cuda:0")
    for _ in range(600):
        x.add_(1)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        x.div_(world)  # every rank holds the same x: the mean is x itself
    torch.cuda.synchronize()
    if not bool((x == 600).all()):
        return [f"after 600 ordered ops x is {x[:4].tolist()}, not 600"]
    return []


def check_stream_signals_are_in_use(torch, dist, rank, world):
    """With COLLECTIVED_STREAM_WAIT=signal the CUDA collectives took the signal path (not the
    event path it falls back to where the driver refuses)."""
    x = torch.ones(16, device="cuda:0")
    signalled = []
    for _ in range(3):
        work = dist.all_reduce(x, async_op=True)
        signalled.append(work._nwork.has_stream_signal())
        work.wait()
    torch.cuda.synchronize()
    if not all(signalled):
        return [f"ops without a stream-signal word: {signalled} (the driver refused to wait on "
                f"one, or the session has no signal buffer)"]
    if not bool((x == world ** 3).all()):
        return [f"after 3 ordered allreduces x is {x[:4].tolist()}, not {world ** 3}"]
    return []


def check_allocations_reused_after_empty_cache(torch, dist, rank, world):
    errors = []
    for step in range(20):
        x = torch.full((4096 + step,), float(rank + step), device="cuda:0")
        dist.all_reduce(x)
        expected = sum(r + step for r in range(world))
        if not bool((x == expected).all()):
            errors.append(f"step {step}: {x[:4].tolist()} != {expected}")
        del x
        torch.cuda.empty_cache()
    return errors


def check_collectives_on_cuda(torch, dist, rank, world):
    errors = []
    x = torch.full((8,), float(rank), device="cuda:0")
    out = [torch.empty(8, device="cuda:0") for _ in range(world)]
    dist.all_gather(out, x)
    if [float(t[0]) for t in out] != [float(r) for r in range(world)]:
        errors.append(f"all_gather: {[t[0].item() for t in out]}")
    b = torch.full((8,), float(rank), device="cuda:0")
    dist.broadcast(b, src=world - 1)
    if float(b[0]) != world - 1:
        errors.append(f"broadcast: {b[0].item()}")
    inp = torch.arange(world * 2, dtype=torch.float32, device="cuda:0")
    rs = torch.empty(2, device="cuda:0")
    dist.reduce_scatter_tensor(rs, inp) if hasattr(dist, "reduce_scatter_tensor") else \
        dist._reduce_scatter_base(rs, inp)
    if rs.tolist() != [float(world * (2 * rank)), float(world * (2 * rank + 1))]:
        errors.append(f"reduce_scatter: {rs.tolist()}")
    dist.barrier()
    mixed = [torch.zeros(1)]
    try:
        dist.all_gather([torch.zeros(1, device="cuda:0") for _ in range(world)], mixed[0])
        errors.append("a CPU input with CUDA outputs was not refused")
    except (ValueError, RuntimeError) as error:
        if "one device" not in str(error):
            errors.append(f"mixed devices refused without naming them: {error}")
    return errors


def check_ddp_on_cuda_matches_one_process(torch, dist, rank, world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)).cuda()
    reference.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        batch = torch.randn(world * 8, 16, generator=generator).cuda()
        target = torch.randn(world * 8, 4, generator=generator).cuda()
        mine = slice(rank * 8, (rank + 1) * 8)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(batch[mine]), target[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(batch), target).backward()
        ref_opt.step()
    errors = []
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p, q, rtol=1e-4, atol=1e-5):
            errors.append(f"parameter {name} differs from one-process training by "
                          f"{(p - q).abs().max().item()}")
    return errors


def check_staged_results_are_copied_back_on_the_issuing_stream(torch, dist, rank, world):
    """A non-contiguous CUDA tensor goes through a contiguous stand-in; its result is copied
    back on the stream the op was issued from, so a side stream reading it right after wait()
    sees it (on the completion thread's default stream, a side stream would not wait for it)."""
    errors = []
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for step in range(20):
            buf = torch.zeros(256, 2 * world, device="cuda:0")
            out = buf[:, ::2]  # every other column: not contiguous
            out.copy_(torch.full((256, world), float(step + rank), device="cuda:0"))
            dist.all_reduce(out)
            total = out.sum().item()  # synchronizes the side stream only
            want = 256.0 * world * (world * step + world * (world - 1) / 2)
            if total != want:
                errors.append(f"step {step}: the side stream read a sum of {total}, not {want}")
    return errors


def check_ddp_with_the_powersgd_hook_on_cuda(torch, dist, rank, world):
    """DDP with PowerSGD's communication hook from step 2: its callbacks issue allreduces and
    wait for them inside the futures' callbacks (the backend completes futures on threads of
    their own). Lossy, so no reference: every rank ends with the same parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2, min_compression_rate=0.5)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(2 + rank)
    for _ in range(6):
        batch = torch.randn(8, 64, generator=generator).cuda()
        opt.zero_grad()
        ddp(batch).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    torch.cuda.synchronize()
    if not bool(torch.isfinite(flat).all()):
        return ["PowerSGD training gave parameters that are not finite"]
    if not torch.equal(low, high):
        return [f"ranks hold different parameters after PowerSGD training (by up to "
                f"{(high - low).abs().max().item()})"]
    return []


def check_expandable_memory_is_vmm(torch, dist, rank, world):
    """The run is meaningful: with expandable_segments:True a CUDA tensor is VMM memory (no
    legacy IPC handle), which the client shares as POSIX file descriptors."""
    import ctypes
    from collectived import cuda
    tensor = torch.ones(1024, device="cuda:0")
    error = ctypes.create_string_buffer(512)
    answer = cuda._library().collectived_cuda_is_vmm(tensor.data_ptr(), 0, error, len(error))
    if answer != 1:
        return [f"expandable-segments memory is not VMM memory here ({answer}: "
                f"{error.value.decode(errors='replace')})"]
    dist.all_reduce(tensor)
    if not bool((tensor == world).all()):
        return [f"allreduce of VMM memory: got {tensor[:4].tolist()}, expected {world}"]
    return []


def check_allreduce_across_segments(torch, dist, rank, world):
    """Tensors larger than one 20 MiB segment span several physical allocations (mapped
    contiguously by the sidecar), at offsets that do not start a segment; steady-state ops
    reuse the registrations."""
    errors = []
    keep = torch.empty(3 * 1024 * 1024 + 17, device="cuda:0")  # pushes the next off a segment start
    for elements, dtype in ((12 * 1024 * 1024, torch.float32), (30 * 1024 * 1024, torch.bfloat16),
                            (7 * 1024 * 1024 + 3, torch.int64)):
        x = torch.full((elements,), rank + 1, dtype=dtype, device="cuda:0")
        x[-1] = 2 * (rank + 1)
        for step in range(3):
            y = x.clone()
            dist.all_reduce(y)
            expected = sum(r + 1 for r in range(world))
            if not bool((y[:-1].float() == expected).all()) or float(y[-1]) != 2 * expected:
                errors.append(f"{elements} x {dtype} step {step}: got {y[:2].tolist()} ... "
                              f"{y[-2:].tolist()}, expected {expected} ... {2 * expected}")
    del keep
    return errors


EXPANDABLE_CHECKS = [check_expandable_memory_is_vmm, check_allreduce_every_op,
                     check_allreduce_across_segments, check_allocations_reused_after_empty_cache,
                     check_async_op_is_ordered_after_the_stream,
                     check_ddp_on_cuda_matches_one_process]

CHECKS = [check_allreduce_every_op, check_async_op_is_ordered_after_the_stream,
          check_kernels_queued_after_wait_neither_race_the_inputs_nor_miss_the_result,
          check_wait_orders_the_stream_without_waiting_for_the_op,
          check_futures_complete_at_once_on_the_stream,
          check_allocations_reused_after_empty_cache, check_collectives_on_cuda,
          check_back_to_back_ops_stay_in_stream_order, check_ddp_on_cuda_matches_one_process,
          check_staged_results_are_copied_back_on_the_issuing_stream,
          check_ddp_with_the_powersgd_hook_on_cuda]

# COLLECTIVED_STREAM_WAIT=signal: the same checks, the trainers' streams waiting on words.
SIGNAL_CHECKS = [check_stream_signals_are_in_use] + CHECKS


def check_cuda_ops_in_flight_together_take_the_one_path(torch, dist, rank, world):
    """A CUDA allreduce, broadcast, allgather into a tensor and reduce-scatter of a tensor in
    flight together, through the process's one native session (its CUDA group joins at the
    first one)."""
    x = torch.full((1024,), float(rank + 1), device="cuda:0")
    b = torch.full((4,), float(rank), device="cuda:0")
    gathered = torch.zeros(2 * world, device="cuda:0")
    share = torch.zeros(2, device="cuda:0")
    whole = torch.arange(2.0 * world, device="cuda:0") + rank
    c10d = dist.distributed_c10d
    # torch 2.x's names, else 1.13's.
    all_gather = getattr(dist, "all_gather_into_tensor", None) or c10d._all_gather_base
    reduce_scatter = getattr(dist, "reduce_scatter_tensor", None) or c10d._reduce_scatter_base
    works = {"all_reduce": dist.all_reduce(x, async_op=True),
             "broadcast": dist.broadcast(b, src=world - 1, async_op=True),
             "all_gather_into_tensor": all_gather(
                 gathered, torch.full((2,), float(rank), device="cuda:0"), async_op=True),
             "reduce_scatter_tensor": reduce_scatter(share, whole, async_op=True)}
    for work in works.values():
        work.wait()
    torch.cuda.synchronize()
    group = c10d._get_default_group()
    errors = [f"{op} returned a {type(work).__name__}" for op, work in works.items()
              if type(work).__name__ != "Work"]
    if group._cuda_group is None or group._cuda_group[1] != 0:
        errors.append(f"no CUDA group on cuda:0 after CUDA ops: {group._cuda_group}")
    if float(x[0]) != sum(r + 1 for r in range(world)):
        errors.append(f"allreduce gave {float(x[0])}")
    if b.tolist() != [float(world - 1)] * 4:
        errors.append(f"broadcast gave {b.tolist()}")
    if gathered.tolist() != [float(r) for r in range(world) for _ in range(2)]:
        errors.append(f"allgather into a tensor gave {gathered.tolist()}")
    ranks = sum(range(world))
    if share.tolist() != [2.0 * rank * world + ranks, (2.0 * rank + 1) * world + ranks]:
        errors.append(f"reduce-scatter of a tensor gave {share.tolist()}")
    return errors


def check_point_to_point_mixes_with_collectives(torch, dist, rank, world):
    """Sends and receives mixed with collectives as NCCL allows them: neither waits for the
    other. Rank 0 posts a receive, then an allreduce, which rank 1 issues (and waits for) before
    its send; then rank 0 issues an allreduce and a send, which rank 1 receives (blocking)
    before its allreduce. Ordering them one after the other would make each pair wait for the
    other until the group's timeout."""
    x = torch.ones(256, device="cuda:0")
    t = torch.full((64,), float(rank), device="cuda:0")
    errors = []
    if world > 1 and rank == 0:
        received = dist.irecv(t, src=1)
        dist.all_reduce(x)
        received.wait()
        torch.cuda.synchronize()
        if t.tolist() != [1.0] * 64:
            errors.append(f"the receive behind an allreduce gave {t.tolist()[:4]}...")
        reduced = dist.all_reduce(x, async_op=True)
        dist.send(torch.full((64,), 7.0, device="cuda:0"), dst=1)
        reduced.wait()
    elif world > 1 and rank == 1:
        dist.all_reduce(x)
        dist.send(t, dst=0)
        got = torch.zeros(64, device="cuda:0")
        dist.recv(got, src=0)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if got.tolist() != [7.0] * 64:
            errors.append(f"the receive before an allreduce gave {got.tolist()[:4]}...")
    else:
        dist.all_reduce(x)
        dist.all_reduce(x)
    torch.cuda.synchronize()
    if x.tolist() != [float(world * world)] * 256:
        errors.append(f"the allreduces gave {x.tolist()[:4]}...")
    return errors


# Every path runs these too.
CHECKS += [check_cuda_ops_in_flight_together_take_the_one_path,
           check_point_to_point_mixes_with_collectives]
SIGNAL_CHECKS += CHECKS[-2:]


def main():
    args = sys.argv[1:]
    checks = CHECKS
    if args[0] == "expandable":
        checks, args = EXPANDABLE_CHECKS, args[1:]
    elif args[0] == "signal":
        checks, args = SIGNAL_CHECKS, args[1:]
    init_method, rank, world = args[0], int(args[1]), int(args[2])
    import torch
    import torch.distributed as dist
    import collectived.torch  # noqa: F401 - registers the backend

    torch.cuda.set_device(0)
    dist.init_process_group("collectived", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    for fn in checks:
        start = time.monotonic()
        try:
            errors = fn(torch, dist, rank, world)
        except Exception:  # noqa: BLE001 - reported as the check's failure
            errors = [traceback.format_exc()]
        print("@@RESULT " + json.dumps({"check": fn.__name__, "ok": not errors, "errors": errors,
                                        "seconds": round(time.monotonic() - start, 3)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
