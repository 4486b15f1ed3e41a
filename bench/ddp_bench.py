#!/usr/bin/python3
"""DDP step time: the "collectived" torch.distributed backend against PyTorch's gloo backend.

Starts two collectived sidecars on loopback (two simulated nodes) from --build-dir, then, for
each model (a small MLP, a small CNN) and each world size (2 and 4 ranks), trains with
DistributedDataParallel on gloo and on collectived in each layout of ranks over sidecars, in the
same run, and prints a table of step times (forward + backward with DDP's gradient all-reduce +
optimizer step), the time of a step being that of its slowest rank. Layouts: "one-node" puts
every rank on one sidecar (one node, its trainers sharing their sidecar); "two-nodes" puts rank
r on sidecar r % 2 (with 2 ranks, one rank per node: the gradients cross between the sidecars
over loopback TCP through Gloo, the data path of the gloo backend itself).

    /usr/bin/python3 bench/ddp_bench.py --build-dir build [--steps 30] [--warmup 5]
        [--layouts one-node two-nodes] [--backends collectived collectived-shrink gloo]

Backend "collectived-shrink" is collectived with COLLECTIVED_FAULT_TOLERANCE=shrink (nothing
fails: what fault tolerance costs a step).

Printed, not asserted. Every rank runs with one intra-op thread; on a machine with fewer cores
than ranks the figures include CPU contention, equally for both backends.
"""

import argparse
import datetime
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()


# -- models (built from a seed, identical on every rank) -----------------------------------


def build_model(kind):
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    if kind == "mlp":
        # ~1.2 M parameters (4.7 MiB of float32 gradients).
        return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                             nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    if kind == "cnn":
        # ~0.3 M parameters, 32x32 RGB inputs.
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
            nn.Flatten(), nn.Linear(64 * 16, 256), nn.ReLU(), nn.Linear(256, 10))
    raise ValueError(kind)


def batch(kind, per_rank, generator):
    import torch
    if kind == "mlp":
        x = torch.randn(per_rank, 256, generator=generator)
    else:
        x = torch.randn(per_rank, 3, 32, 32, generator=generator)
    return x, torch.randint(0, 10, (per_rank,), generator=generator)


def parameter_count(kind):
    return sum(p.numel() for p in build_model(kind).parameters())


# -- one rank --------------------------------------------------------------------------------


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    if args.backend == "collectived":
        import collectived.torch  # noqa: F401 - registers the backend
    dist.init_process_group(args.backend, init_method=args.init, rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=120))
    model = DDP(build_model(args.model))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(args.rank)
    per_rank = args.batch // args.world
    times = []
    for step in range(args.warmup + args.steps):
        x, y = batch(args.model, per_rank, generator)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
    # Check that the ranks ended with identical parameters (a cheap sanity check).
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    checksum = [torch.zeros(1, dtype=torch.float64) for _ in range(args.world)]
    dist.all_gather(checksum, flat.double().sum().reshape(1))
    print("@@TIMES " + json.dumps({"rank": args.rank, "times": times,
                                   "identical": len({float(c) for c in checksum}) == 1}),
          flush=True)
    store = dist.distributed_c10d._get_default_store()
    if args.rank == 0:  # rank 0 hosts the store (env://): it leaves last
        store.wait([f"left/{r}" for r in range(1, args.world)])
    else:
        store.set(f"left/{args.rank}", "1")
    os._exit(0)


