#!/usr/bin/python3
"""torch.distributed on CUDA through collectived against in-process torch NCCL, in the same run.

Sections (every rank on cuda:0, float32 allreduce SUM unless said otherwise):
  (a) 1 and 2 ranks on one sidecar against NCCL in the ranks' own processes (the anchor), sizes
      8 B, then 64 B .. 1 GiB in x4 steps; the collectived rows again under MPS when an MPS daemon
      can be started. NCCL refuses two ranks of one host on one GPU, so each anchor process of a
      2-rank job claims a host of its own (NCCL_HOSTID) and talks over loopback sockets.
  (b) 2 sidecars on the GPU, one rank on each (each sidecar its own NCCL_HOSTID, the sidecars
      joined by NCCL over loopback sockets), against (a)'s 2-rank anchor.
  (c) 1,000 back-to-back 1 MiB allreduces, each `dist.all_reduce(t, async_op=True).wait()` (the
      stream waits, the CPU does not), then one synchronize: total time, 1 and 2 ranks; with
      wait() on the sidecar's completion event (the default) and on a stream-signal word
      (COLLECTIVED_STREAM_WAIT=signal: no response awaited at all); again under MPS where the
      MPS variant runs (with --quick the signal path at 1 rank only).
  (d) DDP step time of a small CNN (3 conv layers + linear, 64 images 3x32x32 per rank), 2 ranks,
      on both wait paths.

A time is the median over rounds (a round: ops back to back, then torch.cuda.synchronize(); an
op's time in a round is the round's time / its ops, that of the slowest rank); algbw = bytes /
time, busbw = algbw x 2(n-1)/n. It ends with one line per target, met or not; targets (a) and
(c) hold only if they hold at 1 and at 2 ranks. One set of rank processes per (backend, ranks)
serves every section that uses it (process start-up is most of the run); the time each
section's measurements took is printed.

    PYTHONPATH=build/python /usr/bin/python3 bench/gpu_torch_bench.py --build-dir build [--quick]

--quick: sizes 8 B, 1 MiB, 64 MiB, fewer rounds and 300 ops in (c) (about a minute and a half).
--device cpu: the same logic on CPU tensors, gloo as the anchor and tiny sizes, without MPS (a
smoke test for machines without a GPU; its figures say nothing about the targets).
"""

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ddp_bench  # noqa: E402
from ddp_bench import build_model, free_port, locate_build  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TARGET_FROM = 64 * MiB  # targets (a) and (b) hold at this size and above


def anchor_env(rank):
    """What lets two NCCL ranks of one host share a GPU: each claims a host of its own."""
    return {"NCCL_HOSTID": f"bench-host-{rank}", "NCCL_SOCKET_IFNAME": "lo", "NCCL_NET": "Socket"}


# -- one rank --------------------------------------------------------------------------------


