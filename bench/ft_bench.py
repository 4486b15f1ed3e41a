#!/usr/bin/python3
"""Fault tolerance's figures (docs/fault-tolerance.md): how long the survivors of a shrinking
group stop when a trainer is SIGKILLed, and what shrinking costs when nothing fails.

  - Time to resume: S sidecars x R ranks on loopback, every rank a process issuing allreduces of
    8 floats back to back on a group created with fault_tolerance="shrink"; once every rank ran
    --warm-ops ops, the last rank is SIGKILLed. The figure of a round is the time from the kill
    to the moment the last survivor completed its first op after it (and the first survivor, and
    the survivors' op gap before the kill, for scale). Layouts: 2 x 2 and 4 x 2 by default.
  - Overhead with no failure: the same loop with fault tolerance on and off, interleaved in one
    run (microseconds per op, median over rounds): every op of a shrinking group goes through
    the epoch's routing.

    PYTHONPATH=build/python /usr/bin/python3 bench/ft_bench.py --build-dir build [--rounds 5]

Printed, not asserted. Not measured here (yet): a lost sidecar (not survived yet), a DDP job's
goodput under repeated failures, torchrun's elastic restart as the anchor.
"""

import argparse
import datetime
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from ddp_bench import Sidecar, locate_build  # noqa: E402

PYTHON = "/usr/bin/python3"


def trainer(args):
    """One rank: joins the group, then runs --ops allreduces (unless it is killed), and writes
    the wall-clock time of each op's completion to its output file."""
    import numpy as np

    from collectived import Client
    client = Client(args.address)
    client.create_group(args.group, args.rank, args.world, store_address=args.store,
                        timeout=60, fault_tolerance=args.tolerance)
    tensor = np.ones(8, dtype=np.float32)
    done = []
    ready = pathlib.Path(args.out + ".ready")
    for _ in range(args.ops):
        client.allreduce(args.group, tensor)
        done.append(time.time())
        if len(done) == args.warm_ops:
            ready.touch()
    with open(args.out, "w") as out:
        json.dump(done, out)
    client.close()


def run_round(args, sidecars, ranks_per_sidecar, tolerance, kill, tmp, index):
    """One job; returns (kill time or None, {rank: completion times}) of its survivors."""
    world = len(sidecars) * ranks_per_sidecar
    group = f"ft-bench-{index}-{tolerance}"
    procs = []
    outs = []
    for rank in range(world):
        side = sidecars[rank // ranks_per_sidecar]
        out = os.path.join(tmp, f"{group}.rank{rank}.json")
        outs.append(out)
        env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [PYTHON, str(HERE), "--trainer", "--address", side.address, "--group", group,
             "--rank", str(rank), "--world", str(world), "--store", f"127.0.0.1:{sidecars[0].port}",
             "--tolerance", tolerance, "--out", out, "--warm-ops", str(args.warm_ops),
             "--ops", str(args.ops)], env=env))
    killed_at = None
    if kill:
        deadline = time.time() + 60
        while not all(os.path.exists(o + ".ready") for o in outs):
            if time.time() > deadline:
                raise RuntimeError("the ranks did not warm up within 60 s")
            time.sleep(0.01)
        time.sleep(0.2)
        killed_at = time.time()
        procs[-1].send_signal(signal.SIGKILL)
    survivors = {}
    for rank, proc in enumerate(procs):
        code = proc.wait(300)
        if kill and rank == world - 1:
            continue
        if code != 0:
            raise RuntimeError(f"rank {rank} exited with {code}")
        with open(outs[rank]) as result:
            survivors[rank] = json.load(result)
    return killed_at, survivors


