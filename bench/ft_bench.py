#!/usr/bin/python3
"""Fault tolerance's figures (docs/fault-tolerance.md): how long the survivors of a shrinking
group stop when a trainer is SIGKILLed, and what shrinking costs when nothing fails.

  - Time to resume: S sidecars x R ranks on loopback, every rank a process issuing allreduces of
    8 floats back to back on a group created with fault_tolerance="shrink"; once every rank ran
    --warm-ops ops, the last rank is SIGKILLed. The figure of a round is the time from the kill
    to the moment the last survivor completed its first op after it (and the first survivor, and
    the survivors' op gap before the kill, for scale). Layouts: 2 x 2 and 4 x 2 by default.
    The same with the last sidecar SIGKILLed instead (its ranks die of it; the survivors freeze
    the epoch, agree on its cut and run the ops in flight again), and with the first sidecar
    SIGKILLed, whose store the group meets in (the survivors move the group's store to the
    lowest of them first), on fresh sidecars each round.
  - Overhead with no failure: the same loop with fault tolerance on and off, interleaved in one
    run (microseconds per op, median over rounds): every op of a shrinking group goes through
    the epoch's routing.

  - With --ddp, the anchor: the same DDP job (4 ranks on one sidecar, a small MLP) twice, its
    last rank SIGKILLed after step --kill-after: on a shrinking group (the survivors go on), and
    with fail-fast groups under torchrun's elastic restart (--max_restarts 1, rank 0 saving a
    checkpoint every --checkpoint-every steps, every rank loading it at start). The figure is
    the time from the kill to the job's next completed step (the last rank's), and the steps
    computed again.

  - With --grow, goodput and join: a DDP job through collectived.torch.ft (4 ranks on one
    sidecar, an MLP of --grow-width whose model and SGD-momentum state is the state a
    replacement receives) runs the same number of steps twice: once with nothing failing, once
    with a random rank other than 0 (whose process holds torch's store) SIGKILLed every
    --fail-every seconds and started again at once, as a restarted pod would be. Goodput is
    committed steps per second against the job with no failure (the number of steps is set so
    that the job with no failure runs --grow-seconds). Join is, per replacement, the time from
    its process's start to its first committed step, split into the start (imports,
    init_process_group until admitted), the state's transfer, and its first step; against the
    state's size over the bandwidth of a broadcast of that size measured in the same job.

    PYTHONPATH=build/python /usr/bin/python3 bench/ft_bench.py --build-dir build [--rounds 5]
        [--ddp] [--grow [--grow-seconds 300 --fail-every 30]]

Printed, not asserted.
"""

import argparse
import datetime
import json
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from ddp_bench import Sidecar, free_port, locate_build  # noqa: E402

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
        try:
            client.allreduce(args.group, tensor)
        except Exception as error:  # noqa: BLE001 - a killed sidecar's ranks die of it
            print(f"rank {args.rank}: {type(error).__name__}: {error}", file=sys.stderr)
            sys.exit(3)
        done.append(time.time())
        if len(done) == args.warm_ops:
            ready.touch()
    with open(args.out, "w") as out:
        json.dump(done, out)
    client.close()