# -- the driver ------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sidecar:
    """A collectived on loopback; its process gets `env` on top of ours."""

    def __init__(self, binary, tmpdir, name, env=None):
        self.socket_path = os.path.join(tmpdir, f"{name}.sock")
        self.port = free_port()
        self.log_path = os.path.join(tmpdir, f"{name}.log")
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [str(binary), "--socket", self.socket_path, "--listen", f"127.0.0.1:{self.port}",
             "--advertise", "127.0.0.1", "--metrics", "", "--log-level", "warning",
             "--trust-plaintext-peers"],
            stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))

    def log_tail(self, chars=2000):
        with open(self.log_path) as log:
            return log.read()[-chars:]

    @property
    def address(self):
        return "unix://" + self.socket_path

    def wait_ready(self, timeout=20, ready=None):
        """Polls until `ready()` (default: the socket exists) returns something true; returns
        it. RuntimeError with the log when the sidecar exits or the timeout passes."""
        ready = ready or (lambda: os.path.exists(self.socket_path))
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"collectived exited: {self.log_tail()}")
            answer = ready()
            if answer:
                return answer
            time.sleep(0.05)
        raise RuntimeError(f"collectived did not start: {self.log_tail()}")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def run_ranks(script, worker_args, world, sidecars, python_path, timeout, what, env=None):
    """Runs `script --worker *worker_args --rank R --world W` once per rank (rank r on sidecar
    r % len(sidecars), env:// rendezvous) and returns each rank's last ``@@TIMES`` record."""
    port = free_port()
    procs = []
    for rank in range(world):
        rank_env = dict(os.environ, PYTHONPATH=python_path, OMP_NUM_THREADS="1",
                        COLLECTIVED_ADDRESS=sidecars[rank % len(sidecars)].address,
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env or {}))
        procs.append(subprocess.Popen(
            [sys.executable, str(script), "--worker", *worker_args, "--rank", str(rank),
             "--world", str(world)],
            env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    records = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{what}: rank {rank} timed out")
        lines = [line for line in out.splitlines() if line.startswith("@@TIMES ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{what}: rank {rank} failed ({proc.returncode}):\n{out[-3000:]}")
        records.append(json.loads(lines[-1][len("@@TIMES "):]))
    return records


def run_job(args, backend, model, world, sidecars):
    # "collectived-shrink": the collectived backend with fault tolerance on (nothing fails).
    env = {"COLLECTIVED_FAULT_TOLERANCE": "shrink"} if backend == "collectived-shrink" else None
    backend_name = "collectived" if backend.startswith("collectived") else backend
    records = run_ranks(HERE, ["--backend", backend_name, "--model", model, "--steps",
                               str(args.steps), "--warmup", str(args.warmup), "--batch",
                               str(args.batch), "--init", "env://"],
                        world, sidecars, args.python_path, args.job_timeout,
                        f"{backend} {model} {world} ranks", env=env)
    # A step lasts as long as its slowest rank.
    steps = [max(r["times"][i] for r in records) * 1000 for i in range(args.steps)]
    return steps, all(r["identical"] for r in records)


def percentile(values, q):
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def locate_build(build_dir):
    """The build's collectived (exits when it is missing) and the PYTHONPATH that puts the
    build's Python package first."""
    build = pathlib.Path(build_dir).resolve()
    binary = build / "bin" / "collectived"
    if not binary.exists():
        sys.exit(f"{binary} not found: build first (or pass --build-dir)")
    python_path = os.pathsep.join(
        [str(build / "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p])
    return binary, python_path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get(
        "COLLECTIVED_BUILD_DIR", str(HERE.parents[1] / "build")))
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--backends", nargs="+", default=["collectived", "gloo"])
    parser.add_argument("--layouts", nargs="+", default=["one-node", "two-nodes"],
                        choices=["one-node", "two-nodes"],
                        help="how collectived's ranks are spread over the sidecars")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--job-timeout", type=float, default=300)
    # worker mode
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--init", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    binary, args.python_path = locate_build(args.build_dir)
    tmp = tempfile.TemporaryDirectory(prefix="ddpb-")
    sidecars = [Sidecar(binary, tmp.name, f"node{i}") for i in range(2)]
    rows = []
    try:
        for sidecar in sidecars:
            sidecar.wait_ready()
        import torch
        print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, global batch {args.batch}, "
              f"{args.warmup} warm-up + {args.steps} timed steps; collectived on "
              f"{' and '.join(args.layouts)} (two-nodes: rank r on sidecar r % 2)", flush=True)
        runs = []  # (backend, row label, sidecars)
        for backend in args.backends:
            if not backend.startswith("collectived"):
                runs.append((backend, backend, sidecars))
                continue
            for layout in args.layouts:
                used = sidecars[:1] if layout == "one-node" else sidecars
                runs.append((backend, f"{backend} {layout}", used))
        for model in args.models:
            for world in args.ranks:
                for backend, label, used in runs:
                    started = time.monotonic()
                    steps, identical = run_job(args, backend, model, world, used)
                    rows.append(dict(model=model, ranks=world, backend=label,
                                     mean=statistics.fmean(steps),
                                     p50=percentile(steps, 50), p90=percentile(steps, 90),
                                     identical=identical))
                    print(f"  {model} x{world} {label}: {time.monotonic() - started:.1f} s",
                          file=sys.stderr, flush=True)
    finally:
        for sidecar in sidecars:
            sidecar.stop()
        tmp.cleanup()

    params = {m: parameter_count(m) for m in args.models}
    print()
    print(f"{'model':<6} {'params':>9} {'ranks':>5} {'backend':<22} {'mean ms':>9} {'p50 ms':>9} "
          f"{'p90 ms':>9} {'vs gloo':>8}  same params")
    for row in rows:
        gloo = next((r for r in rows if r["model"] == row["model"] and r["ranks"] == row["ranks"]
                     and r["backend"] == "gloo"), None)
        ratio = f"{row['mean'] / gloo['mean']:.2f}x" if gloo else "-"
        print(f"{row['model']:<6} {params[row['model']]:>9,} {row['ranks']:>5} "
              f"{row['backend']:<22} {row['mean']:>9.2f} {row['p50']:>9.2f} {row['p90']:>9.2f} "
              f"{ratio:>8}  {'yes' if row['identical'] else 'NO'}")
    print("\nvs gloo: mean step time of the row / mean step time of gloo (same model and ranks); "
          "below 1 = faster than gloo.")


if __name__ == "__main__":
    main()
