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
trip) and how many floors each backend's p50 is, and with collectived's p50 split between rank
0's sidecar (the ranks' skew, the agreement, the data phase, from its flight records) and the
rest (the trainers' issue, the ring and the completion's way back). Every rank runs with one
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
    record = {"rank": args.rank, "times": times}
    if backend == "collectived" and args.rank == 0:
        record["stages"] = sidecar_stages(dist, args.iters)
    print("@@TIMES " + json.dumps(record), flush=True)
    if args.rank == 0:  # rank 0 hosts the store (env://): it leaves last
        store.wait([f"left/{r}" for r in range(1, args.world)])
    else:
        store.set(f"left/{args.rank}", "1")
    os._exit(0)


def sidecar_stages(dist, iters):
    """Where the timed ops' time went at rank 0's sidecar, from its flight records of the group
    (the last `iters` allreduces it keeps): medians, in microseconds, of the first rank's arrival
    to the last one's ("arrivals": the ranks' skew), of the last arrival to the data phase
    ("agreement"), of the data phase to completion ("data"), and of the whole ("sidecar"); or
    {"error": ...} where the records cannot be read."""
    from collectived import Client
    try:
        group = dist.distributed_c10d._get_default_group().sidecar_group
        with Client(os.environ.get("COLLECTIVED_ADDRESS")) as admin:  # a session for asking only
            records = [r for r in admin.flight_recorder(group=group, limit=iters)
                       if r.state == "completed" and r.data_started_us >= 0]
    except Exception as error:  # noqa: BLE001 - a figure, not the benchmark, is lost
        return {"error": str(error)[:200]}
    if not records:
        return {"error": "no completed records"}
    last = [max(r.rank_arrival_us) for r in records]
    return {"arrivals": statistics.median(last),
            "agreement": statistics.median(r.data_started_us - a for r, a in zip(records, last)),
            "data": statistics.median(r.duration_us - r.data_started_us for r in records),
            "sidecar": statistics.median(r.duration_us for r in records)}


def run_job(args, backend, world, sidecars, nbytes, iters, warmup):
    # "collectived-staged": adoption off, every tensor copied in and out of the staging pool.
    env = {"COLLECTIVED_TORCH_ADOPT_MAX_BYTES": "0"} if backend == "collectived-staged" else None
    records = run_ranks(HERE, ["--backend", backend, "--bytes", str(nbytes), "--iters",
                               str(iters), "--warmup", str(warmup)],
                        world, sidecars, args.python_path, args.job_timeout,
                        f"{backend} {world} ranks {nbytes} B", env)
    # An op lasts as long as its slowest rank.
    times = [max(r["times"][i] for r in records) for i in range(iters)]
    return times, next((r["stages"] for r in records if "stages" in r), None)


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
    stage_rounds = {}  # case -> the collectived jobs' sidecar_stages, one per round
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
                    times, stages = run_job(args, backend, world, sidecars[:nsidecars], nbytes,
                                            iters, warmup)
                    if stages is not None:
                        stage_rounds.setdefault(name, []).append(stages)
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
    print_stages(rows, stage_rounds)


def print_stages(rows, stage_rounds):
    """Each latency case's p50 split between rank 0's sidecar (its flight records: the ranks'
    skew, the agreement, the data phase) and the rest (the trainers' issue, the ring, the
    completion's way back to the trainer), medians over rounds."""
    print("\nwhere collectived's p50 went (rank 0's sidecar, medians over rounds, us):")
    for name, kind, summary, _ in rows:
        rounds = [r for r in stage_rounds.get(name, []) if "error" not in r]
        if kind != "latency":
            continue
        if not rounds:
            errors = [r.get("error") for r in stage_rounds.get(name, [])]
            print(f"  {name}: no flight records ({errors[:1]})")
            continue
        stage = {k: statistics.median(r[k] for r in rounds)
                 for k in ("arrivals", "agreement", "data", "sidecar")}
        p50 = summary["collectived"][0]
        print(f"  {name}: p50 {p50:.1f}; at the sidecar {stage['sidecar']:.1f} (ranks' skew "
              f"{stage['arrivals']:.1f}, agreement {stage['agreement']:.1f}, data and "
              f"completion {stage['data']:.1f}); outside it (issue, ring, completion to the "
              f"trainer) {p50 - stage['sidecar']:.1f}")


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
