#!/usr/bin/python3
"""Load and soak of two real sidecars, in rounds, with the daemons' RSS and open fds sampled.

Each round:
- `--clients` client processes (half on each sidecar, one group of all of them) each run `--ops`
  mixed collectives (allreduce sum/max, broadcast, allgather, reduce_scatter, alltoall, barrier,
  send/recv pairs) of float32/float64/int32/int64/int8 tensors of 1 element to 64 KiB, in
  shared memory and inline, every result checked exactly against numpy;
- meanwhile `--sessions` sessions are opened and closed, and `--groups` two-rank groups (one
  rank on each sidecar) are created and destroyed.

RSS (VmRSS) and open fds of each sidecar are read before each round, every 0.5 s during it
(the maximum is kept) and after it. A table is printed; the exit status is 1 if any result was
wrong or any op failed.

    PYTHONPATH=build/python /usr/bin/python3 bench/soak.py --ops 3000 --rounds 2 --clients 8

COLLECTIVED_BUILD_DIR selects the build (default: build/ of this checkout).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8]
OPS = ["allreduce_sum", "allreduce_max", "broadcast", "allgather", "reduce_scatter", "alltoall",
       "barrier", "sendrecv"]
MAX_TENSOR_BYTES = 64 << 10
ARENA_BYTES = 4 << 20


# -- one client process -------------------------------------------------------------------------


def plan(seed, index, world):
    """The op number `index` of the job: every rank derives the same one."""
    rng = np.random.default_rng([seed, index])
    op = OPS[rng.integers(len(OPS))]
    dtype = DTYPES[rng.integers(len(DTYPES))]
    itemsize = np.dtype(dtype).itemsize
    kind = rng.integers(3)
    if kind == 0:
        count = 1
    elif kind == 1:
        count = int(rng.integers(2, 65))
    else:
        count = int(rng.integers(65, MAX_TENSOR_BYTES // itemsize + 1))
    if op in ("allgather", "reduce_scatter", "alltoall"):
        count = max(1, count // world)  # lists of `world` tensors
    return {"op": op, "dtype": dtype, "count": count, "root": int(rng.integers(world)),
            "shm": bool(rng.integers(2))}


def data(seed, index, rank, part, count, dtype):
    """Rank `rank`'s input (tensor `part` of a list) for op `index`: small integers, so that
    sums over every rank are exact in every dtype."""
    rng = np.random.default_rng([seed, index, rank, part])
    return rng.integers(-8, 9, size=count).astype(dtype)


class Arena:
    """Tensors carved out of one shared-memory buffer (the zero-copy path), reset per op."""

    def __init__(self, client):
        self.buffer = client.allocate(ARENA_BYTES)
        self.offset = 0

    def reset(self):
        self.offset = 0

    def array(self, count, dtype):
        nbytes = count * np.dtype(dtype).itemsize
        start = (self.offset + 63) // 64 * 64
        self.offset = start + nbytes
        assert self.offset <= ARENA_BYTES
        return self.buffer.array((count,), dtype, offset=start)


def run_op(client, group, arena, seed, index, rank, world):
    """Runs op `index`; returns the number of wrong elements."""
    p = plan(seed, index, world)
    op, dtype, count = p["op"], p["dtype"], p["count"]
    arena.reset()

    def tensor(values):
        if not p["shm"]:
            return values.copy()
        out = arena.array(len(values), dtype)
        out[:] = values
        return out

    def empty():
        return tensor(np.zeros(count, dtype))

    def mine(part=0):
        return data(seed, index, rank, part, count, dtype)

    def of(r, part=0):
        return data(seed, index, r, part, count, dtype)

    wrong = 0

    def check(got, want):
        nonlocal wrong
        wrong += int(np.count_nonzero(got != want))

    if op in ("allreduce_sum", "allreduce_max"):
        x = tensor(mine())
        client.allreduce(group, x, op="SUM" if op == "allreduce_sum" else "MAX")
        inputs = np.stack([of(r) for r in range(world)])
        want = inputs.sum(axis=0, dtype=dtype) if op == "allreduce_sum" else inputs.max(axis=0)
        check(x, want)
    elif op == "broadcast":
        x = tensor(mine())
        client.broadcast(group, x, root=p["root"])
        check(x, of(p["root"]))
    elif op == "allgather":
        outputs = [empty() for _ in range(world)]
        client.allgather(group, outputs, tensor(mine()))
        for r in range(world):
            check(outputs[r], of(r))
    elif op == "reduce_scatter":
        output = empty()
        client.reduce_scatter(group, output, [tensor(mine(j)) for j in range(world)])
        check(output, np.stack([of(r, rank) for r in range(world)]).sum(axis=0, dtype=dtype))
    elif op == "alltoall":
        outputs = [empty() for _ in range(world)]
        client.alltoall(group, outputs, [tensor(mine(j)) for j in range(world)])
        for r in range(world):
            check(outputs[r], of(r, rank))
    elif op == "barrier":
        client.barrier(group)
    else:  # sendrecv: rank r pairs with r ^ 1, the even one sends first
        peer = rank ^ 1
        if peer < world:
            out, into = tensor(mine()), empty()
            if rank % 2 == 0:
                client.send(group, out, dst=peer, tag=index)
                client.recv(group, into, src=peer, tag=index)
            else:
                client.recv(group, into, src=peer, tag=index)
                client.send(group, out, dst=peer, tag=index)
            check(into, of(peer))
    return op, wrong


def worker(args):
    from collectived import Client, StoreClient
    client = Client(args.address, name=f"soak rank {args.rank}")
    ops = wrong = failed = 0
    first_error = None
    started = time.monotonic()
    try:
        client.create_group(args.group, args.rank, args.world, store_address=args.store,
                            timeout=120)
        arena = Arena(client)
        for index in range(args.ops):
            try:
                _, bad = run_op(client, args.group, arena, args.seed, index, args.rank,
                                args.world)
                wrong += bad
            except Exception as error:  # noqa: BLE001 - counted and reported
                failed += 1
                first_error = first_error or f"op {index}: {error!r}"
                if failed > 10:
                    break
            ops += 1
        # Leave together: a rank that leaves while a peer still finishes the last op fails that
        # op with PeerLost (see test_soak.py), which is not what this soak measures.
        store = StoreClient(args.store, prefix=args.group)  # the group's rendezvous store
        store.add("done", 1)
        while store.add("done", 0) < args.world:
            time.sleep(0.02)
    finally:
        client.close()
    print(json.dumps({"rank": args.rank, "ops": ops, "wrong": wrong, "failed": failed,
                      "error": first_error, "seconds": time.monotonic() - started}), flush=True)


# -- the driver -----------------------------------------------------------------------------------


def proc_sample(pid):
    """(RSS bytes, open fds, threads) of the sidecar `pid`."""
    with open(f"/proc/{pid}/status") as f:
        status = f.read().splitlines()
    rss = [int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")]
    threads = [int(line.split()[1]) for line in status if line.startswith("Threads:")]
    if not rss or not threads:
        raise RuntimeError(f"sidecar pid {pid} is gone")
    return rss[0], len(os.listdir(f"/proc/{pid}/fd")), threads[0]


class Sampler(threading.Thread):
    """Every 0.5 s, the RSS, fd count and threads of each pid; keeps the maxima."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids = pids
        self.max_rss = {pid: 0 for pid in pids}
        self.max_fds = {pid: 0 for pid in pids}
        self.max_threads = {pid: 0 for pid in pids}
        self.done = threading.Event()

    def sample(self):
        for pid in self.pids:
            rss, fds, threads = proc_sample(pid)
            self.max_rss[pid] = max(self.max_rss[pid], rss)
            self.max_fds[pid] = max(self.max_fds[pid], fds)
            self.max_threads[pid] = max(self.max_threads[pid], threads)

    def run(self):
        while not self.done.wait(0.5):
            try:
                self.sample()
            except (OSError, RuntimeError):
                return  # a sidecar is gone: the round's driver reports it

    def stop(self):
        self.done.set()
        self.join()
        self.sample()


