"""A bounded soak (bench/soak.py, smaller): two rounds of mixed collectives checked exactly, with
sessions and groups churned meanwhile; the sidecars' RSS and open fds must not grow from the
end of round 1 to the end of round 2 beyond the bounds below. The figures are printed (-s)."""

import argparse
import importlib.util
import pathlib
import threading
import uuid

import numpy as np
import pytest

from collectived import Client
from torch_helpers import Sidecars

ROOT = pathlib.Path(__file__).resolve().parents[2]
RSS_BOUND = 64 << 20  # bytes of growth allowed between the end of round 1 and of round 2
FDS_BOUND = 8


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def soak_results():
    soak = load_soak()
    args = soak.parse_args(["--ops", "250", "--rounds", "2", "--clients", "4", "--sessions",
                            "100", "--groups", "100", "--timeout", "120"])
    results = soak.soak(args)
    print("\n" + soak.table(results))
    for res in results:
        for error in res["errors"][:5]:
            print(f"round {res['round']}: {error}")
    return results


def test_every_result_is_exact_and_no_op_fails(soak_results):
    for res in soak_results:
        assert res["ops"] == 4 * 250, res
        assert res["wrong"] == 0, res
        assert res["failed"] == 0, [e for e in res["errors"] if e.startswith("rank")]


def test_memory_and_fds_do_not_grow_between_rounds(soak_results):
    first, second = soak_results
    for node, (a, b) in enumerate(zip(first["sidecars"], second["sidecars"])):
        rss_growth = b["rss"][2] - a["rss"][2]
        fds_growth = b["fds"][2] - a["fds"][2]
        print(f"node{node}: RSS after round 1 {a['rss'][2] / (1 << 20):.1f} MiB, after round 2 "
              f"{b['rss'][2] / (1 << 20):.1f} MiB ({rss_growth / (1 << 20):+.1f}); fds "
              f"{a['fds'][2]} -> {b['fds'][2]}")
        assert rss_growth < RSS_BOUND
        assert fds_growth <= FDS_BOUND


@pytest.mark.xfail(strict=False, reason=(
    "racy: under concurrent load a few percent of two-rank group creations fail with "
    "UNAVAILABLE 'cannot connect the sidecars of group ...: [gloo/transport/tcp/pair.cc:799] "
    "connect ...: Connection reset by peer' (engine/group/gloo); once the sidecar aborted with "
    "'terminate called after throwing an instance of gloo::EnforceNotMet'"))
def test_group_churn_under_load_creates_every_group(soak_results):
    churn = [e for res in soak_results for e in res["errors"] if e.startswith(("group", "session"))]
    assert not churn, churn[:5]


@pytest.mark.xfail(strict=False, reason=(
    "racy (about 1 in 15 trials): a rank that destroys the group right after its last "
    "collective completed fails that collective on ranks of the other sidecar with PeerLost "
    "'rank r left group (it destroyed the group)'. Sidecar::LeaveGroup (engine/sidecar) fails "
    "the whole group for every peer, including ops the leaving rank already finished"))
def test_leaving_right_after_the_last_collective_does_not_fail_peers():
    sides = Sidecars(2)
    failures = []
    try:
        for trial in range(40):
            n = 4
            clients = [Client(sides[r % 2].unix_address) for r in range(n)]
            name = f"leave-{uuid.uuid4().hex[:8]}"
            errors = [None] * n

            def rank(r):
                try:
                    clients[r].create_group(name, r, n, store_address=sides[0].tcp_address,
                                            timeout=30)
                    clients[r].allreduce(name, np.ones(4, np.float32), timeout=30)
                    clients[r].barrier(name, timeout=30)
                    clients[r].close()  # leaves the group at once
                except Exception as error:  # noqa: BLE001 - collected
                    errors[r] = error
            threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            for client in clients:
                client.close()
            failures += [f"trial {trial}: {e!r}" for e in errors if e is not None]
    finally:
        codes = sides.stop()
    assert codes == [0, 0]
    assert not failures, failures[:4]
