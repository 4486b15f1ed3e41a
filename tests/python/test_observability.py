"""Observability against real sidecars: exact metric values for a known workload, stragglers,
the flight recorder of a hung op, operator aborts (and the backend aborts they count), the
stuck-op watchdog, bounded label
cardinality, and a real Prometheus server scraping two sidecars."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

import collectived
from conftest import Sidecar, collectivectl, free_port, start_all


def metrics(side):
    with urllib.request.urlopen(f"http://127.0.0.1:{side.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def value(text, name, **labels):
    """The value of the series `name` whose labels include `labels` (None if absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def run_ranks(addresses, body):
    """Runs body(rank, client) on one thread per rank; re-raises the first failure."""
    errors = []
    clients = [collectived.Client(a) for a in addresses]

    def main(rank):
        try:
            body(rank, clients[rank])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
    threads = [threading.Thread(target=main, args=(r,)) for r in range(len(addresses))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return clients, errors


@pytest.fixture
def pair(tmpdir_short):
    sides = start_all([Sidecar(tmpdir_short, f"obs{i}", extra_args=["--stuck-threshold-ms", "500"])
                       for i in range(2)])
    yield sides
    for side in sides:
        assert side.stop() == 0, side.log()


def test_known_workload_gives_exact_counts_and_bytes(pair):
    n_ops, count = 25, 1000  # 25 ops of 4000 bytes
    addresses = [pair[0].unix_address, pair[1].unix_address]

    def body(rank, client):
        client.create_group("exact", rank, 2, store_address=pair[0].tcp_address, timeout=30)
        x = client.empty(count, np.float32)
        for _ in range(n_ops):
            client.allreduce("exact", x)
    clients, errors = run_ranks(addresses, body)
    assert not errors, errors
    for side in pair:
        text = metrics(side)
        assert value(text, "collectived_ops_total", group="exact", op="allreduce", status="ok") == n_ops
        assert value(text, "collectived_bytes_total", group="exact", op="allreduce",
                     dtype="float32") == n_ops * count * 4
        assert value(text, "collectived_op_latency_seconds_count", group="exact",
                     op="allreduce") == n_ops
        assert value(text, "collectived_busbw_bytes_per_second", op="allreduce") > 0
        assert value(text, "collectived_sessions") == 1
        assert value(text, "collectived_groups") == 1
        assert value(text, "collectived_peers") == 1
        # Nothing failed: no backend error or abort series exists.
        assert "collectived_backend_aborts_total{" not in text
        assert "collectived_backend_errors_total{" not in text
    for c in clients:
        c.close()


@pytest.mark.parametrize("layout", ["one rank", "two ranks, one sidecar", "two sidecars"])
def test_a_clean_destroy_counts_no_backend_abort(pair, layout):
    """create, allreduce, destroy: nothing was aborted, and no alert may fire for it."""
    addresses = {"one rank": [pair[0].unix_address],
                 "two ranks, one sidecar": [pair[0].unix_address] * 2,
                 "two sidecars": [pair[0].unix_address, pair[1].unix_address]}[layout]
    name = f"clean-{len(addresses)}-{layout[:3].strip()}"

    def body(rank, client):
        client.create_group(name, rank, len(addresses), store_address=pair[0].tcp_address,
                            timeout=30)
        client.allreduce(name, np.ones(8, np.float32))
        client.destroy_group(name)
    clients, errors = run_ranks(addresses, body)
    assert not errors, errors
    for c in clients:
        c.close()
    for side in pair:
        text = metrics(side)
        assert "collectived_backend_aborts_total{" not in text, [
            line for line in text.splitlines() if "backend_aborts_total{" in line]


def test_groups_named_by_their_job_carry_a_job_name_label(pair):
    """A torch backend's group `<job>-pg<i>-<hex>` is labelled job_name="<job>" (a function of
    the group label: no series more); any other name has an empty job_name."""
    names = ["resnet.run-7-pg0-1a2b3c4d", "resnet.run-7-pg12-00ff00ff", "pg-0123456789abcdef",
             "plain", "odd-pg-1a2b", "x-pgA-12"]

    def body(rank, client):
        for name in names:
            client.create_group(name, 0, 1, timeout=30)
            client.allreduce(name, np.ones(4, np.float32))
    clients, errors = run_ranks([pair[0].unix_address], body)
    assert not errors, errors
    text = metrics(pair[0])
    expected = {"resnet.run-7-pg0-1a2b3c4d": "resnet.run-7", "resnet.run-7-pg12-00ff00ff":
                "resnet.run-7", "pg-0123456789abcdef": "", "plain": "", "odd-pg-1a2b": "",
                "x-pgA-12": ""}
    for name, job in expected.items():
        assert value(text, "collectived_ops_total", group=name, job_name=job, op="allreduce") == 1, \
            (name, [line for line in text.splitlines() if name in line][:3])
        assert value(text, "collectived_inflight_ops", group=name, job_name=job) == 0
    for c in clients:
        c.close()


def test_process_metrics_have_the_standard_names(pair):
    text = metrics(pair[0])
    pid = pair[0].process.pid
    assert value(text, "process_resident_memory_bytes") > 1 << 20
    fds = value(text, "process_open_fds")
    assert 0 < fds <= len(os.listdir(f"/proc/{pid}/fd")) + 8
    assert value(text, "process_max_fds") >= fds
    assert value(text, "process_cpu_seconds_total") >= 0  # clock ticks: 0 for an idle new one
    assert value(text, "process_threads") >= 4
    assert value(text, "process_start_time_seconds") > time.time() - 3600
    assert "# TYPE process_cpu_seconds_total counter" in text
    # The ceilings are visible too.
    assert value(text, "collectived_resource_limit", resource="groups") == 16384
    assert value(text, "collectived_resource_in_use", resource="sessions") is not None


def test_a_rank_that_sleeps_is_named_the_straggler(pair):
    addresses = [pair[0].unix_address, pair[1].unix_address]

    def body(rank, client):
        client.create_group("slow", rank, 2, store_address=pair[0].tcp_address, timeout=30)
        x = client.empty(16, np.float32)
        for _ in range(8):
            if rank == 1:
                time.sleep(0.05)
            client.allreduce("slow", x)
    clients, errors = run_ranks(addresses, body)
    assert not errors, errors
    slow_side = metrics(pair[1])
    assert value(slow_side, "collectived_straggler_total", group="slow", rank="1") >= 7
    assert value(metrics(pair[0]), "collectived_straggler_total", group="slow", rank="0") is None
    assert value(slow_side, "collectived_arrival_skew_seconds_count", group="slow",
                 op="allreduce") == 8
    # Most arrivals are skewed by the 50 ms sleep: few fall in the buckets up to 10 ms.
    buckets = {}
    for line in slow_side.splitlines():
        if line.startswith("collectived_arrival_skew_seconds_bucket{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if labels["group"] == "slow" and labels["op"] == "allreduce" and labels["le"] != "+Inf":
                buckets[float(labels["le"])] = float(line.rsplit(" ", 1)[1])
    assert buckets, slow_side
    assert max(v for le, v in buckets.items() if le <= 0.01) <= 1
    for c in clients:
        c.close()


def test_flight_recorder_shows_a_hung_op_with_the_missing_rank(pair):
    a, b = collectived.Client(pair[0].unix_address), collectived.Client(pair[1].unix_address)
    done = threading.Event()

    def join(client, rank):
        client.create_group("hung", rank, 2, store_address=pair[0].tcp_address, timeout=30)
    threads = [threading.Thread(target=join, args=(c, r)) for r, c in enumerate((a, b))]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    x = a.empty(8, np.float32)
    first = a.allreduce("hung", x, async_op=True)
    b.allreduce("hung", b.empty(8, np.float32))
    first.wait(30)
    work = a.allreduce("hung", x, async_op=True, timeout=60)  # rank 1 never issues seq 2
    time.sleep(1.2)  # past the 500 ms stuck threshold
    out = collectivectl("--address", pair[0].unix_address, "flight-recorder", "hung", "--json")
    assert out.returncode == 0, out.stderr
    ops = json.loads(out.stdout)["ops"]
    completed = [o for o in ops if o["state"] == "completed"]
    assert completed and completed[0]["sequenceNumber"] == "1" and completed[0]["op"] == "allreduce"
    assert len(completed[0]["rankArrivalUs"]) == 2
    hung = [o for o in ops if o["state"] != "completed"]
    assert hung and hung[0]["sequenceNumber"] == "2"
    # The sidecar hosting rank 1 names it as missing; rank 0's sidecar shows its op running.
    out_b = collectivectl("--address", pair[1].unix_address, "describe", "hung")
    assert out_b.returncode == 0
    out_a = collectivectl("--address", pair[0].unix_address, "describe", "hung")
    assert "seq 2 allreduce running" in out_a.stdout, out_a.stdout
    assert "stuck" in pair[0].log() or "collective stuck" in pair[0].log()
    assert value(metrics(pair[0]), "collectived_stuck_ops_total", group="hung") == 1
    assert value(metrics(pair[0]), "collectived_inflight_ops", group="hung") == 1
    assert value(metrics(pair[0]), "collectived_oldest_inflight_op_age_seconds", group="hung") > 1
    # The operator aborts the group: the pending op fails on the spot.
    out = collectivectl("--address", pair[0].unix_address, "abort", "--admin-token-file",
                        pair[0].admin_token_file, "hung", "drill")
    assert out.returncode == 0, out.stderr
    with pytest.raises(collectived.AbortedError, match="aborted by an operator: drill"):
        work.wait(10)
    with pytest.raises(collectived.AbortedError, match="aborted by an operator"):
        b.allreduce("hung", b.empty(8, np.float32), timeout=10)
    # Both sidecars tore the group's Gloo connections down because of the abort, once each. A
    # sidecar counts it once the teardown is over, which can be after an op submitted meanwhile
    # was refused (the group's failure is set first): give the count a moment.
    for side in pair:
        deadline = time.monotonic() + 10
        while value(metrics(side), "collectived_backend_aborts_total", group="hung",
                    backend="gloo", reason="aborted") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert value(metrics(side), "collectived_backend_aborts_total", group="hung",
                     backend="gloo", reason="aborted") == 1, metrics(side)
    done.set()
    a.close()
    b.close()


def test_the_python_client_reads_the_flight_recorder(pair):
    """Client.flight_recorder: the last ops of one group or of all, their arrival and stages."""
    with collectived.Client(pair[0].unix_address) as client:
        client.create_group("solo", 0, 1, timeout=30)
        client.create_group("other", 0, 1, timeout=30)
        before = int(time.time() * 1e6)
        for _ in range(5):
            client.allreduce("solo", np.ones(4, np.float32))
        client.broadcast("other", np.ones(2, np.int64), 0)
        records = client.flight_recorder("solo", limit=3)
        assert [r.sequence_number for r in records] == [3, 4, 5]
        for record in records:
            assert record.group == "solo" and record.op == "allreduce" and record.count == 4
            assert record.state == "completed" and record.device == "cpu"
            assert record.issued_unix_us >= before and record.duration_us >= 0
            assert 0 <= record.data_started_us <= record.duration_us
            assert record.enqueued_us == -1 and record.device_done_us == -1  # CUDA groups only
        assert [r.issued_unix_us for r in records] == sorted(r.issued_unix_us for r in records)
        everything = client.flight_recorder()
        assert {r.group for r in everything} >= {"solo", "other"}
        assert len([r for r in everything if r.group == "solo"]) == 5
        with pytest.raises(collectived.NotFoundError, match="unknown group 'nope'"):
            client.flight_recorder("nope")
        with pytest.raises(collectived.InvalidArgumentError, match="must not be negative"):
            client.flight_recorder("solo", limit=-1)


def test_label_cardinality_stays_bounded_over_a_thousand_groups(tmpdir_short):
    side = Sidecar(tmpdir_short, "card", extra_args=["--metrics-max-groups", "16"]).start()
    try:
        with collectived.Client(side.unix_address) as client:
            x = client.empty(4, np.float32)
            for i in range(1000):
                name = f"g{i}"
                client.create_group(name, 0, 1, timeout=10)
                client.allreduce(name, x)
                client.destroy_group(name)
        text = metrics(side)
        groups = set(re.findall(r'collectived_ops_total\{[^}]*group="([^"]*)"', text))
        assert 1 <= len(groups) <= 16, groups
        series = [line for line in text.splitlines() if line.startswith("collectived_")]
        assert len(series) < 2000, len(series)
    finally:
        assert side.stop() == 0, side.log()


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus package is not installed")
def test_real_prometheus_scrapes_two_sidecars(pair):
    GROUP = "promjob-pg0-0badcafe"  # a torch backend's name: job promjob
    port = free_port()
    work = tempfile.mkdtemp(prefix="prom-")
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: collectived
    static_configs:
      - targets: ["127.0.0.1:{pair[0].metrics_port}", "127.0.0.1:{pair[1].metrics_port}"]
""")
    server = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                               f"--storage.tsdb.path={work}/data",
                               f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(expr):
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]
    try:
        addresses = [pair[0].unix_address, pair[1].unix_address]

        def body(rank, client):
            client.create_group(GROUP, rank, 2, store_address=pair[0].tcp_address, timeout=30)
            x = client.empty(1024, np.float32)
            for _ in range(20):
                if rank == 1:
                    time.sleep(0.02)
                client.allreduce(GROUP, x)
            time.sleep(4)  # stay alive across a few scrapes
        clients, errors = run_ranks(addresses, body)
        assert not errors, errors
        deadline = time.time() + 30
        ops = []
        while time.time() < deadline:
            try:
                ops = query(f'collectived_ops_total{{group="{GROUP}",op="allreduce",status="ok"}}')
            except OSError:
                ops = []
            if len(ops) == 2 and all(float(s["value"][1]) == 20 for s in ops):
                break
            time.sleep(1)
        assert len(ops) == 2 and all(float(s["value"][1]) == 20 for s in ops), ops
        # job_name comes through as exposed; "job" stays Prometheus's own (the scrape job).
        assert {(s["metric"]["job_name"], s["metric"]["job"]) for s in ops} == {
            ("promjob", "collectived")}
        assert {s["metric"]["instance"] for s in ops} == {
            f"127.0.0.1:{pair[0].metrics_port}", f"127.0.0.1:{pair[1].metrics_port}"}
        p50 = query('histogram_quantile(0.5, sum by (le) '
                    f'(collectived_op_latency_seconds_bucket{{group="{GROUP}",op="allreduce"}}))')
        assert p50 and float(p50[0]["value"][1]) > 0
        stragglers = query(f'collectived_straggler_total{{group="{GROUP}"}}')
        assert any(s["metric"]["rank"] == "1" and float(s["value"][1]) >= 15 for s in stragglers), stragglers
        for c in clients:
            c.close()
    finally:
        server.terminate()
        server.wait(20)
        shutil.rmtree(work, ignore_errors=True)


def test_a_failed_group_leaves_a_post_mortem(tmpdir_short):
    """Group `late`: rank 1 never issues the second allreduce, the op times out. After both
    trainers are gone the sidecar still shows the group's final state and flight records, has
    logged the failure once with the rank that did not arrive, and wrote it as JSON."""
    directory = os.path.join(tmpdir_short, "post-mortems")
    side = Sidecar(tmpdir_short, "pm", extra_args=["--post-mortem-dir", directory]).start()
    try:
        a, b = collectived.Client(side.unix_address), collectived.Client(side.unix_address)
        joiner = threading.Thread(target=b.create_group, args=("late", 1, 2),
                                  kwargs={"timeout": 2})
        joiner.start()
        a.create_group("late", 0, 2, timeout=2)
        joiner.join()
        x = np.ones(4, np.float32)
        done = threading.Thread(target=b.allreduce, args=("late", x.copy()))
        done.start()
        a.allreduce("late", x)
        done.join()
        with pytest.raises(collectived.TimeoutError):
            a.allreduce("late", x)  # rank 1 never issues sequence number 2
        a.close()
        b.close()
        deadline = time.time() + 10
        def late_line():
            listed = collectivectl("--address", side.unix_address, "groups").stdout
            return next((line for line in listed.splitlines() if line.startswith("late ")), "")
        while "(gone)" not in late_line() and time.time() < deadline:
            time.sleep(0.1)
        # The group is gone; its post-mortem is not, and `groups` still lists it as such.
        assert "failed (gone)" in late_line(), late_line()
        described = collectivectl("--address", side.unix_address, "describe", "late")
        assert described.returncode == 0, described.stderr
        assert "failed (gone)" in described.stdout, described.stdout
        assert "seq 2 allreduce" in described.stdout, described.stdout
        recorder = collectivectl("--address", side.unix_address, "flight-recorder", "late",
                                 "--json")
        assert recorder.returncode == 0, recorder.stderr
        ops = json.loads(recorder.stdout)["ops"]
        assert [o["sequenceNumber"] for o in ops][:1] == ["1"] and ops[0]["state"] == "completed"
        assert any(o["sequenceNumber"] == "2" for o in ops), ops
        limited = json.loads(collectivectl("--address", side.unix_address, "flight-recorder",
                                           "late", "--limit", "1", "--json").stdout)["ops"]
        assert len(limited) == 1, limited
        # Logged once, with the op and the rank that never arrived.
        log = side.log()
        assert log.count('msg="group failed" group=late') == 1, log
        assert re.search(r'msg="op failed with its group" group=late op=allreduce '
                         r'sequence_number=2 .*ranks_not_arrived=1', log), log
        # Written as JSON at the moment of failure.
        files = [f for f in os.listdir(directory) if f.startswith("late.")]
        assert len(files) == 1, os.listdir(directory)
        with open(os.path.join(directory, files[0])) as f:
            record = json.load(f)
        assert record["format"] == "collectived.post_mortem.v1"
        assert record["group"] == "late" and record["failure"]["kind"] == "timeout"
        assert record["members"] == [0, 1] and record["local_group_ranks"] == [0, 1]
        waiting = [o for o in record["ops"] if o["sequence_number"] == 2]
        assert waiting and waiting[0]["ranks_not_arrived"] == [1], record["ops"]
    finally:
        assert side.stop() == 0, side.log()


def test_describe_cluster_names_the_rank_that_never_arrived(pair):
    """Two sidecars, rank 1 never issues the second allreduce: one command, run against either
    sidecar, shows every rank, where it is, and that rank 1 never issued sequence number 2; with
    rank 1's sidecar gone it says so."""
    a, b = collectived.Client(pair[0].unix_address), collectived.Client(pair[1].unix_address)
    name = "cluster-late"
    joiner = threading.Thread(target=b.create_group, args=(name, 1, 2),
                              kwargs={"store_address": pair[0].tcp_address, "timeout": 30})
    joiner.start()
    a.create_group(name, 0, 2, store_address=pair[0].tcp_address, timeout=30)
    joiner.join()
    x = np.ones(4, np.float32)
    other = threading.Thread(target=b.allreduce, args=(name, x.copy()))
    other.start()
    a.allreduce(name, x)
    other.join()
    work = a.allreduce(name, x, async_op=True, timeout=60)  # rank 1 never issues seq 2
    time.sleep(0.5)
    for side in pair:
        out = collectivectl("--address", side.unix_address, "describe", name, "--cluster")
        print(out.stdout)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == f"group {name}: 2 ranks on 2 sidecars", out.stdout
        rank0 = next(l for l in lines if l.startswith("0 "))
        rank1 = next(l for l in lines if l.startswith("1 "))
        assert pair[0].tcp_address in rank0 and "issued seq 2 allreduce, waiting" in rank0, rank0
        assert pair[1].tcp_address in rank1 and "never issued seq 2 allreduce" in rank1, rank1
        assert "seq 1" in rank0 and "seq 1" in rank1
    # Rank 1's sidecar dies: the picture says so instead of failing.
    pair[1].process.kill()
    pair[1].process.wait()
    out = collectivectl("--address", pair[0].unix_address, "--timeout-ms", "3000", "describe",
                        name, "--cluster")
    print(out.stdout)
    assert out.returncode == 0, out.stderr
    rank1 = next(l for l in out.stdout.splitlines() if l.startswith("1 "))
    assert "gone or unreachable" in rank1, out.stdout
    with pytest.raises(collectived.CollectivedError):
        work.wait(30)
    a.close()
    b.close()
    pair[1].start()  # the fixture stops both


def test_a_shrinking_group_counts_its_membership_change_and_describe_shows_it(pair):
    """4 ranks on 2 sidecars in a group that shrinks: rank 3 leaves; each sidecar counts one
    membership change, and `collectivectl describe` shows the epoch and the lost rank."""
    name = "obs-shrink"
    addresses = [pair[r // 2].unix_address for r in range(4)]
    clients, errors = run_ranks(addresses, lambda rank, client: client.create_group(
        name, rank, 4, store_address=pair[0].tcp_address, timeout=30, fault_tolerance="shrink"))
    assert not errors, errors
    clients[3].close()

    def survivor(rank):
        tensor = np.ones(4, np.float32)
        clients[rank].allreduce(name, tensor)
        assert (tensor == 4.0).all(), tensor
    threads = [threading.Thread(target=survivor, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for side in pair:
        assert value(metrics(side), "collectived_membership_changes_total",
                     reason="rank_lost") == 1.0, metrics(side)
    out = collectivectl("--address", pair[0].unix_address, "describe", name)
    assert out.returncode == 0, out.stderr
    assert "membership epoch 1: lost group ranks [3]" in out.stdout, out.stdout
    assert out.stdout.startswith(f"group {name}: size 4"), out.stdout
    for client in clients[:3]:
        client.close()