def churn_sessions(sides, count, errors):
    from collectived import Client
    for i in range(count):
        try:
            Client(sides[i % 2].unix_address if i % 4 else sides[i % 2].tcp_address,
                   name=f"soak session {i}").close()
        except Exception as error:  # noqa: BLE001 - reported
            errors.append(f"session {i}: {error!r}")


def churn_groups(sides, count, errors):
    """`count` two-rank groups, one rank per sidecar: created, checked once in 50, destroyed."""
    from collectived import Client
    clients = [Client(sides[r].unix_address, name=f"soak groups rank {r}") for r in range(2)]
    store = sides[0].tcp_address
    try:
        for i in range(count):
            name = f"churn-{uuid.uuid4().hex[:12]}"
            results = [None, None]

            def rank(r):
                try:
                    clients[r].create_group(name, r, 2, store_address=store, timeout=60)
                    if i % 50 == 0:
                        x = np.full(3, r + 1, np.int64)
                        clients[r].allreduce(name, x)
                        assert list(x) == [3, 3, 3], x
                    clients[r].destroy_group(name)
                except Exception as error:  # noqa: BLE001 - reported
                    results[r] = error
            threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for r, error in enumerate(results):
                if error is not None:
                    errors.append(f"group {i} rank {r}: {error!r}")
    finally:
        for client in clients:
            client.close()