class Rank:
    """One rank of a job: its process group and the measurements (tasks) it takes part in."""

    def __init__(self, spec):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.spec = torch, dist, spec
        self.cuda = spec["device"] == "cuda"
        if self.cuda:
            torch.cuda.set_device(0)
        else:
            torch.set_num_threads(1)
        if spec["backend"] == "collectived":
            import collectived.torch  # noqa: F401 - registers the backend
        dist.init_process_group(spec["backend"], init_method=spec["init"], rank=spec["rank"],
                                world_size=spec["world"],
                                timeout=datetime.timedelta(seconds=spec["pg_timeout"]))
        self.device = torch.device("cuda:0" if self.cuda else "cpu")
        self._tiny = torch.zeros(2, device=self.device)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def align(self):
        """Every rank starts the next round together (a tiny op, then the GPU drained)."""
        self.dist.all_reduce(self._tiny)
        self.sync()

    def sweep(self):
        """{size: [mean seconds per op, one per round]}."""
        spec, dist = self.spec, self.dist
        out = {}
        for size in spec["sizes"]:
            # Zeros: sums stay finite however many rounds run.
            tensor = self.torch.zeros(max(1, size // 4), device=self.device)
            ops = min(50, max(2, spec["round_bytes"] // size))
            dist.all_reduce(tensor)  # first use: IPC handle opened, NCCL buffers set up
            rounds = []
            for _ in range(spec["rounds"]):
                self.align()
                start = time.perf_counter()
                for _ in range(ops):
                    dist.all_reduce(tensor)
                self.sync()
                rounds.append((time.perf_counter() - start) / ops)
            out[str(size)] = rounds
            del tensor
        return out

    def burst(self):
        """{"total": [seconds for all the ops, one per round], "issued": [seconds until the
        last wait() returned, before the synchronize: the CPU's share]}."""
        spec, dist = self.spec, self.dist
        tensor = self.torch.zeros(spec["burst_bytes"] // 4, device=self.device)
        for _ in range(10):
            dist.all_reduce(tensor, async_op=True).wait()
        rounds, issued = [], []
        for _ in range(spec["rounds"]):
            self.align()
            since = time.time()
            start = time.perf_counter()
            for _ in range(spec["burst_ops"]):
                work = dist.all_reduce(tensor, async_op=True)
                work.wait()
            issued.append(time.perf_counter() - start)
            self.sync()
            rounds.append(time.perf_counter() - start)
        out = {"total": rounds, "issued": issued}
        if spec["backend"] == "collectived" and spec["rank"] == 0:
            out["pacing"] = sidecar_pacing(int(since * 1e6), tensor.numel())
        return out

    def ddp(self):
        """[seconds per timed step] (forward, backward with DDP's allreduce, optimizer step)."""
        torch, spec = self.torch, self.spec
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = build_model("cnn").to(self.device)
        ddp = DDP(model, device_ids=[0]) if self.cuda else DDP(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(spec["rank"])
        x = torch.randn(spec["batch"], 3, 32, 32, generator=generator).to(self.device)
        y = torch.randint(0, 10, (spec["batch"],), generator=generator).to(self.device)
        times = []
        for step in range(spec["ddp_warmup"] + spec["ddp_steps"]):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            self.sync()
            if step >= spec["ddp_warmup"]:
                times.append(time.perf_counter() - start)
        return times

    def info(self):
        torch = self.torch
        info = {"torch": torch.__version__}
        if self.spec["backend"] == "collectived" and \
                os.environ.get("COLLECTIVED_STREAM_WAIT") == "signal":
            info["signal path"] = "not in use (no CUDA collective asked for a word)"
            if self.cuda:
                import torch.distributed as dist
                work = dist.all_reduce(torch.ones(1, device="cuda:0"), async_op=True)
                info["signal path"] = "in use" if work._nwork.has_stream_signal() else \
                    "not in use (the driver refused to wait on a word, or no signal buffer)"
                work.wait()
        if self.cuda:
            info["gpu"] = torch.cuda.get_device_name(0)
            info["torch_nccl"] = str(torch.cuda.nccl.version())
        return info


# Stages of an op in the sidecar's flight records, as microseconds after its arrival (-1: not
# reached; the last two on CUDA groups only).
PACING_STAGES = (("arrived", lambda r: 0), ("started", lambda r: r.data_started_us),
                 ("enqueued", lambda r: r.enqueued_us), ("gpu done", lambda r: r.device_done_us),
                 ("completed", lambda r: r.duration_us))


def sidecar_pacing(since_us, count):
    """Where the last round of (c) went at this rank's sidecar, from its flight records of the
    round's allreduces (the last 256 the recorder keeps of the group that ran most of them):
    {stage: median us between one op reaching it and the next} for each stage of PACING_STAGES.
    The stage whose interval matches the round's us per op is the bound: arrival (the trainer's
    issue and the ring), enqueued (the sidecar's CPU), gpu done (the GPU: the streams' chain), or
    "error" when the records could not be read."""
    from collectived import Client
    try:
        with Client(os.environ.get("COLLECTIVED_ADDRESS")) as admin:  # a session for asking only
            records = admin.flight_recorder(limit=256)
    except Exception as error:  # noqa: BLE001 - a figure, not the benchmark, is lost
        return {"error": str(error)[:200]}
    by_group = {}
    for r in records:
        if r.op == "allreduce" and r.count == count and r.state == "completed" and \
                r.issued_unix_us >= since_us:
            by_group.setdefault(r.group, []).append(r)
    ops = sorted(max(by_group.values(), key=len, default=[]), key=lambda r: r.sequence_number)
    pacing = {"ops": len(ops)}
    for stage, after in PACING_STAGES:
        times = [r.issued_unix_us + after(r) for r in ops if after(r) >= 0]
        if len(times) == len(ops) and len(ops) > 1:
            pacing[stage] = statistics.median(b - a for a, b in zip(times, times[1:]))
    return pacing


def worker(spec):
    rank = Rank(spec)
    result = {"rank": spec["rank"], "info": rank.info(), "seconds": {}}
    for task in spec["tasks"]:
        start = time.monotonic()
        result[task] = getattr(rank, task)()
        result["seconds"][task] = time.monotonic() - start
    rank.align()
    print("@@RESULT " + json.dumps(result), flush=True)
    store = rank.dist.distributed_c10d._get_default_store()
    if spec["rank"] == 0:  # rank 0 hosts the rendezvous store: it leaves last
        store.wait([f"left/{r}" for r in range(1, spec["world"])])
    else:
        store.set(f"left/{spec['rank']}", "1")
    os._exit(0)  # skips teardown that can wait on ranks already gone


# -- the driver ------------------------------------------------------------------------------


class Sidecar(ddp_bench.Sidecar):
    """ddp_bench's sidecar, ready once it answers on its socket (its info: GPUs, versions)."""

    def wait_ready(self, timeout=30):
        from collectived import Client

        def info():
            if not os.path.exists(self.socket_path):
                return None
            try:
                with Client(self.address, connect_timeout=2.0) as client:
                    return client.sidecar_info()
            except Exception:  # noqa: BLE001 - not serving yet
                return None

        return super().wait_ready(timeout, info)


class Mps:
    """An MPS control daemon of our own (its pipe and log directories in our temporary one)."""

    def __init__(self, tmpdir):
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(tmpdir, "mps-pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": os.path.join(tmpdir, "mps-log")}
        self.control = shutil.which("nvidia-cuda-mps-control")
        self.running = False

    def _control(self, *args, stdin=None):
        return subprocess.run([self.control, *args], input=stdin, capture_output=True, text=True,
                              env=dict(os.environ, **self.env), timeout=30)

    def start(self):
        """None once started, else why not."""
        if self.control is None:
            return "nvidia-cuda-mps-control is not on PATH"
        for directory in self.env.values():
            os.makedirs(directory, exist_ok=True)
        started = self._control("-d")
        if started.returncode != 0:
            return f"nvidia-cuda-mps-control -d exited {started.returncode}: " \
                   f"{(started.stdout + started.stderr).strip()[-500:]}"
        self.running = True
        deadline = time.time() + 10
        while time.time() < deadline:  # -d returns before the daemon answers
            if self._control(stdin="get_server_list\n").returncode == 0:
                return None
            time.sleep(0.2)
        self.stop()
        return "the MPS control daemon did not answer within 10 s"

    def servers(self):
        return " ".join(self._control(stdin="get_server_list\n").stdout.split()) or "none"

    def log_tail(self, chars=1500):
        tails = []
        for name in ("control.log", "server.log"):
            path = pathlib.Path(self.env["CUDA_MPS_LOG_DIRECTORY"], name)
            if path.exists():
                tails.append(f"--- {name}\n{path.read_text()[-chars:]}")
        return "\n".join(tails)

    def stop(self):
        if self.running:
            self._control(stdin="quit\n")
            self.running = False


def run_job(spec, sidecars, rank_env, python_path, timeout):
    """Runs one process per rank of this file in worker mode (rank r on sidecar r % len) and
    returns their results (a list by rank) and the seconds it took, or raises RuntimeError."""
    started = time.monotonic()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in range(spec["world"]):
        env = dict(os.environ, PYTHONPATH=python_path, OMP_NUM_THREADS="1", **rank_env(rank))
        if sidecars:
            env["COLLECTIVED_ADDRESS"] = sidecars[rank % len(sidecars)].address
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE), "--worker",
             json.dumps(dict(spec, rank=rank, init=init))],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results, problems = [], []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out = proc.communicate()[0] + f"\n[killed after {timeout:.0f} s]"
        lines = [line for line in out.splitlines() if line.startswith("@@RESULT ")]
        if proc.returncode != 0 or not lines:
            problems.append(f"rank {rank} exited {proc.returncode}:\n{out[-2500:]}")
        else:
            results.append(json.loads(lines[-1][len("@@RESULT "):]))
    if problems:
        raise RuntimeError("\n".join(problems))
    return results, time.monotonic() - started


def slowest(per_rank):
    """Per round, the slowest rank's figure."""
    return [max(values) for values in zip(*per_rank)]


def fmt_size(size):
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def print_table(title, headers, rows):
    print(f"\n{title}")
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


class Bench:
    def __init__(self, args):
        self.binary, self.python_path = locate_build(args.build_dir)
        self.device = args.device
        cpu, quick = args.device == "cpu", args.quick
        self.quick = quick
        if cpu:
            sizes = [8, 4 * KiB, 256 * KiB] if quick else [8, KiB, 64 * KiB, MiB]
        else:
            sizes = [8, MiB, 64 * MiB] if quick else [8] + [64 << (2 * i) for i in range(13)]
        self.base = dict(
            device=args.device, sizes=sizes, rounds=3 if quick or cpu else 5,
            round_bytes=128 * MiB, burst_ops=100 if cpu else 300 if quick else 1000,
            burst_bytes=16 * KiB if cpu else MiB, batch=8 if cpu else 64,
            ddp_warmup=2 if cpu else 5, ddp_steps=10 if cpu else 30, pg_timeout=60)
        self.timeout = 60 if quick else 120  # a hung job must not eat the run
        self.anchor = "gloo" if cpu else "nccl"
        self.tmp = tempfile.TemporaryDirectory(prefix="gtb-")
        self.results = {}  # (variant, world) -> [per-rank results]
        self.tasks_of = {}  # variant -> the tasks its jobs ran
        self.failures = {}  # (variant, world) -> why
        self.seconds = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0, "other": 0.0}
        self.info = {}
        self.mps_skipped = "not reached"  # why the MPS variant did not run (None: it ran)

    def job(self, variant, world, tasks, sections, sidecars=(), rank_env=lambda rank: {},
            extra_env=None, diagnose=lambda: ""):
        """Runs a job, keeps its results under (variant, world), charges its time to sections
        (a task name -> section) and prints a progress line."""
        is_anchor = variant.startswith("anchor")
        self.tasks_of.setdefault(variant, set()).update(tasks)
        spec = dict(self.base, world=world, tasks=tasks,
                    backend=self.anchor if is_anchor else "collectived")
        label = f"{self.anchor + variant[6:] if is_anchor else 'collectived ' + variant} x{world}"
        if sidecars is None:
            self.failures[(variant, world)] = "its sidecars did not start"
            print(f"  {label}: not run, its sidecars did not start", flush=True)
            return
        started = time.monotonic()
        try:
            results, wall = run_job(spec, list(sidecars),
                                    lambda r: dict(rank_env(r), **(extra_env or {})),
                                    self.python_path, self.timeout)
        except RuntimeError as error:
            reason = str(error).strip().splitlines()[-1][:200]
            self.failures[(variant, world)] = reason
            self.seconds["other"] += time.monotonic() - started
            logs = "\n".join(f"--- {s.log_path}\n{s.log_tail()}" for s in sidecars)
            print(f"  {label}: FAILED\n{error}\n{logs}\n{diagnose()}", flush=True)
            return
        self.results[(variant, world)] = results
        self.info.update(results[0]["info"])
        measured = 0.0
        for task in tasks:
            seconds = max(r["seconds"][task] for r in results)
            self.seconds[sections[task]] += seconds
            measured += seconds
        self.seconds["other"] += wall - measured
        print(f"  {label}: {wall:.1f} s (" + ", ".join(
            f"{t} {max(r['seconds'][t] for r in results):.1f} s" for t in tasks) + ")",
            flush=True)

    @contextlib.contextmanager
    def sidecars(self, names, envs):
        """The sidecars, started (stopped on leaving), or None, said why, if one did not start."""
        sides = [Sidecar(self.binary, self.tmp.name, name, env) for name, env in zip(names, envs)]
        try:
            try:
                info = [side.wait_ready() for side in sides]
            except RuntimeError as error:
                print(f"  sidecars did not start: {error}", flush=True)
                yield None
                return
            if self.device == "cuda" and not info[0].gpus:
                print(f"  the sidecar sees no GPU: {info[0].gpu_status}", flush=True)
            self.info.setdefault("sidecar", f"collectived {info[0].version}, NCCL "
                                            f"{info[0].nccl_version or '-'}, CUDA runtime "
                                            f"{info[0].cuda_runtime_version or '-'}")
            yield sides
        finally:
            for side in sides:
                side.stop()

    def run(self):
        a_tasks = {"sweep": "a", "burst": "c", "ddp": "d"}
        cuda = self.device == "cuda"
        print(f"anchor jobs ({self.anchor} in the ranks' processes)", flush=True)
        self.job("anchor", 1, ["sweep", "burst"], a_tasks)
        self.job("anchor", 2, ["sweep", "burst", "ddp"], a_tasks,
                 rank_env=anchor_env if cuda else lambda rank: {})

        signal_wait = {"COLLECTIVED_STREAM_WAIT": "signal"}
        print("collectived, one sidecar", flush=True)
        with self.sidecars(["one"], [{}]) as sides:
            self.job("one", 1, ["sweep", "burst"], a_tasks, sides)
            self.job("one", 2, ["sweep", "burst", "ddp"], a_tasks, sides)
            # (c) and (d) again with the trainers' streams waiting on stream-signal words (--quick:
            # one rank).
            self.job("signal", 1, ["burst"], a_tasks, sides, extra_env=signal_wait)
            if not self.quick:
                self.job("signal", 2, ["burst", "ddp"], a_tasks, sides, extra_env=signal_wait)

        print("collectived, two sidecars (one rank each)", flush=True)
        envs = [{"NCCL_HOSTID": f"collectived-bench-{i}", "NCCL_SOCKET_IFNAME": "lo",
                 "NCCL_NET": "Socket"} for i in range(2)]
        with self.sidecars(["two0", "two1"], envs) as sides:
            self.job("two", 2, ["sweep"], {"sweep": "b"}, sides)

        if not cuda:
            self.mps_skipped = "--device cpu"
            return
        mps = Mps(self.tmp.name)
        started = time.monotonic()
        self.mps_skipped = mps.start()
        self.seconds["a"] += time.monotonic() - started
        if self.mps_skipped:
            print(f"MPS variant skipped: {self.mps_skipped}", flush=True)
            return
        print("collectived, one sidecar, under MPS", flush=True)
        try:
            # Started after the daemon so that it uses MPS; stopped (leaving the block) before it.
            with self.sidecars(["mps"], [mps.env]) as sides:
                for world in (1, 2):
                    self.job("mps", world, ["sweep", "burst"], a_tasks, sides, extra_env=mps.env,
                             diagnose=mps.log_tail)
                # Stream-signal words (the least CPU per op); --quick: one rank, (c) only.
                for world in (1,) if self.quick else (1, 2):
                    self.job("signal-mps", world, ["burst"] if self.quick else ["sweep", "burst"],
                             a_tasks, sides, extra_env=dict(mps.env, **signal_wait),
                             diagnose=mps.log_tail)
                print(f"  MPS servers (pids; none: nothing ran under MPS): {mps.servers()}",
                      flush=True)
            # (b) with the same setting on both sides: the anchor's two processes under MPS too.
            self.job("anchor-mps", 2, ["sweep"], {"sweep": "b"},
                     rank_env=lambda rank: dict(anchor_env(rank), **mps.env),
                     diagnose=mps.log_tail)
            with self.sidecars(["twomps0", "twomps1"],
                               [dict(env, **mps.env) for env in envs]) as sides:
                self.job("two-mps", 2, ["sweep"], {"sweep": "b"}, sides, extra_env=mps.env,
                         diagnose=mps.log_tail)
        finally:
            mps.stop()

    # -- reports -------------------------------------------------------------------------------

    def sweep_of(self, variant, world):
        """{size: median seconds per op} or None when the job failed."""
        results = self.results.get((variant, world))
        if results is None:
            return None
        return {int(size): statistics.median(slowest([r["sweep"][size] for r in results]))
                for size in results[0]["sweep"]}

    def target_sizes(self):
        sizes = self.base["sizes"]
        return [s for s in sizes if s >= TARGET_FROM] or [max(sizes)]

    def sweep_table(self, title, world, variants, anchor_variant="anchor"):
        """Prints anchor and collectived rows side by side; returns {variant: {size: ratio}}
        (anchor time / our time, the busbw ratio)."""
        anchor = self.sweep_of(anchor_variant, world)
        factor = 2 * (world - 1) / world
        headers = ["size", f"{self.anchor} us", "algbw", "busbw"]
        for name, _ in variants:
            headers += [f"{name} us", "algbw", "busbw", "ratio"]
        ratios = {variant: {} for _, variant in variants}
        rows = []
        for size in self.base["sizes"]:
            row = [fmt_size(size)]
            for name, variant in [(self.anchor, anchor_variant)] + variants:
                times = self.sweep_of(variant, world)
                if times is None:
                    row += ["failed", "-", "-"] + ([] if variant == anchor_variant else ["-"])
                    continue
                seconds = times[size]
                algbw = size / seconds / 1e9
                row += [f"{seconds * 1e6:.1f}", f"{algbw:.2f}", f"{algbw * factor:.2f}"]
                if variant != anchor_variant:
                    if anchor is None:
                        row.append("-")
                    else:
                        ratios[variant][size] = anchor[size] / seconds
                        row.append(f"{ratios[variant][size]:.2f}x")
            rows.append(row)
        print_table(title, headers, rows)
        return ratios

    def worst(self, ratios, variant, world):
        """(figure text, minimum ratio or None) over the target sizes."""
        if (variant, world) in self.failures:
            return f"x{world} failed: {self.failures[(variant, world)]}", None
        if "anchor" != variant and ("anchor", world) in self.failures:
            return f"x{world} anchor failed: {self.failures[('anchor', world)]}", None
        values = {s: ratios[s] for s in self.target_sizes() if s in ratios}
        if not values:
            return f"x{world} not measured", None
        size = min(values, key=values.get)
        return f"x{world} {values[size]:.2f}x at {fmt_size(size)}", values[size]

    def report(self):
        """Prints the tables, the elapsed times, then one line per target."""
        targets = [self.report_sweeps(), self.report_burst(), self.report_ddp()]
        print("\nelapsed per section (its measured tasks): " + ", ".join(
            f"({k}) {v:.1f} s" if len(k) == 1 else f"{k} {v:.1f} s"
            for k, v in self.seconds.items()) + " (other: process start, rendezvous, set-up, "
            "failed jobs)\n")
        for what, met, figure in [t for ts in targets for t in ts]:
            print(f"target {what} : {'met' if met else 'not met'} ({figure})")

    def report_sweeps(self):
        """Tables (a) and (b); their targets."""
        dev = "cuda:0" if self.device == "cuda" else "cpu"
        print(f"\ntimes: median over {self.base['rounds']} rounds of the mean time per op (us); "
              f"algbw, busbw in GB/s; ratio = {self.anchor} time / collectived time (above 1: "
              "collectived faster; the same as the ratio of busbw)")
        variants = [("collectived", "one")] + ([] if self.mps_skipped else [("coll+MPS", "mps")])
        # The signal path's sweeps under MPS, where they ran (not with --quick).
        signal = [(name, variant) for name, variant in (("signal+MPS", "signal-mps"),)
                  if any(key in self.results or key in self.failures
                         for key in ((variant, 1), (variant, 2)))
                  and "sweep" in self.tasks_of.get(variant, ())]
        variants += signal
        a = {world: self.sweep_table(f"(a) allreduce float32 SUM, {world} rank(s) on {dev}, "
                                     "one sidecar", world, variants) for world in (1, 2)}
        if self.mps_skipped:
            print(f"(MPS variant skipped: {self.mps_skipped})")
        b = self.sweep_table(f"(b) allreduce float32 SUM, 2 sidecars on {dev}, one rank each "
                             f"(anchor: the 2-rank {self.anchor} of (a))", 2,
                             [("2 sidecars", "two")])
        at = f"at >= {fmt_size(min(self.target_sizes()))}"
        figures = [self.worst(a[w]["one"], "one", w) for w in (1, 2)]
        mins = [m for _, m in figures]
        text = "; ".join(f for f, _ in figures)
        if not self.mps_skipped:
            text += "; with MPS: " + "; ".join(self.worst(a[w]["mps"], "mps", w)[0]
                                               for w in (1, 2))
        for name, variant in signal:
            text += f"; {name}: " + "; ".join(self.worst(a[w][variant], variant, w)[0]
                                              for w in (1, 2))
        text_b, worst_b = self.worst(b["two"], "two", 2)
        if not self.mps_skipped:
            b_mps = self.sweep_table(f"(b) under MPS: 2 sidecars on {dev} against 2 {self.anchor} "
                                     "processes, both under MPS", 2,
                                     [("2 sidecars+MPS", "two-mps")], anchor_variant="anchor-mps")
            text_b += "; both under MPS: " + self.worst(b_mps["two-mps"], "two-mps", 2)[0]
        return [(f"(a) 1 and 2 ranks on one sidecar, busbw >= 0.9x {self.anchor} {at}",
                 None not in mins and min(mins) >= 0.9, text),
                (f"(b) 2 sidecars on one GPU, busbw >= 0.9x {self.anchor} {at}",
                 worst_b is not None and worst_b >= 0.9, text_b)]

    def report_burst(self):
        """Table (c), and again under MPS where the MPS jobs ran; their targets."""
        out = self.burst_table("", (("one", "event"), ("signal", "signal")))
        if not self.mps_skipped:
            out += self.burst_table(" under MPS", (("mps", "event"), ("signal-mps", "signal")))
        return out

    def burst_table(self, setting, variants):
        """One table (c) of the collectived jobs `variants` ((job variant, wait path) pairs:
        the sidecar's event, a signal word) against the anchor; its target lines."""
        ops = self.base["burst_ops"]
        rows = []
        ratios = {variant: {} for variant, _ in variants}
        for world in (1, 2):
            row = [f"x{world}"]
            totals = {}
            for variant in ["anchor"] + [variant for variant, _ in variants]:
                results = self.results.get((variant, world))
                if results is None:
                    row += ["failed" if (variant, world) in self.failures else "not run", "-",
                            "-"]
                    continue
                totals[variant] = statistics.median(
                    slowest([r["burst"]["total"] for r in results]))
                issued = statistics.median(slowest([r["burst"]["issued"] for r in results]))
                row += [f"{totals[variant] * 1e3:.1f}", f"{totals[variant] / ops * 1e6:.1f}",
                        f"{issued / ops * 1e6:.1f}"]
            for variant, _ in variants:
                if "anchor" in totals and variant in totals:
                    ratios[variant][world] = totals[variant] / totals["anchor"]
                row.append(f"{ratios[variant][world]:.2f}x" if world in ratios[variant] else "-")
            rows.append(row)
        print_table(f"(c){setting} {ops} back-to-back {fmt_size(self.base['burst_bytes'])} "
                    "allreduces (async_op=True, work.wait()), then one synchronize; median over "
                    f"{self.base['rounds']} rounds; wait() on the sidecar's event (event), on a "
                    "stream-signal word (signal: COLLECTIVED_STREAM_WAIT=signal); issue: "
                    "us per op until the last wait() returned (the CPU's share: close to us/op, "
                    "the trainer's CPU bounds the path)"
                    + (f"; collectived{setting}, the anchor as in (c)" if setting else ""),
                    ["ranks", f"{self.anchor} ms", "us/op", "issue"]
                    + [label for _, path in variants for label in (f"{path} ms", "us/op", "issue")]
                    + [f"{path}/anchor" for _, path in variants], rows)
        self.pacing_table(setting, variants)
        out = []
        for variant, path in variants:
            found = ratios[variant]
            ran = [w for w in (1, 2) if w in found or (variant, w) in self.failures]
            text = "; ".join(f"x{w} {found[w]:.2f}x" if w in found else f"x{w} failed"
                             for w in ran)
            worlds = " and ".join(str(w) for w in ran) or "no"
            out.append((f"(c){setting} {ops} async allreduces, {worlds} rank(s), within 1.3x of "
                        f"{self.anchor}, {path} path",
                        bool(ran) and len(found) == len(ran) and max(found.values()) <= 1.3,
                        text + ", collectived / anchor total time"))
        return out

    def pacing_table(self, setting, variants):
        """Where (c)'s ops went at the sidecar (rank 0's, last round): see sidecar_pacing."""
        rows = []
        for world in (1, 2):
            for variant, path in variants:
                results = self.results.get((variant, world))
                pacing = results[0]["burst"].get("pacing") if results else None
                if pacing is None:
                    continue
                if "error" in pacing:
                    rows.append([f"x{world}", path, f"not read: {pacing['error']}"] +
                                ["-"] * len(PACING_STAGES))
                    continue
                rows.append([f"x{world}", path, str(pacing["ops"])] + [
                    f"{pacing[stage]:.1f}" if stage in pacing else "-"
                    for stage, _ in PACING_STAGES])
        if rows:
            print_table(f"(c){setting} at the sidecar: median us from one op reaching a stage to "
                        "the next op reaching it, from rank 0's sidecar's flight records of the "
                        "last round (ops: how many); the stage whose interval matches us/op "
                        "bounds the path: arrived (the trainer's issue), enqueued (the sidecar's "
                        "CPU), gpu done (the GPU, the streams' chain); - where a stage is not "
                        "recorded (enqueued and gpu done: CUDA groups only)",
                        ["ranks", "path", "ops"] + [stage for stage, _ in PACING_STAGES], rows)

    def report_ddp(self):
        """Table (d); its target."""
        medians, rows = {}, []
        for name, variant in ((self.anchor, "anchor"), ("collectived", "one"),
                              ("collectived, signal", "signal")):
            results = self.results.get((variant, 2))
            if results is None:
                rows.append([name, "failed" if (variant, 2) in self.failures else "not run", "-",
                             "-"])
                continue
            steps = slowest([r["ddp"] for r in results])
            medians[variant] = statistics.median(steps)
            rows.append([name, f"{medians[variant] * 1e3:.2f}",
                         f"{statistics.fmean(steps) * 1e3:.2f}",
                         f"{medians[variant] / medians['anchor']:.2f}x"
                         if "anchor" in medians else "-"])
        dev = "cuda:0" if self.device == "cuda" else "cpu"
        print_table(f"(d) DDP step of the small CNN, 2 ranks on {dev}, batch "
                    f"{self.base['batch']} per rank, {self.base['ddp_warmup']} warm-up + "
                    f"{self.base['ddp_steps']} timed steps (slowest rank per step)",
                    ["backend", "median ms", "mean ms", "vs anchor"], rows)
        what = f"(d) DDP step, 2 ranks, within 1.1x of {self.anchor}"
        if "anchor" not in medians or "one" not in medians:
            return [(what, False, "a job failed")]
        ratio = medians["one"] / medians["anchor"]
        text = f"{ratio:.2f}x median step time"
        for variant in ("signal",):
            if variant in medians:
                text += f"; {variant} path {medians[variant] / medians['anchor']:.2f}x"
        return [(what, ratio <= 1.1, text)]


class OutOfTime(Exception):
    """SIGTERM arrived: stop measuring, report what was measured."""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get(
        "COLLECTIVED_BUILD_DIR", str(HERE.parents[1] / "build")))
    parser.add_argument("--quick", action="store_true", help="3 sizes, fewer rounds")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test of the logic with gloo as the anchor")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    started = time.monotonic()
    bench = Bench(args)
    print(f"{os.cpu_count()} CPUs, device {args.device}{', quick' if args.quick else ''}",
          flush=True)

    def out_of_time(signum, frame):
        raise OutOfTime()

    # A caller's time budget (timeout(1)'s SIGTERM) ends the run, not the report of what ran.
    signal.signal(signal.SIGTERM, out_of_time)
    try:
        bench.run()
    except OutOfTime:
        print("\nstopped by SIGTERM (the caller's time budget): the tables show what ran",
              flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        bench.tmp.cleanup()
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(bench.info.items())))
    bench.report()
    print(f"\ntotal {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
