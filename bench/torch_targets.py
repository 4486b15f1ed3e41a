#!/usr/bin/python3
"""The data plane's targets: allreduce through torch.distributed, "collectived" against PyTorch's
gloo backend in the same run.

Cases (each one rank per process, float32, blocking dist.all_reduce in a loop):
  - 8 B on 2 and 4 ranks of one sidecar: latency per op (p50, p99);
  - 32 MiB on 4 ranks of one sidecar: bus bandwidth (nccl-tests: 2 (n-1)/n x bytes / time);
  - 2 sidecars x 1 rank: 32 MiB bus bandwidth and 8 B latency.
Every case runs --rounds rounds, each round both backends one after the other (alternating which
goes first); the figure of a round is the median over its timed ops (for latency, also the 99th
percentile), and the table shows the median over rounds and the ratio collectived / gloo.

    /usr/bin/python3 bench/torch_targets.py --build-dir build [--rounds 3] [--iters N]

Printed, not asserted: this is how the issue's targets are checked. The latency cases end with
their floors on this machine (a pipe round trip between two processes, a loopback TCP round
trip) and how many floors each backend's p50 is. Every rank runs with one
intra-op thread; on a machine with fewer cores than ranks the figures include CPU contention,
equally for both backends.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from ddp_bench import Sidecar, locate_build, percentile, run_ranks  # noqa: E402

CASES = [
    # name, ranks, sidecars, bytes, what is measured
    ("8 B, 2 ranks, 1 sidecar", 2, 1, 8, "latency"),
    ("8 B, 4 ranks, 1 sidecar", 4, 1, 8, "latency"),
    ("32 MiB, 4 ranks, 1 sidecar", 4, 1, 32 << 20, "busbw"),
    ("32 MiB, 2 sidecars x 1 rank", 2, 2, 32 << 20, "busbw"),
    ("8 B, 2 sidecars x 1 rank", 2, 2, 8, "latency"),
]


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = args.backend
    if backend.startswith("collectived"):
        import collectived.torch  # noqa: F401 - registers the backend
        backend = "collectived"
    dist.init_process_group(backend, init_method="env://", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=120))
    tensor = torch.ones(max(1, args.bytes // 4), dtype=torch.float32)
    times = []
    for i in range(args.warmup + args.iters):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            times.append(elapsed)
        tensor.fill_(1.0)  # keep the values bounded (and the tensor in use, as training does)
    store = dist.distributed_c10d._get_default_store()
    print("@@TIMES " + json.dumps({"rank": args.rank, "times": times}), flush=True)
    if args.rank == 0:  # rank 0 hosts the store (env://): it leaves last
        store.wait([f"left/{r}" for r in range(1, args.world)])
    else:
        store.set(f"left/{args.rank}", "1")
    os._exit(0)


def run_job(args, backend, world, sidecars, nbytes, iters, warmup):
    # "collectived-staged": adoption off, every tensor copied in and out of the staging pool.
    env = {"COLLECTIVED_TORCH_ADOPT_MAX_BYTES": "0"} if backend == "collectived-staged" else None
    records = run_ranks(HERE, ["--backend", backend, "--bytes", str(nbytes), "--iters",
                               str(iters), "--warmup", str(warmup)],
                        world, sidecars, args.python_path, args.job_timeout,
                        f"{backend} {world} ranks {nbytes} B", env)
    # An op lasts as long as its slowest rank.
    return [max(r["times"][i] for r in records) for i in range(iters)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get(
        "COLLECTIVED_BUILD_DIR", str(HERE.parents[1] / "build")))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=0,
                        help="timed ops per job (default: 400 small, 20 large)")
    parser.add_argument("--job-timeout", type=float, default=300)
    parser.add_argument("--staged-too", action="store_true",
                        help="also run collectived with adoption off (tensors staged)")
    parser.add_argument("--cases", default="",
                        help="comma-separated indexes into the case list (default: all)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    binary, args.python_path = locate_build(args.build_dir)
    cases = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    tmp = tempfile.TemporaryDirectory(prefix="tgt-")
    sidecars = [Sidecar(binary, tmp.name, f"node{i}") for i in range(2)]
    rows = []
    try:
        for sidecar in sidecars:
            sidecar.wait_ready()
        import torch
        print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rounds} rounds",
              flush=True)
        for name, world, nsidecars, nbytes, kind in cases:
            iters = args.iters or (400 if nbytes <= 4096 else 20)
            warmup = max(5, iters // 10)
            backends = ["collectived", "gloo"] + (["collectived-staged"] if args.staged_too else [])
            figures = {b: [] for b in backends}
            for round_ in range(args.rounds):
                order = backends if round_ % 2 == 0 else list(reversed(backends))
                for backend in order:
                    times = run_job(args, backend, world, sidecars[:nsidecars], nbytes, iters,
                                    warmup)
                    if kind == "latency":
                        figures[backend].append((percentile(times, 50) * 1e6,
                                                 percentile(times, 99) * 1e6))
                    else:
                        factor = 2.0 * (world - 1) / world
                        p50 = percentile(times, 50)
                        figures[backend].append((factor * nbytes / p50 / 1e9,
                                                 factor * nbytes / percentile(times, 99) / 1e9))
            summary = {b: (statistics.median(f[0] for f in v), statistics.median(f[1] for f in v))
                       for b, v in figures.items()}
            rows.append((name, kind, summary, figures))
            print(f"  {name}: done", file=sys.stderr, flush=True)
    finally:
        for sidecar in sidecars:
            sidecar.stop()
        tmp.cleanup()

    print()
    staged = "collectived-staged" in rows[0][2] if rows else False
    print(f"{'case':<30} {'figure':<22} {'collectived':>12} {'gloo':>12} {'ratio':>7}" +
          (f" {'staged':>10} {'ratio':>7}" if staged else ""))
    for name, kind, summary, figures in rows:
        ours, gloo = summary["collectived"], summary["gloo"]
        old = summary.get("collectived-staged")
        labels = (("p50 latency (us)", "p99 latency (us)") if kind == "latency" else
                  ("busbw at p50 (GB/s)", "busbw at p99 (GB/s)"))
        digits = 1 if kind == "latency" else 2
        for i, label in enumerate(labels):
            line = (f"{name if i == 0 else '':<30} {label:<22} {ours[i]:>12.{digits}f} "
                    f"{gloo[i]:>12.{digits}f} {ours[i] / gloo[i]:>6.2f}x")
            if old is not None:
                line += f" {old[i]:>10.{digits}f} {old[i] / gloo[i]:>6.2f}x"
            print(line)
    print("\nratio: collectived / gloo, medians over rounds (latency: lower is better; bus "
          "bandwidth: higher is better). Per round:")
    for name, kind, summary, figures in rows:
        print(f"  {name}: " + "; ".join(
            f"{b} " + ", ".join(f"{f[0]:.1f}" if kind == "latency" else f"{f[0]:.2f}"
                                for f in v) for b, v in figures.items()))
    print_floors(rows)


def round_trips(kind, count=2000):
    """Microseconds per round trip of one byte between this process and a forked child: over a
    pair of pipes ("pipe": two wake-ups of a blocked process, what a futex round trip costs a
    trainer and its sidecar) or over loopback TCP ("tcp": what two sidecars pay per message
    exchange). The median of 5 runs of ``count``."""
    import socket
    runs = []
    for _ in range(5):
        if kind == "pipe":
            down_r, down_w = os.pipe()
            up_r, up_w = os.pipe()
            send, recv = (lambda b: os.write(down_w, b)), (lambda: os.read(up_r, 1))
            child_send, child_recv = (lambda b: os.write(up_w, b)), (lambda: os.read(down_r, 1))
            closers = [down_r, down_w, up_r, up_w]
        else:
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            near = socket.create_connection(listener.getsockname())
            far, _ = listener.accept()
            for end in (near, far):
                end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send, recv = near.sendall, (lambda: near.recv(1))
            child_send, child_recv = far.sendall, (lambda: far.recv(1))
            closers = [listener, near, far]
        pid = os.fork()
        if pid == 0:
            for _ in range(count):
                child_recv()
                child_send(b"y")
            os._exit(0)
        start = time.perf_counter()
        for _ in range(count):
            send(b"x")
            recv()
        runs.append((time.perf_counter() - start) / count * 1e6)
        os.waitpid(pid, 0)
        for closer in closers:
            os.close(closer) if isinstance(closer, int) else closer.close()
    return statistics.median(runs)


def print_floors(rows):
    """Each latency case against its floor: an allreduce through one sidecar costs each trainer
    at least a round trip of wake-ups with the sidecar (pipe), through two sidecars also a
    loopback TCP round trip between them. How many floors the p50 is says how far the path is
    from it (the rest: the trainer's issue, the ring, the sidecar's work, the completion)."""
    pipe, tcp = round_trips("pipe"), round_trips("tcp")
    print(f"\nfloors on this machine (medians of 5 runs of 2000 one-byte round trips between two "
          f"processes): a pipe round trip {pipe:.1f} us (two wake-ups, as a futex round trip), a "
          f"loopback TCP round trip {tcp:.1f} us")
    for name, kind, summary, _ in rows:
        if kind != "latency":
            continue
        floor = pipe + (tcp if "2 sidecars" in name else 0.0)
        print(f"  {name}: collectived p50 {summary['collectived'][0]:.1f} us = "
              f"{summary['collectived'][0] / floor:.1f}x its floor ({floor:.1f} us), gloo "
              f"{summary['gloo'][0] / floor:.1f}x")


if __name__ == "__main__":
    main()
