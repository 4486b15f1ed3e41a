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


def test_group_churn_under_load_fails_only_with_clear_transient_errors(soak_results):
    """Known weakness, measured rather than hidden: under concurrent ops and session churn, a few
    two-rank group creations fail while Gloo connects the sidecars (a pair's connection is reset:
    UNAVAILABLE "cannot connect the sidecars of group ..."); a retry succeeds. Nothing else may
    fail, and the sidecars survive (a reset used to terminate them inside Gloo)."""
    churn = [e for res in soak_results for e in res["errors"] if e.startswith(("group", "session"))]
    created = sum(res["groups"] for res in soak_results)
    print(f"\ngroup churn: {len(churn)} of {created} creations failed transiently")
    unexpected = [e for e in churn if "UnavailableError" not in e or
                  "cannot connect the sidecars of group" not in e]
    assert not unexpected, unexpected[:5]
    assert len(churn) <= created // 10, churn[:5]


# A rank that destroys the group right after its last collective must not fail that collective
# on the ranks of another sidecar (the group's failure carries the last sequence number the
# leaver completed; peers let that op finish). Before that, about 1 trial in 15 failed here.
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
