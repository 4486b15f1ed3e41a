"""What the trust features cost: the same work against sidecars with mutual TLS and job tokens
and against plaintext loopback sidecars without tokens, in the same run.

    PYTHONPATH=build/python COLLECTIVED_BUILD_DIR=$PWD/build /usr/bin/python3 bench/trust_overhead.py

Prints, per case, the median and p99 of each round and the ratio secure / plaintext of the
medians (median over the rounds). Cases:
  store set     64-byte Set through StoreClient over TCP (mutual TLS vs plaintext) and, for
                reference, over the Unix socket;
  new channel   a new TCP channel and its first Set (the TLS handshake);
  create group  a 2-rank group over 2 sidecars, rendezvous in the store of the first one over
                TCP, then destroy (with a job token vs without);
  allreduce 8B  the 2-rank group's 8-byte allreduce (sessions are looked up by keyed hash and
                compared in constant time on both; the data plane is Gloo either way).
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from conftest import Sidecar, client_tls_env  # noqa: E402

import collectived  # noqa: E402
from collectived import Client, TlsOptions  # noqa: E402


def summary(samples):
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def store_sets(address, tls, count):
    store = collectived.StoreClient(address, tls=tls)
    store.set("warm", b"x")
    times = []
    for _ in range(count):
        start = time.perf_counter()
        store.set("k", b"v" * 64)
        times.append(time.perf_counter() - start)
    store.close()
    return times


def new_channels(address, tls, count):
    times = []
    for _ in range(count):
        start = time.perf_counter()
        store = collectived.StoreClient(address, tls=tls)
        store.set("k", b"v")
        times.append(time.perf_counter() - start)
        store.close()
    return times


def groups(sides, token, count, allreduces):
    create, reduce = [], []
    with Client(sides[0].unix_address, name="r0") as r0, \
            Client(sides[1].unix_address, name="r1") as r1:
        for _ in range(count):
            name = f"bench-{uuid.uuid4().hex[:8]}"
            start = time.perf_counter()
            joiner = threading.Thread(target=r1.create_group, args=(name, 1, 2), kwargs=dict(
                store_address=sides[0].tcp_address, timeout=60, job_token=token))
            joiner.start()
            r0.create_group(name, 0, 2, store_address=sides[0].tcp_address, timeout=60,
                            job_token=token)
            joiner.join()
            create.append(time.perf_counter() - start)
            x = [np.ones(2, np.float32), np.ones(2, np.float32)]
            for _ in range(allreduces):
                start = time.perf_counter()
                other = threading.Thread(target=r1.allreduce, args=(name, x[1]))
                other.start()
                r0.allreduce(name, x[0])
                other.join()
                reduce.append(time.perf_counter() - start)
            r0.destroy_group(name)
            r1.destroy_group(name)
    return create, reduce


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = client_tls_env()
    tls = TlsOptions(ca=env["COLLECTIVED_TLS_CA"], cert=env["COLLECTIVED_TLS_CERT"],
                     key=env["COLLECTIVED_TLS_KEY"])
    token = os.urandom(32).hex()
    results = {}
    with tempfile.TemporaryDirectory(prefix="cdb-") as tmp:
        secure = [Sidecar(tmp, f"tls{i}").start() for i in range(2)]
        plain = [Sidecar(tmp, f"plain{i}", tls=False).start() for i in range(2)]
        try:
            for round_index in range(args.rounds):
                cases = {
                    ("store set", "secure"): lambda: store_sets(secure[0].tcp_address, tls, 2000),
                    ("store set", "plain"): lambda: store_sets(plain[0].tcp_address,
                                                               TlsOptions(), 2000),
                    ("store set", "unix"): lambda: store_sets(secure[0].unix_address, None, 2000),
                    ("new channel", "secure"): lambda: new_channels(secure[0].tcp_address, tls,
                                                                    30),
                    ("new channel", "plain"): lambda: new_channels(plain[0].tcp_address,
                                                                   TlsOptions(), 30),
                }
                for key, run in cases.items():
                    results.setdefault(key, []).append(summary(run()))
                for label, sides, group_token in (("secure", secure, token), ("plain", plain, "")):
                    create, reduce = groups(sides, group_token, 10, 200)
                    results.setdefault(("create group", label), []).append(summary(create))
                    results.setdefault(("allreduce 8B", label), []).append(summary(reduce))
        finally:
            for side in secure + plain:
                side.stop()
    print(f"{'case':14s} {'sidecars':8s} {'p50 per round (us)':36s} {'p99 per round (us)':36s}")
    for (case, label), rounds in results.items():
        p50 = " ".join(f"{m * 1e6:9.0f}" for m, _ in rounds)
        p99 = " ".join(f"{p * 1e6:9.0f}" for _, p in rounds)
        print(f"{case:14s} {label:8s} {p50:36s} {p99:36s}")
    print("ratio secure / plain, median over rounds of the p50s:")
    for case in ("store set", "new channel", "create group", "allreduce 8B"):
        secure_p50 = statistics.median(m for m, _ in results[(case, "secure")])
        plain_p50 = statistics.median(m for m, _ in results[(case, "plain")])
        print(f"  {case:14s} {secure_p50 / plain_p50:5.2f}x  "
              f"({secure_p50 * 1e6:.0f} us vs {plain_p50 * 1e6:.0f} us)")


if __name__ == "__main__":
    main()
