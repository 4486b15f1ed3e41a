#!/usr/bin/python3
"""PyTorch's own Gloo backend, measured like bench/collectives_bench.cc, for comparison.

Runs allreduce, allgather, broadcast and reduce_scatter of float32 through torch.distributed
with backend "gloo": 4 processes (torch.multiprocessing spawn) on loopback, rendezvous through a
FileStore in a fresh temporary directory. Prints the same nccl-tests style tables as
collectives_bench (same sizes, iteration counts, checks and columns): time = mean per blocking op,
the maximum over the ranks; algbw = size / time; busbw = algbw x the nccl-tests factor.

torch 1.13's Gloo has no all_gather_into_tensor (_allgather_base) and no reduce_scatter at all:
allgather then falls back to dist.all_gather into views of one output tensor (noted in the table
header), and reduce_scatter rows say "n/a". Newer torch versions use the tensor forms when they
work.

Usage: /usr/bin/python3 bench/torch_gloo_bench.py [--quick] [--sizes LIST|MIN:MAX[:F]]
           [--iters N] [--warmup N] [--ops allreduce,allgather,broadcast,reduce_scatter]
           [--ranks N]
Exit status: 0 when every op that can run succeeded and every check passed.
"""

import argparse
import os
import sys
import tempfile
import time

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
BUS_FACTOR = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def parse_bytes(text):
    units = {"": 1, "B": 1, "K": 1 << 10, "k": 1 << 10, "KiB": 1 << 10, "M": 1 << 20,
             "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0 or text[digits:] not in units:
        raise argparse.ArgumentTypeError(f"bad size '{text}'")
    return int(text[:digits]) * units[text[digits:]]


def parse_sizes(text):
    """'8,1K,32M' or 'MIN:MAX[:FACTOR]' (MAX always included), as collectives_bench."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise argparse.ArgumentTypeError(f"bad --sizes '{text}'")
        low, high = parse_bytes(parts[0]), parse_bytes(parts[1])
        factor = parse_bytes(parts[2]) if len(parts) == 3 else 4
        if low == 0 or high < low or factor < 2:
            raise argparse.ArgumentTypeError(f"bad --sizes '{text}'")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= factor
        if sizes[-1] != high:
            sizes.append(high)
        return sizes
    return [parse_bytes(part) for part in text.split(",")]


def iters_for(nbytes, args):
    if args.iters:
        return args.iters
    iters = 50 if nbytes <= 256 << 10 else 20 if nbytes <= 4 << 20 else 10
    return max(3, iters // 4) if args.quick else iters


def warmup_for(nbytes, args):
    if args.warmup is not None:
        return args.warmup
    if args.quick:
        return 1
    return 5 if nbytes <= 4 << 20 else 2


def shape_for(op, nbytes, n):
    """(count shown in the table, per-rank part), as collectives_bench's ShapeFor."""
    elements = max(1, nbytes // 4)
    if op in ("allgather", "reduce_scatter"):
        part = max(1, elements // n)
        return part * n, part
    return elements, elements


def values(torch, rank, count, start=0):
    """(rank + 1) * (i % 13 + 1): exact in float32 when summed over a few ranks."""
    i = torch.arange(start, start + count, dtype=torch.int64)
    return ((i % 13 + 1) * (rank + 1)).to(torch.float32)


def sum_of_values(torch, n, count, start=0):
    i = torch.arange(start, start + count, dtype=torch.int64)
    return ((i % 13 + 1) * (n * (n + 1) // 2)).to(torch.float32)


def header(op, n, note):
    redop = ", sum" if op in ("allreduce", "reduce_scatter") else ""
    print(f"\n# torch-gloo | {op} | {n}procs | torch {TORCH_VERSION} Gloo, {n} processes on "
          f"loopback, float32{redop}, {n} ranks")
    print(f"# op: {note}; time = mean per op (max over ranks); busbw factor "
          f"{BUS_FACTOR[op](n):.3f}")
    cols = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "iters")
    units = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "")
    for row in (cols, units):
        print("#%11s %13s %9s %7s %5s %11s %9s %9s %7s %6s" % row)
    sys.stdout.flush()


TORCH_VERSION = "?"


def worker(rank, n, store_path, args, sizes):
    import torch
    import torch.distributed as dist

    global TORCH_VERSION
    TORCH_VERSION = torch.__version__
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=n)
    failures = 0
    for op in args.ops:
        # Which call runs this op here (every rank finds the same answer).
        note = {"allreduce": "all_reduce", "broadcast": "broadcast (root 0)"}.get(op)
        mode = op
        if op == "allgather":
            mode, note = "allgather_into_tensor", "all_gather_into_tensor"
            if not hasattr(dist, "all_gather_into_tensor") or not _works(
                    lambda: dist.all_gather_into_tensor(torch.empty(n), torch.ones(1))):
                mode = "allgather_list"
                note = ("all_gather into views of one output tensor (this torch's Gloo has no "
                        "all_gather_into_tensor)")
        if op == "reduce_scatter":
            mode, note = "reduce_scatter_tensor", "reduce_scatter_tensor"
            if not hasattr(dist, "reduce_scatter_tensor") or not _works(
                    lambda: dist.reduce_scatter_tensor(torch.empty(1), torch.ones(n))):
                mode, note = "n/a", "reduce_scatter: not supported by this torch's Gloo"
        if rank == 0:
            header(op, n, note)
        for nbytes in sizes:
            count, part = shape_for(op, nbytes, n)
            redop = "sum" if op in ("allreduce", "reduce_scatter") else "none"
            root = 0 if op == "broadcast" else -1
            prefix = "%12d %13d %9s %7s %5d" % (count * 4, count, "float", redop, root)
            if mode == "n/a":
                if rank == 0:
                    print(prefix + " %11s %9s %9s %7s %6s" % ("n/a", "n/a", "n/a", "-", "-"))
                continue
            inp = torch.empty(part if op == "allgather" else count, dtype=torch.float32)
            out = torch.empty(count if op == "allgather" else part, dtype=torch.float32)
            views = list(out.chunk(n))

            if mode == "allreduce":
                def run():
                    dist.all_reduce(inp)
            elif mode == "broadcast":
                def run():
                    dist.broadcast(inp, src=0)
            elif mode == "allgather_into_tensor":
                def run():
                    dist.all_gather_into_tensor(out, inp)
            elif mode == "allgather_list":
                def run():
                    dist.all_gather(views, inp)
            else:
                def run():
                    dist.reduce_scatter_tensor(out, inp)

            # Checked op.
            if op == "allgather":
                inp.copy_(values(torch, rank, part))
                out.fill_(-1)
            elif op == "broadcast":
                inp.copy_(values(torch, 0, count) if rank == 0 else torch.full((count,), -1.0))
            else:
                inp.copy_(values(torch, rank, count))
                out.fill_(-1)
            error = None
            try:
                run()
            except RuntimeError as e:
                error = str(e).splitlines()[0]
            wrong = 0
            if error is None:
                if op == "allreduce":
                    expected = sum_of_values(torch, n, count)
                    wrong = int((inp != expected).sum())
                elif op == "broadcast":
                    wrong = int((inp != values(torch, 0, count)).sum())
                elif op == "allgather":
                    expected = torch.cat([values(torch, r, part) for r in range(n)])
                    wrong = int((out != expected).sum())
                else:
                    wrong = int((out != sum_of_values(torch, n, part, rank * part)).sum())
                if op == "allreduce":
                    inp.zero_()  # the timed ops would otherwise grow the values without bound
                for _ in range(warmup_for(nbytes, args)):
                    run()
                iters = iters_for(nbytes, args)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    run()
                seconds = (time.perf_counter() - start) / iters
            stats = torch.tensor([0.0 if error else seconds, float(wrong), 1.0 if error else 0.0],
                                 dtype=torch.float64)
            gathered = [torch.empty_like(stats) for _ in range(n)]
            dist.all_gather(gathered, stats)
            if rank == 0:
                if error or any(g[2] > 0 for g in gathered):
                    print(prefix + "   error: " + (error or "on another rank"))
                    failures += 1
                else:
                    seconds = max(float(g[0]) for g in gathered)
                    wrong = int(sum(float(g[1]) for g in gathered))
                    algbw = count * 4 / seconds / 1e9
                    print(prefix + " %11.1f %9.3f %9.3f %7d %6d" % (
                        seconds * 1e6, algbw, algbw * BUS_FACTOR[op](n), wrong,
                        iters_for(nbytes, args)))
                    failures += wrong > 0
                sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        sys.exit(1)


def _works(call):
    try:
        call()
        return True
    except RuntimeError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=parse_sizes)
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    args.ops = args.ops.split(",")
    for op in args.ops:
        if op not in OPS:
            parser.error(f"unknown op '{op}' ({', '.join(OPS)})")
    sizes = args.sizes or parse_sizes("8:32M:8" if args.quick else "8:64M:4")

    import torch
    import torch.multiprocessing as mp

    print(f"# torch_gloo_bench: torch {torch.__version__}, backend gloo, {args.ranks} processes "
          f"on loopback, float32, {len(sizes)} sizes {sizes[0]} B .. {sizes[-1]} B, blocking ops")
    sys.stdout.flush()
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="torch-gloo-bench-") as tmp:
        try:
            mp.spawn(worker, args=(args.ranks, os.path.join(tmp, "store"), args, sizes),
                     nprocs=args.ranks, join=True)
        except Exception as e:  # ProcessExitedException, ProcessRaisedException
            print(f"torch_gloo_bench: a rank failed: {e}", file=sys.stderr)
            return 1
    print(f"\n# total time {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
