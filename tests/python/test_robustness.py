"""A sidecar under requests it must survive: malformed messages, quotas,
abandoned joins, SIGTERM (drain) and SIGKILL (restart on the same socket).

Every test runs real collectived processes on loopback; each checks the clear error the client
gets and that the sidecar keeps serving (or, for the shutdown tests, that it ends as it must).
"""

import json
import os
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

import collectived
from collectived import Client
from raw.raw_client import RawClient
from collectived.v1 import group_pb2, group_pb2_grpc, session_pb2
from conftest import BIN, Sidecar, collectivectl, healthy, two_rank_group, unique
from torch_helpers import HELPERS, PYTHON, python_path






def single_rank_allreduce_works(address):
    with Client(address, name="probe") as client:
        name = unique("probe")
        client.create_group(name, 0, 1, timeout=20)
        data = np.arange(16, dtype=np.float32)
        out = data.copy()
        client.allreduce(name, out)  # in place
        np.testing.assert_array_equal(out, data)


def thread_count(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")




@pytest.fixture
def side(tmpdir_short):
    sidecar = Sidecar(tmpdir_short, extra_args=(
        "--metrics", "", "--client-max-pending-ops", "8",
        "--client-max-pending-bytes", str(3 << 19), "--client-max-buffers", "4")).start()
    yield sidecar
    assert sidecar.stop() == 0, sidecar.log()


# -- malformed messages ---------------------------------------------------------------------

@pytest.mark.parametrize("listener", ["unix", "tcp"])
@pytest.mark.parametrize("method", ["/collectived.v1.Collectives/Run",
                                    "/collectived.v1.Groups/CreateGroup",
                                    "/collectived.v1.Store/Set",
                                    "/collectived.v1.Admin/GetInfo",
                                    "/collectived.v1.Session/RegisterBuffer"])
def test_unparsable_request_is_invalid_argument_naming_the_method(side, listener, method):
    target = side.unix_address if listener == "unix" else side.tcp_address
    with collectived.open_channel(target) as channel:  # mutual TLS over TCP
        call = channel.unary_unary(method)
        with pytest.raises(grpc.RpcError) as error:
            call(b"\xff\xff\xff\xff\x0f", timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
    assert method in error.value.details()
    assert "could not be parsed" in error.value.details()
    assert healthy(side)


def attach(side, messages, timeout=10):
    """Sends raw `messages` on Attach; returns (events, final RpcError or None)."""
    with grpc.insecure_channel(side.unix_address) as channel:
        call = channel.stream_stream("/collectived.v1.Session/Attach")

        def requests():
            for message in messages:
                yield message
                time.sleep(0.05)
            time.sleep(0.5)  # let the sidecar answer before the stream half-closes

        events = []
        try:
            for raw in call(requests(), timeout=timeout):
                event = session_pb2.SessionEvent()
                event.ParseFromString(raw)
                events.append(event)
        except grpc.RpcError as error:
            return events, error
        return events, None


def open_message():
    request = session_pb2.SessionRequest()
    request.open.client_name = "robustness test"
    return request.SerializeToString()


def test_malformed_message_on_the_session_stream_ends_it_with_invalid_argument(side):
    events, error = attach(side, [open_message(), b"\xff\xff\xff"])
    assert [e.WhichOneof("kind") for e in events] == ["opened"]
    assert error is not None, "the stream ended with OK after a malformed message"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message 1 on the session stream is not a valid" in error.details()
    # The session is named by its public label; its secret id is never in a message.
    assert f"session {events[0].opened.session_label}:" in error.details()
    assert events[0].opened.session_id not in error.details()
    assert healthy(side)


def test_garbage_first_message_is_invalid_argument(side):
    _, error = attach(side, [b"\x0a\xff\xff"])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message 0" in error.details()


@pytest.mark.parametrize("second, expected", [
    (open_message(), "a second `open`"),
    (b"", "carries no known kind"),
])
def test_session_protocol_violations_end_the_stream(side, second, expected):
    events, error = attach(side, [open_message(), second])
    assert [e.WhichOneof("kind") for e in events] == ["opened"]
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in error.details()
    # The session is gone with its stream.
    with grpc.insecure_channel(side.unix_address) as channel:
        stub = group_pb2_grpc.GroupsStub(channel)
        with pytest.raises(grpc.RpcError) as gone:
            stub.CreateGroup(group_pb2.CreateGroupRequest(
                session_id=events[0].opened.session_id, name="g", rank=0, world_size=1),
                timeout=10)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


# -- quotas ---------------------------------------------------------------------------------

def test_pending_ops_per_client_are_bounded(side):
    # Rank 1 is another process: with the same process it would draw on rank 0's share.
    name = unique()
    env = dict(os.environ, PYTHONPATH=python_path())
    rank1 = subprocess.Popen([PYTHON, str(HELPERS / "another_client.py"), side.unix_address,
                              "rank1", "9", name], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        with Client(side.unix_address, name="rank 0") as rank0:
            rank0.create_group(name, 0, 2, timeout=30)
            assert rank1.stdout.readline().strip() == "joined"
            # Rank 1 does not issue yet: rank 0's ops stay pending.
            works = [rank0.allreduce(name, np.ones(4, np.float32), async_op=True)
                     for _ in range(8)]
            with pytest.raises(collectived.ResourceExhaustedError) as error:
                rank0.allreduce(name, np.ones(4, np.float32), async_op=True).wait(10)
            assert f"pending_ops: client pid {os.getpid()} " in str(error.value) \
                and "its share is 8" in str(error.value)
            assert name in str(error.value)
            # Once rank 1 catches up, the ops complete and rank 0 may submit again.
            rank1.stdin.write("go\n")
            rank1.stdin.flush()
            for work in works:
                work.wait(20)
            out = rank0.allreduce(name, np.ones(4, np.float32), async_op=True)
            out.wait(20)
            outcomes, _ = rank1.communicate(timeout=30)
            assert json.loads(outcomes.splitlines()[-1]) == [None] * 9
    finally:
        rank1.kill()
        rank1.wait()
    assert healthy(side)


def test_inline_bytes_held_by_pending_ops_are_bounded(side):
    with Client(side.unix_address, name="rank 0") as rank0, \
            Client(side.unix_address, name="rank 1") as rank1:
        name = two_rank_group(rank0, rank1)
        mib = np.ones(1 << 18, np.float32)  # 1 MiB inline (in place): the quota is 1.5 MiB
        first = rank0.allreduce(name, mib.copy(), async_op=True)
        with pytest.raises(collectived.ResourceExhaustedError) as error:
            rank0.allreduce(name, mib.copy(), async_op=True).wait(10)
        assert "pending_bytes: client" in str(error.value) and "use shared memory" in str(
            error.value)
        # Rank 1 is of the same process (one share): its tensor goes through shared memory.
        shared = rank1.allocate(mib.nbytes)
        shared.array(mib.shape)[:] = 1
        rank1.allreduce(name, shared.array(mib.shape))
        first.wait(20)
    assert healthy(side)


def test_registered_buffers_per_client_are_bounded(side):
    with Client(side.unix_address, name="hoarder") as client:
        buffers = [client.allocate(4096) for _ in range(4)]
        with pytest.raises(collectived.ResourceExhaustedError) as error:
            client.allocate(4096)
        assert "buffers: client" in str(error.value) and "its share is 4" in str(error.value)
        client.free(buffers[0])
        client.allocate(4096)  # room again
    assert healthy(side)


# -- abandoned joins ------------------------------------------------------------------------

def test_a_join_abandoned_by_its_caller_frees_its_server_thread(side):
    # A raw session: the join is called on its own connection, then abandoned.
    with RawClient(side.unix_address, name="impatient") as client:
        baseline = thread_count(side.process.pid)
        stub = group_pb2_grpc.GroupsStub(client._channel)
        for i in range(20):
            with pytest.raises(grpc.RpcError) as error:
                stub.CreateGroup(group_pb2.CreateGroupRequest(
                    session_id=client.session_id, name=unique("abandoned"), rank=0,
                    world_size=2, timeout_ms=3_600_000), timeout=0.3)
            assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        deadline = time.monotonic() + 10
        while thread_count(side.process.pid) > baseline + 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert thread_count(side.process.pid) <= baseline + 4, (
            f"{thread_count(side.process.pid)} threads, {baseline} before 20 abandoned joins")
    assert "join abandoned" in side.log() and "cancelled CreateGroup" in side.log()
    single_rank_allreduce_works(side.unix_address)


def test_a_join_whose_session_ends_stops_at_once(side):
    client = RawClient(side.unix_address, name="leaver")  # its stream is ended by hand
    name = unique()
    outcome = {}

    def join():  # on the session's own connection (the only one it may be used from)
        try:
            group_pb2_grpc.GroupsStub(client._channel).CreateGroup(group_pb2.CreateGroupRequest(
                session_id=client.session_id, name=name, rank=0, world_size=2,
                timeout_ms=3_600_000), timeout=60)
        except grpc.RpcError as error:
            outcome["error"] = error

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    time.sleep(0.5)
    began = time.monotonic()
    client._stream.cancel()  # the session ends mid-join; its connection (and this call) stay
    thread.join(15)
    client.close()
    assert not thread.is_alive()
    print(f"join stopped {time.monotonic() - began:.2f} s after its session ended")
    assert outcome["error"].code() == grpc.StatusCode.ABORTED
    assert "its session ended" in outcome["error"].details()
    assert name in outcome["error"].details()
    # A later group of the same name forms normally (the abandoned announcement was withdrawn).
    with Client(side.unix_address, name="a") as a, Client(side.unix_address, name="b") as b:
        t = threading.Thread(target=b.create_group, args=(name, 1, 2), kwargs={"timeout": 20})
        t.start()
        a.create_group(name, 0, 2, timeout=20)
        t.join(20)
        work = a.allreduce(name, np.ones(4, np.float32), async_op=True)
        out = np.ones(4, np.float32)
        b.allreduce(name, out)
        np.testing.assert_array_equal(out, 2)
        work.wait(20)


# -- SIGTERM drains, SIGKILL restarts -------------------------------------------------------

def wait_in_flight(side, group, timeout=10):
    """Waits until the sidecar shows an op of `group` in flight (submission is asynchronous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = collectivectl("--address", side.unix_address, "describe", group)
        if shown.returncode == 0 and "allreduce" in shown.stdout:
            return
        time.sleep(0.05)
    raise AssertionError(f"no op of {group} in flight: {shown.stdout}{shown.stderr}")


def test_sigterm_drains_ops_in_flight_and_refuses_new_work(tmpdir_short):
    side = Sidecar(tmpdir_short, extra_args=("--metrics", "", "--drain-timeout-ms", "20000"))
    side.start()
    rank0 = Client(side.unix_address, name="rank 0")
    rank1 = Client(side.unix_address, name="rank 1")
    late = Client(side.unix_address, name="late")
    try:
        name = two_rank_group(rank0, rank1)
        in_flight = rank0.allreduce(name, np.full(8, 3, np.float32), async_op=True)
        wait_in_flight(side, name)
        side.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while "collectived shutting down" not in side.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        # No new groups, no new collectives...
        with pytest.raises(collectived.UnavailableError) as refused:
            late.create_group(unique(), 0, 1, timeout=5)
        assert "shutting down" in str(refused.value)
        with pytest.raises(collectived.UnavailableError) as refused:
            rank0.allreduce(name, np.ones(8, np.float32))
        assert "no new allreduce" in str(refused.value)
        # ...but the collective already in flight completes when its last rank arrives.
        out = np.full(8, 4, np.float32)
        rank1.allreduce(name, out)
        np.testing.assert_array_equal(out, 7)
        in_flight.wait(20)
        assert side.process.wait(20) == 0
        assert "drained" in side.log()
    finally:
        for client in (rank0, rank1, late):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the sidecar is gone
                pass
        side.stop()


def test_ops_still_in_flight_after_the_drain_timeout_fail_with_shutting_down(tmpdir_short):
    side = Sidecar(tmpdir_short, extra_args=("--metrics", "", "--drain-timeout-ms", "1000"))
    side.start()
    rank0 = Client(side.unix_address, name="rank 0")
    rank1 = Client(side.unix_address, name="rank 1")
    try:
        name = two_rank_group(rank0, rank1)
        stuck = rank0.allreduce(name, np.ones(8, np.float32), async_op=True)  # rank 1 never comes
        wait_in_flight(side, name)
        started = time.monotonic()
        side.process.send_signal(signal.SIGTERM)
        with pytest.raises(collectived.CollectivedError) as error:
            stuck.wait(20)
        assert "shutting down" in str(error.value)
        assert time.monotonic() - started < 15
        assert side.process.wait(20) == 0
        assert "drain timed out" in side.log()
    finally:
        for client in (rank0, rank1):
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
        side.stop()


def test_sigkill_then_restart_on_the_same_socket_serves_at_once(tmpdir_short):
    side = Sidecar(tmpdir_short, extra_args=("--metrics", ""))
    side.start()
    old = Client(side.unix_address, name="old client")
    name = unique()
    old.create_group(name, 0, 1, timeout=20)
    side.process.kill()
    side.process.wait(10)
    assert os.path.exists(side.socket_path), "SIGKILL leaves the socket file behind"

    restarted = Sidecar(tmpdir_short, extra_args=("--metrics", ""))
    restarted.socket_path = side.socket_path
    restarted.args[restarted.args.index("--socket") + 1] = side.socket_path
    started = time.monotonic()
    restarted.start()
    try:
        print(f"restart to healthy: {time.monotonic() - started:.2f} s")
        assert "removing a stale socket" in restarted.log()
        single_rank_allreduce_works(restarted.unix_address)
        # The old client's session died with the old process: an error, never a hang.
        began = time.monotonic()
        with pytest.raises(collectived.CollectivedError):
            old.allreduce(name, np.ones(4, np.float32), timeout=10)
        assert time.monotonic() - began < 15
    finally:
        try:
            old.close()
        except Exception:  # noqa: BLE001
            pass
        assert restarted.stop() == 0, restarted.log()


def test_a_second_sidecar_on_a_live_socket_refuses_to_start(side):
    result = subprocess.run([str(BIN / "collectived"), "--socket", side.socket_path,
                             "--listen", "127.0.0.1:0", "--metrics", ""],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "another collectived is serving it" in result.stdout + result.stderr
    assert healthy(side)
