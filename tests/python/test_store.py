"""The rendezvous store from Python: StoreClient and collectived.torch.Store against real
sidecars, including PyTorch's own Gloo backend rendezvousing through collectived."""

import datetime
import os
import subprocess
import sys
import threading
import time

import pytest

import collectived
from collectived import StoreClient


def test_every_operation(sidecar):
    store = StoreClient(sidecar.unix_address)
    store.set("a", b"\x00bytes")
    assert store.get("a") == b"\x00bytes"
    store.set("s", "text")
    assert store.get("s") == b"text"
    assert store.add("n", 5) == 5
    assert store.add("n", -2) == 3
    assert store.get("n") == b"3"
    assert store.compare_set("cs", b"", b"first") == b"first"
    assert store.compare_set("cs", b"nope", b"second") == b"first"
    assert store.compare_set("cs", b"first", b"second") == b"second"
    assert store.compare_set("absent", b"x", b"y") == b"x"
    assert store.check(["a", "n"]) and not store.check(["a", "absent"])
    store.wait(["a", "n"], timeout=1)
    store.multi_set(["m1", "m2"], [b"1", "2"])
    assert store.multi_get(["m2", "m1"]) == [b"2", b"1"]
    store.append("log", b"ab")
    store.append("log", "cd")
    assert store.get("log") == b"abcd"
    assert store.delete_key("log") is True
    assert store.delete_key("log") is False
    assert store.num_keys() == 6  # a, s, n, cs, m1, m2


def test_get_of_missing_key_times_out_after_one_second(sidecar):
    store = StoreClient(sidecar.unix_address)
    start = time.monotonic()
    with pytest.raises(collectived.TimeoutError) as error:
        store.get("never", timeout=datetime.timedelta(seconds=1))
    elapsed = time.monotonic() - start
    assert "Timeout after 1000 ms" in str(error.value) and "'never'" in str(error.value)
    assert elapsed >= 1.0  # it waited its timeout (no upper bound: a shared machine stalls)
    assert isinstance(error.value, RuntimeError)