def ddp_worker(args):
    """One rank of the --ddp jobs (see the module's docstring): each completed step's wall-clock
    time goes to OUT/steps.rank<R>.restart<N>."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import collectived.torch  # noqa: F401 - registers the backend
    out = pathlib.Path(args.out)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("collectived", init_method="env://")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    checkpoint = out / "checkpoint.pt"
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    generator = torch.Generator().manual_seed(rank)
    with open(out / f"steps.rank{rank}.restart{restart}", "w") as log:
        for step in range(start, args.steps):
            x = torch.randn(32, 64, generator=generator)
            y = torch.randint(0, 10, (32,), generator=generator)
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            log.write(f"{time.time()} {step}\n")
            log.flush()
            if rank == 0 and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": step + 1}, out / "checkpoint.tmp")
                os.replace(out / "checkpoint.tmp", checkpoint)
            if rank == world - 1 and restart == 0 and step == args.kill_after:
                (out / "killed_at").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)


def ddp_jobs(args, sidecar, tmp):
    """The --ddp anchor, for the shrinking job and for torchrun's restart: seconds from the kill
    to the survivors' next completed step (the last rank's), to their step after the one of the
    kill (back where the job was), and the steps computed again."""
    world = 4
    results = {}
    for job in ("shrink", "torchrun"):
        out = pathlib.Path(tmp) / f"ddp-{job}"
        out.mkdir()
        common = ["--ddp-worker", "--out", str(out), "--steps", str(args.steps),
                  "--kill-after", str(args.kill_after)]
        env = dict(os.environ, OMP_NUM_THREADS="1", COLLECTIVED_ADDRESS=sidecar.address)
        if job == "shrink":
            port = free_port()
            procs = [subprocess.Popen(
                [PYTHON, str(HERE), *common, "--checkpoint-every", "0"],
                env=dict(env, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(port), COLLECTIVED_FAULT_TOLERANCE="shrink"))
                for r in range(world)]
            codes = [p.wait(600) for p in procs]
            if codes[:-1] != [0] * (world - 1):
                raise RuntimeError(f"shrinking job: survivors exited with {codes}")
        else:
            launcher = subprocess.run(
                [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                 str(world), "--max_restarts", "1", "--redirects", "1", "--tee", "1", str(HERE),
                 *common, "--checkpoint-every", str(args.checkpoint_every)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
            if launcher.returncode != 0:
                raise RuntimeError(f"torchrun's job exited with {launcher.returncode}")
        killed_at = float((out / "killed_at").read_text())

        def steps_of(rank, restart):
            log = out / f"steps.rank{rank}.restart{restart}"
            if not log.exists():
                return []
            return [(float(t), int(n)) for t, n in (line.split() for line in
                                                    log.read_text().splitlines())]

        after_restart = 1 if job == "torchrun" else 0
        nexts, backs, redone = [], [], 0
        for rank in range(world - 1):
            before = {n for t, n in steps_of(rank, 0) if t <= killed_at}
            later = [(t, n) for t, n in steps_of(rank, after_restart) if t > killed_at]
            if not later:
                raise RuntimeError(f"{job}: rank {rank} completed no step after the kill")
            nexts.append(later[0][0])
            back = [t for t, n in later if n == args.kill_after + 1]
            if not back:
                raise RuntimeError(f"{job}: rank {rank} never reached step {args.kill_after + 1}")
            backs.append(back[0])
            redone = max(redone, sum(1 for _, n in later if n in before))
        results[job] = (max(nexts) - killed_at, max(backs) - killed_at, redone)
    return results


def grow_worker(args):
    """One rank of the --grow jobs: its steps (wall-clock time, committed) go to
    OUT/steps.rank<R>.<incarnation>.json as they run; a replacement also says when it started,
    joined and received its state."""
    started = time.time()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import collectived.torch  # noqa: F401 - registers the backend
    from collectived.torch import ft
    out = pathlib.Path(args.out)
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("collectived", init_method="env://")
    initialised = time.time()
    torch.manual_seed(0)
    width = args.grow_width
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ddp = ft.DistributedDataParallel(model, optimizer)
    record = {"started": started, "initialised": initialised, "constructed": time.time(),
              "start_step": ddp.start_step, "state_bytes": ddp.state_bytes,
              "transfer_seconds": ddp.transfer_seconds, "steps": []}
    log = out / f"steps.rank{rank}.{args.incarnation}.json"
    if ddp.start_step == 0 and args.measure_bytes:
        # The bandwidth a state transfer gets: broadcasts of its size from rank 0, the median.
        data = torch.zeros(args.measure_bytes, dtype=torch.uint8)
        times = []
        for _ in range(5):
            begin = time.perf_counter()
            dist.broadcast(data, 0)
            times.append(time.perf_counter() - begin)
        record["broadcast_seconds"] = statistics.median(times)
    generator = torch.Generator().manual_seed(rank)
    for step in range(ddp.start_step, args.steps):
        x = torch.randn(32, 64, generator=generator)
        y = torch.randint(0, 10, (32,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        record["steps"].append((time.time(), ddp.last_step["committed"]))
        if len(record["steps"]) % 20 == 1 or step == args.steps - 1:
            log.write_text(json.dumps(record))
    import io  # the size of what a replacement would receive now, as the wrapper sends it
    state = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": args.steps}, state)
    record["state_bytes_sent"] = len(state.getvalue())
    log.write_text(json.dumps(record))


def grow_job(args, sidecar, tmp, name, steps, fail_every, measure_bytes=0):
    """Runs one --grow job; returns the records of every process it started."""
    world = 4
    out = pathlib.Path(tmp) / f"grow-{name}"
    out.mkdir()
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", COLLECTIVED_ADDRESS=sidecar.address,
               WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               COLLECTIVED_FAULT_TOLERANCE="shrink")

    def launch(rank, incarnation):
        return subprocess.Popen(
            [PYTHON, str(HERE), "--grow-worker", "--out", str(out), "--steps", str(steps),
             "--grow-width", str(args.grow_width), "--incarnation", str(incarnation),
             "--measure-bytes", str(measure_bytes)],
            env=dict(env, RANK=str(rank)))

    procs = {rank: launch(rank, 0) for rank in range(world)}
    incarnations = {rank: 0 for rank in range(world)}
    chooser = random.Random(1)
    next_kill = time.time() + fail_every if fail_every else None
    deadline = time.time() + 3600
    while procs[0].poll() is None:
        if time.time() > deadline:
            raise RuntimeError(f"grow job {name}: rank 0 did not finish within an hour")
        if next_kill and time.time() >= next_kill:
            victim = chooser.randrange(1, world)
            if procs[victim].poll() is None:
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                incarnations[victim] += 1
                procs[victim] = launch(victim, incarnations[victim])
            next_kill += fail_every
        time.sleep(0.05)
    codes = {}
    for rank, proc in procs.items():
        try:
            codes[rank] = proc.wait(60)
        except subprocess.TimeoutExpired:
            if incarnations[rank] == 0:
                raise
            # Started too late: the job ended (and rank 0's store with it) before it was
            # admitted; it would wait for a new job.
            proc.kill()
            codes[rank] = proc.wait()
            print(f"  grow job {name}: rank {rank}'s last replacement started after the job "
                  f"ended", flush=True)
            continue
    if any(code for rank, code in codes.items() if code != -signal.SIGKILL):
        raise RuntimeError(f"grow job {name}: exit codes {codes}")
    records = []
    for log in sorted(out.glob("steps.rank*.json")):
        rank, incarnation = log.name.split(".")[1:3]
        records.append((int(rank[4:]), int(incarnation), json.loads(log.read_text())))
    return records


def goodput(records):
    """Rank 0's committed steps per second, from its first step to its last."""
    steps = next(r for rank, inc, r in records if rank == 0)["steps"]
    committed = sum(1 for _, ok in steps if ok)
    return committed / (steps[-1][0] - steps[0][0]), committed, len(steps)