def run_round(sides, args, number):
    pids = [side.process.pid for side in sides]
    before = {pid: proc_sample(pid) for pid in pids}
    sampler = Sampler(pids)
    sampler.start()
    group = f"soak-{number}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [env.get("PYTHONPATH", ""), str(BUILD_DIR / "python")] if p)
    started = time.monotonic()
    logs = [tempfile.TemporaryFile("w+") for _ in range(args.clients)]
    workers = [subprocess.Popen(
        [sys.executable, __file__, "--worker", "--address", sides[r % 2].unix_address,
         "--store", sides[0].tcp_address, "--group", group, "--rank", str(r),
         "--world", str(args.clients), "--ops", str(args.ops), "--seed", str(args.seed + number)],
        stdout=logs[r], stderr=subprocess.STDOUT, text=True, env=env)
        for r in range(args.clients)]
    churn_errors = []
    churners = [threading.Thread(target=churn_sessions, args=(sides, args.sessions, churn_errors),
                                 daemon=True),
                threading.Thread(target=churn_groups, args=(sides, args.groups, churn_errors),
                                 daemon=True)]
    for t in churners:
        t.start()
    deadline = time.monotonic() + args.timeout
    while any(w.poll() is None for w in workers):
        dead = [i for i, side in enumerate(sides) if side.process.poll() is not None]
        if dead or time.monotonic() > deadline:
            for w in workers:
                w.kill()
            for r, log in enumerate(logs):
                log.seek(0)
                print(f"--- client {r}:\n{log.read()[-3000:]}")
            raise RuntimeError(f"sidecars {dead} exited" if dead else
                               f"round {number} did not finish in {args.timeout} s")
        time.sleep(0.2)
    reports = []
    for r, proc in enumerate(workers):
        logs[r].seek(0)
        out = logs[r].read()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            reports.append({"rank": r, "ops": 0, "wrong": 0, "failed": args.ops,
                            "error": f"exit {proc.returncode}: {out[-2000:]}", "seconds": 0})
        else:
            reports.append(json.loads(lines[-1]))
    ops_seconds = time.monotonic() - started
    for t in churners:
        t.join()
    seconds = time.monotonic() - started
    sampler.stop()
    after = {pid: proc_sample(pid) for pid in pids}
    return {
        "round": number, "ops": sum(r["ops"] for r in reports),
        "ops_per_s": sum(r["ops"] for r in reports) / max(ops_seconds, 1e-9),
        "wrong": sum(r["wrong"] for r in reports), "failed": sum(r["failed"] for r in reports),
        "errors": [f"rank {r['rank']}: {r['error']}" for r in reports if r["error"]] +
                  churn_errors,
        "sessions": args.sessions, "groups": args.groups, "seconds": seconds,
        "sidecars": [{"rss": (before[pid][0], sampler.max_rss[pid], after[pid][0]),
                      "fds": (before[pid][1], sampler.max_fds[pid], after[pid][1]),
                      "threads": (before[pid][2], sampler.max_threads[pid], after[pid][2])}
                     for pid in pids],
    }


def table(results):
    mib = 1 << 20
    lines = ["round  ops     ops/s  wrong failed sessions groups  time_s  sidecar  "
             "RSS MiB before/max/after   fds before/max/after   threads before/max/after"]
    for res in results:
        for i, side in enumerate(res["sidecars"]):
            head = (f"{res['round']:5d} {res['ops']:5d} {res['ops_per_s']:8.1f} {res['wrong']:6d} "
                    f"{res['failed']:6d} {res['sessions']:8d} {res['groups']:6d} "
                    f"{res['seconds']:7.1f}") if i == 0 else " " * 59
            rss = "/".join(f"{v / mib:.1f}" for v in side["rss"])
            fds = "/".join(str(v) for v in side["fds"])
            threads = "/".join(str(v) for v in side["threads"])
            lines.append(f"{head}  node{i}    {rss:>24}   {fds:>18}   {threads:>22}")
    return "\n".join(lines)


def soak(args):
    """Runs the rounds on two fresh sidecars; returns the per-round results."""
    from conftest import Sidecar
    results = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        sides = [Sidecar(tmp, f"node{i}", extra_args=("--metrics", "")).start()
                 for i in range(2)]
        try:
            for number in range(1, args.rounds + 1):
                results.append(run_round(sides, args, number))
                for side in sides:
                    if side.process.poll() is not None:
                        raise RuntimeError(f"a sidecar exited with {side.process.returncode}")
        except BaseException:
            for side in sides:
                print(f"--- {side.log_path} (exit {side.process.poll()}):\n{side.log()[-6000:]}")
            raise
        finally:
            codes = [side.stop() for side in sides]
        if codes != [0, 0]:
            raise RuntimeError(f"sidecars exited with {codes}")
    return results


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=3000, help="ops per client per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8, help="client processes (even)")
    parser.add_argument("--sessions", type=int, default=500, help="sessions per round")
    parser.add_argument("--groups", type=int, default=1000, help="2-rank groups per round")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=1800, help="per round, seconds")
    # Internal: one client process.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("address", "store", "group"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("rank", "world"):
        parser.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker and (args.clients < 2 or args.clients % 2):
        parser.error("--clients must be even and at least 2")
    return args


def _build_dir():
    return pathlib.Path(os.environ.get("COLLECTIVED_BUILD_DIR", ROOT / "build"))


BUILD_DIR = _build_dir()


def main():
    args = parse_args()
    if args.worker:
        worker(args)
        return 0
    print(f"soak: {args.rounds} rounds, {args.clients} clients x {args.ops} ops, "
          f"{args.sessions} sessions, {args.groups} groups per round, seed {args.seed}, "
          f"build {BUILD_DIR}", flush=True)
    results = soak(args)
    print(table(results))
    for res in results:
        for error in res["errors"][:10]:
            print(f"round {res['round']}: {error}")
    bad = any(res["wrong"] or res["failed"] or res["errors"] for res in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