def test_waiters_are_released_by_a_set_on_another_sidecar_connection(sidecar):
    waiter = StoreClient(sidecar.unix_address, timeout=10)
    setter = StoreClient(sidecar.tcp_address)
    results = []
    threads = [threading.Thread(target=lambda: results.append(waiter.get("go")))
               for _ in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    setter.set("go", b"now")
    for thread in threads:
        thread.join(10)
    assert results == [b"now"] * 16


def test_prefixes_namespace_keys(sidecar):
    root = StoreClient(sidecar.unix_address)
    job_a = root.with_prefix("jobA")
    job_b = StoreClient(sidecar.unix_address, prefix="jobB")
    job_a.set("k", b"a")
    job_b.set("k", b"b")
    assert job_a.get("k") == b"a" and job_b.get("k") == b"b"
    assert root.get("jobA/k") == b"a"
    assert job_a.with_prefix("inner").prefix == "jobA/inner"


def test_address_from_environment(sidecar, monkeypatch):
    monkeypatch.setenv("COLLECTIVED_ADDRESS", sidecar.tcp_address)
    store = StoreClient()
    assert store.address == sidecar.tcp_address
    store.set("env", b"1")
    assert store.get("env") == b"1"


def test_bad_input_raises_clear_errors_and_the_sidecar_survives(sidecar):
    store = StoreClient(sidecar.unix_address)
    store.set("text", b"abc")
    cases = [
        (lambda: store.set("", b"v"), "empty"),
        (lambda: store.set("k" * 5000, b"v"), "5000"),
        (lambda: store.add("text", 1), "'text'"),
        (lambda: store.get("k", timeout=-1), "negative"),
        (lambda: store.wait(["k"], timeout=datetime.timedelta(days=365)), "7 days"),
    ]
    for call, expected in cases:
        with pytest.raises(collectived.InvalidArgumentError) as error:
            call()
        assert expected in str(error.value)
        assert isinstance(error.value, ValueError)
    with pytest.raises(ValueError):
        store.multi_set(["a", "b"], [b"1"])
    store.set("still", b"alive")
    assert store.get("still") == b"alive"


def test_torch_store_through_torch_prefix_store(sidecar):
    import torch.distributed as dist

    from collectived.torch import Store

    store = Store(sidecar.unix_address, timeout=datetime.timedelta(seconds=5))
    assert isinstance(store, dist.Store)
    prefixed = dist.PrefixStore("pg", store)  # C++ PrefixStore calling back into Python
    prefixed.set("k", "v")
    assert prefixed.get("k") == b"v"
    assert prefixed.add("n", 3) == 3
    assert prefixed.compare_set("c", "", "d") == b"d"
    prefixed.wait(["k"], datetime.timedelta(seconds=1))
    assert StoreClient(sidecar.unix_address).get("pg/k") == b"v"
    store.set_timeout(datetime.timedelta(seconds=1))
    # The new timeout is the one the wait used (the message names it; a bound on the elapsed
    # time would be a timing assertion on a shared machine).
    with pytest.raises(RuntimeError, match="Timeout after 1000 ms waiting for key 'pg/missing'"):
        prefixed.get("missing")


def test_a_torch_store_list_writes_to_each_and_outlives_its_first_store(tmpdir_short):
    """collectived.torch.Store over several sidecars' stores: each write reaches every one, reads
    come from the first that answers, and a wait on a store that dies goes on on the next."""
    from collectived.torch import Store
    from conftest import Sidecar, start_all

    sides = start_all([Sidecar(tmpdir_short, f"node{i}") for i in range(3)])
    killed = set()

    def kill(i):
        sides[i].process.kill()
        sides[i].process.wait()
        killed.add(i)

    try:
        store = Store(",".join(side.tcp_address for side in sides),
                      timeout=datetime.timedelta(seconds=20))
        store.set("k", "v")
        assert store.add("n", 2) == 2
        for side in sides:
            assert StoreClient(side.tcp_address).get("k") == b"v"
        kill(0)
        assert store.get("k") == b"v"
        assert store.add("n", 1) == 3
        store.set("after", "x")
        assert [StoreClient(s.tcp_address).get("after") for s in sides[1:]] == [b"x"] * 2
        got = []
        waiter = threading.Thread(target=lambda: got.append(store.get("later")))
        waiter.start()
        time.sleep(0.3)
        kill(1)
        StoreClient(sides[2].tcp_address).set("later", b"y")
        waiter.join(timeout=30)
        assert got == [b"y"]
        kill(2)
        with pytest.raises(collectived.UnavailableError):
            store.get("k")
    finally:
        for i, side in enumerate(sides):
            if i not in killed:
                assert side.stop() == 0, side.log()
    with pytest.raises(ValueError, match="empty or repeated entry"):
        Store("localhost:1,,localhost:2")
    with pytest.raises(ValueError, match="empty or repeated entry"):
        Store("localhost:1,localhost:1")


def test_a_groups_store_address_list_is_checked(sidecar):
    client = collectived.Client(sidecar.unix_address)
    try:
        for bad, why in [("a:1,,b:2", "entry 2 is empty"), ("a:1,b:2,a:1", "listed twice"),
                         (",".join(f"h{i}:1" for i in range(17)), "more than 16 stores")]:
            with pytest.raises(collectived.InvalidArgumentError, match=why):
                client.create_group("g", 0, 1, store_address=bad, timeout=5)
        # The sidecar goes on.
        assert client.create_group("g", 0, 1, timeout=5).group_size == 1
    finally:
        client.close()


WORKER = os.path.join(os.path.dirname(__file__), "helpers", "gloo_rendezvous_worker.py")


def test_two_processes_rendezvous_pytorch_gloo_through_collectived(two_sidecars):
    # The store lives on node0's sidecar; rank 0 reaches it over its Unix socket, rank 1 (on
    # "node1") over TCP, as a remote node would.
    store_sidecar = two_sidecars[0]
    env = dict(os.environ)
    procs = []
    for rank, address in enumerate([store_sidecar.unix_address, store_sidecar.tcp_address]):
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, address, str(rank), "2"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out}"
        assert "allreduce ok: 3.0" in out, out
