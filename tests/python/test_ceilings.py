"""One client cannot starve the node: each resource a client can make the sidecar hold has a
share per client process and a sidecar-wide total. Each test drives one resource as a hostile
client would, within its share, checks the refusal names the resource, the limit and the flag,
checks that another process is served meanwhile, and that the sidecar serves again once the
attacker leaves. The other processes are helpers/another_client.py: a second client of the test's
own process would draw on the test's share."""
import json
import os
import resource
import socket
import subprocess
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest

from collectived import Client, ResourceExhaustedError
from conftest import BIN, Sidecar, collectivectl, unique
from torch_helpers import HELPERS, PYTHON, python_path


def refusals(side, resource_name):
    """collectived_resource_refusals_total{resource=...} as the sidecar exports it."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{side.metrics_port}/metrics",
                                  timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'collectived_resource_refusals_total{{resource="{resource_name}"}}'):
            return float(line.split()[-1])
    return 0.0


def metric(side, prefix):
    text = urllib.request.urlopen(f"http://127.0.0.1:{side.metrics_port}/metrics",
                                  timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def in_another_process(side, action, count=1, size=4096):
    """Runs helpers/another_client.py's ``action`` up to ``count`` times in a process of its own
    and returns its outcomes: None per success, the refusal's text last when one came."""
    env = dict(os.environ, PYTHONPATH=python_path())
    done = subprocess.run([PYTHON, str(HELPERS / "another_client.py"), side.unix_address, action,
                           str(count), str(size)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def served(side):
    """A fresh client in another process can attach and run a collective on a group of its
    own."""
    outcome = in_another_process(side, "served")
    assert outcome == [None], outcome
    return True


def unsealed_memfd(nbytes):
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    return fd


def open_descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def ceiling_sidecar(tmpdir_short, request):
    side = Sidecar(tmpdir_short, extra_args=request.param).start()
    yield side
    assert side.stop() == 0, side.log()


@pytest.mark.parametrize("ceiling_sidecar", [[
    "--client-max-descriptors", "40", "--max-descriptors", "60"]], indirect=True)
def test_descriptors_have_a_share_and_a_total_and_come_back(ceiling_sidecar):
    side = ceiling_sidecar
    # Two sessions of one process: they draw on one share.
    first, second = Client(side.unix_address), Client(side.unix_address)
    regions = []
    try:
        # Unsealed files keep their descriptor in the sidecar (to see them shrink); each
        # session's submission ring holds one too.
        def fill(client):
            for _ in range(100):
                try:
                    regions.append(client.register_fd(unsealed_memfd(4096), 4096))
                except ResourceExhaustedError as error:
                    return str(error)
            raise AssertionError("never refused")
        share = fill(first)
        assert "descriptors" in share and "--client-max-descriptors" in share \
            and "its share is 40" in share and f"client pid {os.getpid()} " in share, share
        assert len(regions) >= 37
        again = fill(second)  # a second session of the process has no share of its own
        assert "its share is 40" in again, again
        # Another process gets its share, up to the sidecar's total.
        outcomes = in_another_process(side, "register", 100)
        assert 15 <= len(outcomes) - 1 <= 20 and "--max-descriptors" in outcomes[-1] \
            and "its total is 60" in outcomes[-1], outcomes
        # Sealed buffers keep no descriptor: a victim still registers memory and is served.
        assert in_another_process(side, "allocate", 1, 1 << 16) == [None]
        assert served(side)
        assert refusals(side, "descriptors") >= 3
    finally:
        first.close()
        second.close()
    # The attackers left: what they held came back.
    with Client(side.unix_address) as later:
        for _ in range(35):
            later.register_fd(unsealed_memfd(4096), 4096)
    assert served(side)


@pytest.mark.parametrize("ceiling_sidecar", [["--client-max-buffers", "8", "--max-buffers", "20"]],
                         indirect=True)
def test_many_sessions_of_one_process_share_one_share(ceiling_sidecar):
    """The hoarder of the issue: sessions opened by one process, each within what a session
    could hold, used to register the sidecar's whole total between them."""
    side = ceiling_sidecar
    sessions = [Client(side.unix_address) for _ in range(22)]
    try:
        held, refused = [], []
        for client in sessions:
            try:
                held.append(client.allocate(4096))
                held.append(client.allocate(4096))
            except ResourceExhaustedError as error:
                refused.append(str(error))
        assert len(held) == 8, len(held)
        assert len(refused) == 22 - 4 and all(
            f"buffers: client pid {os.getpid()} uid {os.getuid()} holds 8, its share is 8" in r
            for r in refused), refused[:2]
        # Another process gets its whole share meanwhile.
        outcomes = in_another_process(side, "allocate", 9)
        assert outcomes[:8] == [None] * 8 and "its share is 8" in outcomes[8], outcomes
        assert served(side)
    finally:
        for client in sessions:
            client.close()


def test_sealed_buffers_keep_no_descriptor(sidecar):
    with Client(sidecar.unix_address) as client:
        before = open_descriptors(sidecar.process.pid)
        buffers = [client.allocate(4096) for _ in range(200)]
        after = open_descriptors(sidecar.process.pid)
        assert after - before < 20, (before, after)
        for buffer in buffers:
            buffer.close()


@pytest.mark.parametrize("ceiling_sidecar", [["--client-max-mapped-bytes", str(1 << 30),
                                              "--max-mapped-bytes", str(3 << 29)]],
                         indirect=True)
def test_sparse_files_cannot_take_the_address_space(ceiling_sidecar):
    side = ceiling_sidecar
    with Client(side.unix_address) as attacker:
        # A sparse 1 TiB file costs the client nothing and the sidecar a terabyte of mapping.
        with pytest.raises(ResourceExhaustedError) as huge:
            attacker.register_fd(unsealed_memfd(1 << 40), 1 << 40)
        assert "mapped_bytes" in str(huge.value) and "--client-max-mapped-bytes" in str(
            huge.value)
        held = [attacker.register_fd(unsealed_memfd(1 << 28), 1 << 28) for _ in range(3)]
        with pytest.raises(ResourceExhaustedError):  # 768 MiB and its ring held: over its share
            attacker.register_fd(unsealed_memfd(1 << 29), 1 << 29)
        # Another process: 256 MiB within its share and the total; 768 MiB within its share but
        # past the total.
        assert in_another_process(side, "register", 1, 1 << 28) == [None]
        outcomes = in_another_process(side, "register", 1, 3 << 28)  # within its share
        assert "--max-mapped-bytes" in outcomes[0], outcomes
        assert served(side)
        for region in held:
            region.close()
        attacker.register_fd(unsealed_memfd(1 << 29), 1 << 29)
    assert refusals(side, "mapped_bytes") >= 3


@pytest.mark.parametrize("ceiling_sidecar", [["--client-max-groups", "8", "--max-groups", "12"]],
                         indirect=True)
def test_groups_have_a_share_and_a_total(ceiling_sidecar):
    side = ceiling_sidecar
    with Client(side.unix_address) as attacker, Client(side.unix_address) as second:
        names = [unique("a") for _ in range(8)]
        for i, name in enumerate(names):
            (attacker if i % 2 else second).create_group(name, 0, 1, timeout=10)
        for client in (attacker, second):  # the process's share, whichever session asks
            with pytest.raises(ResourceExhaustedError) as share:
                client.create_group(unique("a"), 0, 1, timeout=10)
            assert "groups" in str(share.value) and "--client-max-groups" in str(share.value)
        # Another process gets the 4 left of the total, and no more.
        outcomes = in_another_process(side, "groups", 5)
        assert outcomes[:4] == [None] * 4 and "--max-groups" in outcomes[4], outcomes
        # Destroying a group gives its place back.
        second.destroy_group(names[0])
        attacker.create_group(unique("a"), 0, 1, timeout=10)
        assert served(side)
    assert served(side)
    assert refusals(side, "groups") >= 3


@pytest.mark.parametrize("ceiling_sidecar", [["--client-max-sessions", "2", "--max-sessions", "3"]],
                         indirect=True)
def test_sessions_are_bounded_and_come_back(ceiling_sidecar):
    side = ceiling_sidecar
    held = [Client(side.unix_address) for _ in range(2)]
    try:
        with pytest.raises(ResourceExhaustedError) as refused:
            Client(side.unix_address)
        assert "sessions" in str(refused.value) and "--client-max-sessions" in str(refused.value)
        # Another process attaches the one left of the total, not a second.
        outcomes = in_another_process(side, "sessions", 2)
        assert outcomes[0] is None and "--max-sessions" in outcomes[1], outcomes
    finally:
        for client in held:
            client.close()
    deadline = time.time() + 10
    while True:  # the sessions end as their streams close
        try:
            assert served(side)
            break
        except AssertionError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    assert refusals(side, "sessions") >= 2


@pytest.mark.parametrize("ceiling_sidecar", [[
    "--client-max-pending-bytes", str(48 << 20), "--max-pending-bytes", str(64 << 20)]],
                         indirect=True)
def test_pending_inline_bytes_are_bounded_and_memory_goes_back(ceiling_sidecar):
    side = ceiling_sidecar
    pid = side.process.pid
    waiter, attacker = Client(side.unix_address), Client(side.unix_address)
    name = unique("pending")
    joiner = threading.Thread(target=waiter.create_group, args=(name, 1, 2),
                              kwargs={"timeout": 20})
    joiner.start()
    attacker.create_group(name, 0, 2, timeout=20)
    joiner.join()
    before = rss_bytes(pid)
    payload = np.ones(16384, np.float32)  # 64 KiB inline, pending: rank 1 never joins in
    works, refused = [], None
    for _ in range(2000):
        try:
            work = attacker.allreduce(name, payload.copy(), async_op=True, timeout=60)
        except ResourceExhaustedError as error:  # refused at once on the session stream
            refused = error
            break
        works.append(work)
    # Through the submission ring a refusal arrives as the op's completion.
    deadline = time.time() + 10
    while refused is None and time.time() < deadline:
        refused = next((work.exception() for work in works if work.is_completed() and
                        isinstance(work.exception(), ResourceExhaustedError)), None)
        time.sleep(0.05)
    assert refused is not None, "2000 pending ops of 64 KiB were never refused"
    assert "pending_bytes" in str(refused) and "--client-max-pending-bytes" in str(refused)
    held = rss_bytes(pid)
    assert served(side)
    attacker.close()
    waiter.close()
    # The session's payloads are freed and given back to the system.
    deadline = time.time() + 10
    while rss_bytes(pid) - before > (16 << 20) and time.time() < deadline:
        time.sleep(0.2)
    after = rss_bytes(pid)
    print(f"sidecar RSS: before {before >> 20} MiB, holding {held >> 20} MiB, "
          f"after the session ended {after >> 20} MiB")
    assert held - before > (32 << 20), (before, held)
    assert after - before < (16 << 20), (before, held, after)


HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def health_status(channel):
    """The overall health as the sidecar answers on `channel`: 1 SERVING, 2 NOT_SERVING."""
    check = channel.unary_unary(HEALTH_CHECK, request_serializer=lambda raw: raw,
                                response_deserializer=lambda raw: raw)
    answer = check(b"", timeout=10)  # HealthCheckRequest{service: ""}
    return answer[1] if len(answer) >= 2 and answer[0] == 0x08 else 0


def test_out_of_descriptors_the_sidecar_rests_says_so_and_recovers(tmpdir_short):
    side = Sidecar(tmpdir_short)
    # A low limit that the sidecar cannot raise (soft = hard), so that connections exhaust it.
    side.args = ["prlimit", "--nofile=256:256", "--", *side.args]
    side.start()
    pid = side.process.pid
    flood = []
    try:
        victim = Client(side.unix_address)
        name = unique("victim")
        victim.create_group(name, 0, 1, timeout=10)
        assert health_status(victim._channel) == 1
        for _ in range(400):
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.connect(side.socket_path)  # queued by the kernel even when not accepted
            flood.append(connection)
        deadline = time.time() + 10
        while "cannot accept connections" not in side.log() and time.time() < deadline:
            time.sleep(0.1)
        assert "cannot accept connections" in side.log()
        # Resting, not spinning on the queued connections.
        start = cpu_seconds(pid)
        time.sleep(2)
        spent = cpu_seconds(pid) - start
        print(f"sidecar CPU while out of descriptors: {spent:.2f} s in 2 s")
        assert spent < 0.5, spent
        # The connection it already had is served, and told that the sidecar is not serving.
        x = np.ones(4, np.float32)
        victim.allreduce(name, x)
        assert health_status(victim._channel) == 2
        for connection in flood:
            connection.close()
        flood = []
        # It tries again by itself (at most a second apart) and accepts again.
        deadline = time.time() + 10
        while "accepting connections again" not in side.log() and time.time() < deadline:
            time.sleep(0.1)
        assert "accepting connections again" in side.log()
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a connection of its own
        probe.connect(side.socket_path)
        probe.close()
        assert served(side)
        assert health_status(victim._channel) == 1
        assert metric(side, 'collectived_listener_exhausted_total{listener="unix"}') >= 1
        victim.close()
    finally:
        for connection in flood:
            connection.close()
        assert side.stop() == 0, side.log()