def grow_figures(args, sidecar, tmp):
    probe = grow_job(args, sidecar, tmp, "probe", 60, 0)
    rate, _, _ = goodput(probe)
    steps = max(100, int(rate * args.grow_seconds))
    state_bytes = max(r["state_bytes_sent"] for _, _, r in probe)
    print(f"  --grow: {steps} steps ({rate:.1f} steps/s with no failure), a replacement's state "
          f"{state_bytes / 1e6:.1f} MB", flush=True)
    base = grow_job(args, sidecar, tmp, "no-failure", steps, 0, measure_bytes=state_bytes)
    failing = grow_job(args, sidecar, tmp, "failing", steps, args.fail_every)
    return base, failing, state_bytes


def print_grow(args, base, failing, state_bytes):
    base_rate, base_committed, _ = goodput(base)
    rate, committed, ran = goodput(failing)
    broadcast = statistics.median(r["broadcast_seconds"] for _, _, r in base
                                  if "broadcast_seconds" in r)
    print(f"\nGoodput, DDP through collectived.torch.ft, 4 ranks on one sidecar, a rank "
          f"SIGKILLed every {args.fail_every} s and started again:")
    print(f"  no failure: {base_committed} steps committed, {base_rate:.2f} steps/s")
    print(f"  failing:    {committed} of {ran} steps committed, {rate:.2f} steps/s, "
          f"{sum(1 for _, inc, _ in failing if inc > 0)} replacements")
    print(f"  goodput ratio (failing / no failure): {rate / base_rate:.3f}")
    # What each failure costs the survivors, whatever the machine: rank 0's pauses beyond its
    # usual step time (the loss, and the admission and transfer of the replacement).
    times = [t for t, _ in next(r for rank, inc, r in failing if rank == 0)["steps"]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    usual = statistics.median(gaps)
    lost = sum(g - usual for g in gaps if g > 1.5 * usual)
    failures = max(1, sum(1 for _, inc, _ in failing if inc > 0))
    print(f"  rank 0's pauses beyond its median step ({usual * 1e3:.0f} ms): {lost:.2f} s in all, "
          f"{lost / failures:.3f} s per failure")
    joins = [r for _, inc, r in failing if inc > 0 and r["steps"]]
    if not joins:
        return
    print(f"\nJoin: a replacement's start to its first committed step; the state, "
          f"{state_bytes / 1e6:.2f} MB, over the measured bandwidth "
          f"({state_bytes / broadcast / 1e9:.2f} GB/s): {broadcast * 1e3:.1f} ms")
    rows = []
    for r in joins:
        first = next((t for t, ok in r["steps"] if ok), None)
        if first is None:
            continue
        rows.append((first - r["started"], r["initialised"] - r["started"],
                     r["transfer_seconds"], first - r["constructed"]))
    for label, index in (("start to first committed step", 0),
                         ("start to admitted (imports, init_process_group)", 1),
                         ("state transfer", 2), ("first step", 3)):
        values = [row[index] for row in rows]
        print(f"  {label:<50} median {statistics.median(values):7.3f} s, "
              f"max {max(values):7.3f} s")


def run_round(args, sidecars, ranks_per_sidecar, tolerance, kill, tmp, index):
    """One job; returns (kill time or None, {rank: completion times}) of its survivors. `kill`:
    None, "rank" (the last rank's process), "sidecar" (the last sidecar's, and with it its
    ranks) or "store" (the first sidecar's, whose store the group meets in, and its ranks)."""
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
        victim = {"rank": procs[-1], "sidecar": sidecars[-1].process,
                  "store": sidecars[0].process}[kill]
        victim.send_signal(signal.SIGKILL)
    lost = {world - 1} if kill == "rank" else \
        set(range(world - ranks_per_sidecar, world)) if kill == "sidecar" else \
        set(range(ranks_per_sidecar)) if kill == "store" else set()
    survivors = {}
    for rank, proc in enumerate(procs):
        code = proc.wait(300)
        if rank in lost:
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
    parser.add_argument("--layouts", nargs="*", default=["2x2", "4x2"],
                        help="SIDECARSxRANKS per sidecar (none: no time to resume)")
    parser.add_argument("--warm-ops", type=int, default=300)
    parser.add_argument("--ops", type=int, default=3000, help="ops per rank and round")
    parser.add_argument("--ddp", action="store_true",
                        help="also the DDP job against torchrun's elastic restart")
    parser.add_argument("--steps", type=int, default=120, help="--ddp: steps of the job")
    parser.add_argument("--kill-after", type=int, default=70, help="--ddp: the step of the kill")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="--ddp: torchrun's job")
    parser.add_argument("--grow", action="store_true",
                        help="also goodput and join of a DDP job through collectived.torch.ft")
    parser.add_argument("--grow-seconds", type=float, default=300,
                        help="--grow: the job's length with no failure")
    parser.add_argument("--fail-every", type=float, default=30, help="--grow: seconds")
    parser.add_argument("--grow-width", type=int, default=1024, help="--grow: the MLP's width")
    parser.add_argument("--grow-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--measure-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--address", "--group", "--store", "--tolerance", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer:
        trainer(args)
        return
    if args.ddp_worker:
        ddp_worker(args)
        return
    if args.grow_worker:
        grow_worker(args)
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
                    killed_at, survivors = run_round(args, sidecars, per_node, "shrink", "rank",
                                                     tmp, f"{layout}-k{index}")
                    resumes.append(resume_figures(killed_at, survivors))
                    # No failure: per-op time with fault tolerance on and off, alternating which
                    # goes first.
                    order = ["shrink", "fail-fast"] if index % 2 == 0 else ["fail-fast", "shrink"]
                    for tolerance in order:
                        _, done = run_round(args, sidecars, per_node, tolerance, None, tmp,
                                            f"{layout}-o{index}")
                        per_op = [statistics.median(b - a for a, b in zip(t[-500:], t[-499:]))
                                  for t in done.values()]
                        overhead[tolerance].append(statistics.median(per_op) * 1e6)
                    print(f"  {layout} round {index + 1}: resumed {resumes[-1][0]:.1f} ms after "
                          f"the kill", flush=True)
            finally:
                for side in sidecars:
                    side.stop()
            node_resumes = {"sidecar": [], "store": []}
            for index in range(args.rounds):
                for kill in node_resumes:
                    sidecars = [Sidecar(binary, tmp, f"{layout}-{kill}{index}-node{i}")
                                for i in range(nodes)]
                    try:
                        for side in sidecars:
                            side.wait_ready()
                        killed_at, survivors = run_round(args, sidecars, per_node, "shrink", kill,
                                                         tmp, f"{layout}-{kill}{index}")
                        node_resumes[kill].append(resume_figures(killed_at, survivors))
                        victim = "the last sidecar" if kill == "sidecar" else "the store's sidecar"
                        print(f"  {layout} round {index + 1}: resumed "
                              f"{node_resumes[kill][-1][0]:.1f} ms after {victim}'s kill",
                              flush=True)
                    finally:
                        for side in sidecars:
                            side.stop()
            rows.append((layout, resumes, overhead, node_resumes))
        ddp = grow = None
        if args.grow:
            sidecar = Sidecar(binary, tmp, "grow-node")
            try:
                sidecar.wait_ready()
                grow = grow_figures(args, sidecar, tmp)
            finally:
                sidecar.stop()
        if args.ddp:
            sidecar = Sidecar(binary, tmp, "ddp-node")
            try:
                sidecar.wait_ready()
                ddp = ddp_jobs(args, sidecar, tmp)
            finally:
                sidecar.stop()
    if grow:
        print_grow(args, *grow)
    if rows:
        print_resume(rows)
    if ddp:
        print_ddp(args, ddp)


def print_resume(rows):
    print(f"\n{'layout':<8} {'killed':<8} {'resumed, last survivor (ms)':>28} "
          f"{'first survivor (ms)':>20} {'op gap before (ms)':>19} {'us/op shrink':>13} "
          f"{'us/op fail-fast':>16} {'ratio':>6}")
    for layout, resumes, overhead, node_resumes in rows:
        on = statistics.median(overhead["shrink"])
        off = statistics.median(overhead["fail-fast"])
        for killed, figures in (("trainer", resumes), ("sidecar", node_resumes["sidecar"]),
                                ("store", node_resumes["store"])):
            if not figures:
                continue
            last = statistics.median(r[0] for r in figures)
            first = statistics.median(r[1] for r in figures)
            gap = statistics.median(r[2] for r in figures)
            cost = f"{on:>13.1f} {off:>16.1f} {on / off:>5.2f}x" if killed == "trainer" else ""
            print(f"{layout:<8} {killed:<8} {last:>28.1f} {first:>20.1f} {gap:>19.2f} {cost}")
    print("\nresumed: from the SIGKILL (of the last rank, of the last sidecar and so its ranks, "
          "or of the first sidecar, whose store the group met in, and its ranks) to the end of the survivors' longest pause between two completed ops after it "
          "(median over rounds; per round: " + "; ".join(
              f"{layout} {killed} " + ", ".join(f"{r[0]:.0f}" for r in figures)
              for layout, resumes, _, node_resumes in rows
              for killed, figures in (("trainer", resumes), ("sidecar", node_resumes["sidecar"]),
                                      ("store", node_resumes["store"]))) +
          " ms). us/op: median time per op with nothing failing, fault tolerance on (shrink: "
          "every op kept and committed across sidecars) and off (fail-fast) in the same run.")


def print_ddp(args, ddp):
    if ddp:
        print(f"\nDDP, 4 ranks on one sidecar, the last SIGKILLed after step {args.kill_after} of "
              f"{args.steps}: seconds from the kill to the ranks' next completed step, and to "
              f"step {args.kill_after + 1} (back where the job was)")
        for label, key in (("shrinking group", "shrink"),
                           (f"torchrun elastic restart, checkpoint every {args.checkpoint_every}",
                            "torchrun")):
            nxt, back, redone = ddp[key]
            print(f"  {label:<46} next step {nxt:7.3f} s, back {back:7.3f} s, "
                  f"{redone} steps computed again")
        print(f"  ratio, back where the job was (torchrun / shrink): "
              f"{ddp['torchrun'][1] / ddp['shrink'][1]:.1f}x")


if __name__ == "__main__":
    main()
