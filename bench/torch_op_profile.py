#!/usr/bin/python3
"""Where a trainer's CPU time goes in one torch allreduce through collectived: world size 1, a
sidecar of its own, ops back to back as gpu_torch_bench.py's (c) issues them
(`dist.all_reduce(t, async_op=True).wait()`), then the same ops under cProfile, whose table of
the costliest functions (own time, and time with callees) says which Python calls the per-op
time is made of; and a table of the issue cost per op at each layer, from torch's wrapper down
to the native library's call. Also an in-process anchor (nccl on CUDA, gloo on CPU) on the same
tensor.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_op_profile.py --build-dir build \
        [--device cuda|cpu] [--bytes 1048576] [--ops 1000] [--top 25]

COLLECTIVED_STREAM_WAIT=signal profiles the stream-signal path. Figures from the profiled loop
are inflated by the profiler; the unprofiled lines above the tables are the per-op times.
"""

import argparse
import cProfile
import datetime
import io
import os
import pathlib
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from ddp_bench import Sidecar, free_port, locate_build  # noqa: E402


def per_op(run, ops, sync):
    """Microseconds per op of `ops` calls of run(), then sync()."""
    start = time.perf_counter()
    for _ in range(ops):
        run()
    sync()
    return (time.perf_counter() - start) / ops * 1e6


def profiled(run, ops, sync, top):
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(ops):
        run()
    sync()
    profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def measure(args):
    """This process's part: one rank of `args.backend` (run by main in a child process)."""
    import torch
    import torch.distributed as dist
    cuda = args.device == "cuda"
    if args.backend == "collectived":
        import collectived.torch  # noqa: F401 - registers the backend
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    device = torch.device("cuda:0" if cuda else "cpu")
    tensor = torch.zeros(max(1, args.bytes // 4), device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def torch_op():
        dist.all_reduce(tensor, async_op=True).wait()

    for _ in range(50):
        torch_op()
    sync()
    rounds = sorted(per_op(torch_op, args.ops, sync) for _ in range(3))
    path = f"; {os.environ.get('COLLECTIVED_STREAM_WAIT') or 'event'} path" \
        if args.backend == "collectived" and cuda else ""
    print(f"{args.backend} torch op, {args.bytes} B on {device}: {rounds[1]:.1f} us per op "
          f"(median of 3 rounds of {args.ops}{path})", flush=True)

    def burst():  # (c)'s pattern without the stream: ops issued before any wait
        works = [dist.all_reduce(tensor, async_op=True) for _ in range(50)]
        for work in works:
            work.wait()
    bursts = []
    for _ in range(3):
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(max(1, args.ops // 50)):
            burst()
        sync()
        ops = max(1, args.ops // 50) * 50
        bursts.append(((time.perf_counter() - start) / ops * 1e6,
                       (time.process_time() - cpu) / ops * 1e6))
    wall, cpu = sorted(b[0] for b in bursts)[1], sorted(b[1] for b in bursts)[1]
    print(f"{args.backend} torch ops 50 at a time, then their waits: {wall:.1f} us per op, "
          f"{cpu:.1f} us of this process's CPU per op (medians of 3 rounds{path})", flush=True)
    if args.backend != "collectived":
        return
    native_layers(dist, tensor, device, sync, args.ops)
    print(profiled(torch_op, args.ops, sync, args.top), flush=True)


def native_layers(dist, tensor, device, sync, ops):
    """The issue cost per op at each layer, from torch's wrapper down to the native library's
    call: ops issued 50 at a time, their waits not timed; medians of 5 rounds. What a layer
    adds is its line less the line below it."""
    from collectived import cuda as client_cuda
    from collectived import dtypes
    group = dist.distributed_c10d._get_default_group()
    ours = group._get_backend(device) if hasattr(group, "_get_backend") else group
    ordinal = device.index if device.type == "cuda" else -1
    session, name = ours._session, ours._group_for(ordinal)
    lib, quick = session._lib, session._quick
    options = dist.AllreduceOptions()
    stream = client_cuda.current_stream(ordinal) if ordinal >= 0 else None
    kind, dtype = dtypes.REDUCE_OPS["SUM"], dtypes.torch_to_proto(tensor.dtype)

    def raw():
        return lib.collectived_native_allreduce(
            session._handle, name, tensor.data_ptr(), ordinal,
            stream, dtype, tensor.numel(), kind, 1.0, 0)

    def raw_done(handle):
        lib.collectived_native_work_wait(handle, -1)
        quick.collectived_native_work_free(handle)

    layers = (("torch's dist.all_reduce", lambda: dist.all_reduce(tensor, async_op=True),
               lambda work: work.wait()),
              ("the backend's allreduce", lambda: ours.allreduce([tensor], options),
               lambda work: work.wait()),
              ("NativeSession.allreduce", lambda: session.allreduce(name, tensor),
               lambda work: work.wait()),
              ("the library's call alone", raw, raw_done))
    batches = max(1, ops // 50)
    print(f"us per op issued (50 at a time, waits not timed; medians of 5 rounds of "
          f"{batches * 50}), each layer with those below it:", flush=True)
    for label, issue, finish in layers:
        rounds = []
        for _ in range(5):
            spent = 0.0
            for _ in range(batches):
                start = time.perf_counter()
                works = [issue() for _ in range(50)]
                spent += time.perf_counter() - start
                for work in works:
                    finish(work)
            sync()
            rounds.append(spent / (batches * 50) * 1e6)
        print(f"  {label:28s} {statistics.median(rounds):7.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get(
        "COLLECTIVED_BUILD_DIR", str(HERE.parent.parent / "build")))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend:
        measure(args)
        return
    binary, python_path = locate_build(args.build_dir)
    anchor = "nccl" if args.device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory(prefix="opprofile-") as tmp:
        sidecar = Sidecar(binary, tmp, "a")
        try:
            sidecar.wait_ready()
            for backend in (anchor, "collectived"):
                env = dict(os.environ, PYTHONPATH=python_path, OMP_NUM_THREADS="1",
                           COLLECTIVED_ADDRESS=sidecar.address)
                command = [sys.executable, str(HERE), "--backend", backend, "--device",
                           args.device, "--bytes", str(args.bytes), "--ops", str(args.ops),
                           "--top", str(args.top)]
                done = subprocess.run(command, env=env, timeout=300)
                if done.returncode != 0:
                    sys.exit(f"torch_op_profile: the {backend} rank exited {done.returncode}")
        finally:
            sidecar.stop()


if __name__ == "__main__":
    main()