def resume_figures(killed_at, survivors):
    """In milliseconds: when every survivor resumed (the latest, over survivors, of the end of
    its longest pause between two completed ops after the kill, from the kill), the earliest
    survivor's, and the survivors' median op gap before the kill. An op already in flight at the
    kill may complete before the pause: the pause is the group's change of epoch."""
    resumed = []
    gaps = []
    for times in survivors.values():
        after = [i for i, t in enumerate(times) if t > killed_at and i > 0]
        if not after:
            raise RuntimeError("a survivor completed no op after the kill")
        longest = max(after, key=lambda i: times[i] - times[i - 1])
        resumed.append(times[longest] - killed_at)
        before = [t for t in times if t <= killed_at][-200:]
        gaps.extend(b - a for a, b in zip(before, before[1:]))
    return max(resumed) * 1e3, min(resumed) * 1e3, statistics.median(gaps) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.environ.get("COLLECTIVED_BUILD_DIR", "build"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layouts", nargs="+", default=["2x2", "4x2"],
                        help="SIDECARSxRANKS per sidecar")
    parser.add_argument("--warm-ops", type=int, default=300)
    parser.add_argument("--ops", type=int, default=3000, help="ops per rank and round")
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--address", "--group", "--store", "--tolerance", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer:
        trainer(args)
        return
    binary, python_path = locate_build(args.build_dir)
    os.environ["PYTHONPATH"] = python_path
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, {args.rounds} rounds, "
          f"allreduce of 8 floats back to back, the last rank SIGKILLed after every rank ran "
          f"{args.warm_ops} ops")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ft-bench-") as tmp:
        for layout in args.layouts:
            nodes, per_node = (int(x) for x in layout.split("x"))
            sidecars = [Sidecar(binary, tmp, f"{layout}-node{i}") for i in range(nodes)]
            try:
                for side in sidecars:
                    side.wait_ready()
                resumes, overhead = [], {"shrink": [], "fail-fast": []}
                for index in range(args.rounds):
                    killed_at, survivors = run_round(args, sidecars, per_node, "shrink", True,
                                                     tmp, f"{layout}-k{index}")
                    resumes.append(resume_figures(killed_at, survivors))
                    # No failure: per-op time with fault tolerance on and off, alternating which
                    # goes first.
                    order = ["shrink", "fail-fast"] if index % 2 == 0 else ["fail-fast", "shrink"]
                    for tolerance in order:
                        _, done = run_round(args, sidecars, per_node, tolerance, False, tmp,
                                            f"{layout}-o{index}")
                        per_op = [statistics.median(b - a for a, b in zip(t[-500:], t[-499:]))
                                  for t in done.values()]
                        overhead[tolerance].append(statistics.median(per_op) * 1e6)
                    print(f"  {layout} round {index + 1}: resumed {resumes[-1][0]:.1f} ms after "
                          f"the kill", flush=True)
            finally:
                for side in sidecars:
                    side.stop()
            rows.append((layout, resumes, overhead))
    print(f"\n{'layout':<8} {'resumed, last survivor (ms)':>28} {'first survivor (ms)':>20} "
          f"{'op gap before (ms)':>19} {'us/op shrink':>13} {'us/op fail-fast':>16} "
          f"{'ratio':>6}")
    for layout, resumes, overhead in rows:
        last = statistics.median(r[0] for r in resumes)
        first = statistics.median(r[1] for r in resumes)
        gap = statistics.median(r[2] for r in resumes)
        on = statistics.median(overhead["shrink"])
        off = statistics.median(overhead["fail-fast"])
        print(f"{layout:<8} {last:>28.1f} {first:>20.1f} {gap:>19.2f} {on:>13.1f} {off:>16.1f} "
              f"{on / off:>5.2f}x")
    print("\nresumed: from the SIGKILL to the end of the survivors' longest pause between two "
          "completed ops after it (median over rounds; per round: " + "; ".join(
              f"{layout} " + ", ".join(f"{r[0]:.0f}" for r in resumes)
              for layout, resumes, _ in rows) + " ms). us/op: median time per op with nothing "
          "failing, fault tolerance on (shrink) and off (fail-fast) in the same run.")


if __name__ == "__main__":
    main()
