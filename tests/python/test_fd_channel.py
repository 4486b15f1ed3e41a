"""Memory as capabilities: a client hands its sidecar memory only as a file descriptor, over the
session's fd channel, bound by a one-time token from the session's own stream.

Against real collectived processes: registration by name is refused on both listeners; a TCP
session cannot register memory; forged, reused and missing tokens are refused; a session cannot
name another's buffer; descriptors that are not memory are refused; a client that shrinks its
memory fails its ops and never the sidecar; a killed client leaves no mapping and no file; the
kernel's credentials of the client show in describe.
"""

import mmap
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

import collectived
from raw.raw_client import RawClient as Client  # the wire-level client: forged tokens, fds
from collectived.v1 import (admin_pb2, admin_pb2_grpc, collectives_pb2, collectives_pb2_grpc,
                            common_pb2, session_pb2, session_pb2_grpc)
from conftest import collectivectl, healthy, two_rank_group, unique

HEADER = struct.Struct("<IHHQQQiIQ")
MAGIC, BIND, REGISTER, BOUND, REGISTERED = 0x64666463, 1, 2, 0x81, 0x82






def one_rank_group(client):
    name = unique()
    client.create_group(name, 0, 1, timeout=20)
    return name




class RawChannel:
    """An fd-channel connection speaking the wire format by hand (what a hostile client does)."""

    def __init__(self, side):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(10)
        self.sock.connect(side.socket_path + ".fd")
        self.next = 1

    def send(self, kind, value0=0, payload=b"", fds=()):
        message = HEADER.pack(MAGIC, 1, kind, self.next, value0, 0, 0, 0, 0) + payload
        self.next += 1
        socket.send_fds(self.sock, [message], list(fds))

    def answer(self):
        data, fds, _, _ = socket.recv_fds(self.sock, 8192, 4)
        for fd in fds:
            os.close(fd)
        if not data:
            return None  # the sidecar closed the connection
        _, _, kind, _, value0, value1, error_kind, flags, _ = HEADER.unpack_from(data)
        return {"kind": kind, "value0": value0, "value1": value1, "error": error_kind,
                "flags": flags, "text": data[HEADER.size:].decode()}

    def closed(self):
        try:
            return self.answer() is None
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self):
        self.sock.close()


def memfd(nbytes, seal=False):
    fd = os.memfd_create("fd-channel-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if seal:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def shm_ref_allreduce(session_id, group, buffer_id, offset, count):
    request = collectives_pb2.CollectiveRequest(session_id=session_id, group=group,
                                                timeout_ms=10000)
    tensor = request.allreduce.tensor
    tensor.dtype = common_pb2.FLOAT32
    tensor.count = count
    tensor.shm.buffer_id = buffer_id
    tensor.shm.offset = offset
    tensor.shm.length = count * 4
    return request


# -- registration by name is gone -----------------------------------------------------------

@pytest.mark.parametrize("listener", ["unix", "tcp"])
def test_registration_by_name_is_refused_on_both_listeners(sidecar, listener):
    # A segment of "another tenant", with a secret in it.
    name = f"/fd-channel-victim-{os.getpid()}"
    fd = os.open(f"/dev/shm{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.write(fd, b"secret" * 100)
    try:
        address = sidecar.unix_address if listener == "unix" else sidecar.tcp_address
        with Client(address, name="thief") as thief:
            stub = session_pb2_grpc.SessionStub(thief._channel)
            request = session_pb2.RegisterBufferRequest(session_id=thief.session_id, size=600)
            # The old field 2 (shm_name), as an old or hostile client still sends it.
            raw = request.SerializeToString() + b"\x12" + bytes([len(name)]) + name.encode()
            call = thief._channel.unary_unary("/collectived.v1.Session/RegisterBuffer")
            for attempt in (lambda: stub.RegisterBuffer(request, timeout=10),
                            lambda: call(raw, timeout=10)):
                with pytest.raises(grpc.RpcError) as error:
                    attempt()
                assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "registration of shared memory by name was removed" in \
                    error.value.details()
                assert "file descriptor" in error.value.details()
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{name}")
    assert healthy(sidecar)


def test_a_tcp_session_gets_no_token_and_cannot_register_memory(sidecar):
    with Client(sidecar.tcp_address, name="remote") as remote:
        assert remote._fd_channel_token == ""
        with pytest.raises(collectived.PermissionDeniedError) as error:
            remote.allocate(4096)
        assert "only a client on the sidecar's Unix socket" in str(error.value)
        # It still runs collectives, inline.
        name = one_rank_group(remote)
        data = np.arange(8, dtype=np.float32)
        remote.allreduce(name, data)
        np.testing.assert_array_equal(data, np.arange(8, dtype=np.float32))
    # Asking for a token on a TCP session's stream ends that session.
    with collectived.open_channel(sidecar.tcp_address) as channel:
        stub = session_pb2_grpc.SessionStub(channel)
        requests = iter([
            session_pb2.SessionRequest(open=session_pb2.OpenSession(client_name="asker")),
            session_pb2.SessionRequest(fd_channel_token=7)])
        events = stub.Attach(requests, timeout=10)
        first = next(events)
        assert first.HasField("opened") and not first.opened.HasField("fd_channel")
        with pytest.raises(grpc.RpcError) as error:
            next(events)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "attached over TCP" in error.value.details()
    assert healthy(sidecar)


# -- tokens ---------------------------------------------------------------------------------

def test_a_forged_token_and_an_unbound_registration_are_refused(sidecar):
    forged = RawChannel(sidecar)
    forged.send(BIND, payload=secrets.token_hex(16).encode())
    answer = forged.answer()
    assert answer["kind"] == BOUND and answer["error"] == common_pb2.PERMISSION_DENIED
    assert "unknown or used fd-channel token" in answer["text"]
    assert forged.closed()

    unbound = RawChannel(sidecar)
    fd = memfd(4096)
    unbound.send(REGISTER, 4096, fds=[fd])
    os.close(fd)
    answer = unbound.answer()
    assert answer["kind"] == REGISTERED and answer["error"] == common_pb2.PERMISSION_DENIED
    assert "bind it to a session" in answer["text"]
    assert unbound.closed()

    garbage = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    garbage.settimeout(10)
    garbage.connect(sidecar.socket_path + ".fd")
    garbage.send(b"GET / HTTP/1.1\r\n\r\n")
    assert garbage.recv(100) == b""  # closed without an answer
    garbage.close()
    assert healthy(sidecar)
    metrics = collectivectl("--address", sidecar.unix_address, "info").stdout
    assert metrics  # the sidecar answers
    assert "fd-channel call refused" in sidecar.log()


def test_a_token_binds_once_to_its_own_session(sidecar, monkeypatch):
    # Without a ring the client binds its fd channel lazily, leaving the token unused here.
    monkeypatch.setenv("COLLECTIVED_RING", "0")
    with Client(sidecar.unix_address, name="victim") as victim:
        token = victim._fd_channel_token
        assert len(token) == 32
        first = RawChannel(sidecar)
        first.send(BIND, payload=token.encode())
        answer = first.answer()
        assert answer["error"] == 0 and answer["text"] == victim.session_label
        # The same token again: refused, whoever presents it.
        second = RawChannel(sidecar)
        second.send(BIND, payload=token.encode())
        assert second.answer()["error"] == common_pb2.PERMISSION_DENIED
        # Binding twice on one connection is refused too.
        first.send(BIND, payload=token.encode())
        assert first.answer()["error"] == common_pb2.INVALID_ARGUMENT
        # What the bound connection registers belongs to the victim's session.
        fd = memfd(4096)
        first.send(REGISTER, 4096, fds=[fd])
        os.close(fd)
        registered = first.answer()
        assert registered["error"] == 0 and registered["value1"] == 4096
        # The client's own lazy binding now finds its token used.
        with pytest.raises(collectived.PermissionDeniedError):
            victim.allocate(4096)
        first.close()
        second.close()


def test_a_session_cannot_use_another_sessions_buffer(sidecar):
    with Client(sidecar.unix_address, name="owner") as owner, \
            Client(sidecar.unix_address, name="other") as other:
        buffer = owner.allocate(4096)
        name = one_rank_group(other)
        stub = collectives_pb2_grpc.CollectivesStub(other._channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Run(shm_ref_allreduce(other.session_id, name, buffer.id, 0, 4), timeout=10)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        assert f"not registered by session {other.session_label}" in error.value.details()


# -- what a descriptor must be --------------------------------------------------------------

def test_descriptors_that_are_not_read_write_memory_are_refused(sidecar, tmp_path):
    readonly_path = tmp_path / "readonly"
    readonly_path.write_bytes(b"x" * 4096)
    with Client(sidecar.unix_address, name="liar") as client:
        read_end, write_end = os.pipe()
        readonly = os.open(readonly_path, os.O_RDONLY)
        empty = memfd(0)
        small = memfd(100)
        cases = [(read_end, 4096, "not a regular file"),
                 (readonly, 4096, "not open for reading and writing"),
                 (empty, 1, "the file has 0 bytes"),
                 (small, 4096, "the file has 100 bytes, fewer than the 4096 announced")]
        try:
            for fd, size, needle in cases:
                with pytest.raises(collectived.InvalidArgumentError) as error:
                    client.register_fd(fd, size)
                assert needle in str(error.value)
                assert f"of session {client.session_label}" in str(error.value)
            # No descriptor attached at all.
            channel = client._fd_channel
            with pytest.raises(collectived.InvalidArgumentError) as error:
                channel._exchange(REGISTER, 4096)
            assert "carries no file descriptor" in str(error.value)
        finally:
            for fd in (read_end, write_end, readonly, empty, small):
                os.close(fd)
        # The channel still serves this session.
        assert client.allocate(4096).sealed
    assert healthy(sidecar)


# -- memory that shrinks ----------------------------------------------------------------------

def test_unsealed_memory_shrunk_after_registration_fails_the_op_not_the_sidecar(sidecar):
    with Client(sidecar.unix_address, name="shrinker") as client:
        name = one_rank_group(client)
        size = 1 << 20
        fd = memfd(size)  # not sealed: the client may still truncate it
        mapping = mmap.mmap(fd, size)
        try:
            base = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
            region = client.register_fd(fd, size, address=base)
            assert not region.sealed
            tail = np.ndarray((1024,), np.float32, buffer=mapping, offset=size - 4096)
            tail[:] = 1
            client.allreduce(name, tail)  # fine while the file is whole
            os.ftruncate(fd, 4096)  # behind the sidecar's back
            with pytest.raises(collectived.InvalidArgumentError) as error:
                client.allreduce(name, tail)  # the range is passed, never touched here
            assert "shrank to 4096 bytes" in str(error.value)
            assert f"of session {client.session_label}" in str(error.value)
            del tail
        finally:
            mapping.close()
            os.close(fd)
    assert healthy(sidecar)


def test_memory_shrunk_under_an_accepted_op_fails_it_and_never_kills_the_sidecar(sidecar):
    """Rank 0's op on a big unsealed buffer is accepted (its range checked), then its client
    truncates the file, then rank 1 arrives and the sidecar reduces: touching rank 0's lost
    pages raises SIGBUS in the sidecar, which contains it. Rank 0's op fails naming the shrink;
    the sidecar lives on and the group runs a clean op afterwards."""
    size = 8 << 20
    count = size // 4
    with Client(sidecar.unix_address, name="r0") as r0, \
            Client(sidecar.unix_address, name="r1") as r1:
        name = two_rank_group(r0, r1)
        ranks = (r0, r1)
        stubs = [collectives_pb2_grpc.CollectivesStub(c._channel) for c in ranks]
        for attempt, shrink_to in enumerate((4096, 0, size // 2)):
            fds = [memfd(size), memfd(size)]
            regions = [c.register_fd(fd, size) for c, fd in zip(ranks, fds)]
            requests = [shm_ref_allreduce(c.session_id, name, region.id, 0, count)
                        for c, region in zip(ranks, regions)]
            for rank, request in enumerate(requests):
                request.client_op_id = 100 + attempt
            stubs[0].Submit(requests[0], timeout=10)  # accepted: its range was backed
            os.ftruncate(fds[0], shrink_to)
            stubs[1].Submit(requests[1], timeout=10)
            answers = [stub.Wait(collectives_pb2.WaitRequest(
                session_id=c.session_id, client_op_id=100 + attempt, timeout_ms=30000),
                timeout=40) for stub, c in zip(stubs, ranks)]
            assert answers[0].error.kind == common_pb2.INVALID_ARGUMENT, answers[0]
            assert "shrank the file under an op" in answers[0].error.message
            assert "SIGBUS" in answers[0].error.message
            assert f"of session {r0.session_label}" in answers[0].error.message
            assert sidecar.process.poll() is None, sidecar.log()
            # The buffer stays refused until unregistered.
            with pytest.raises(grpc.RpcError) as again:
                stubs[0].Run(shm_ref_allreduce(r0.session_id, name, regions[0].id, 0, 1),
                             timeout=10)
            assert again.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            for region, fd in zip(regions, fds):
                region.close()
                os.close(fd)
        data = [np.full(4, 1.0, np.float32), np.full(4, 2.0, np.float32)]
        works = [c.allreduce(name, d, async_op=True) for c, d in zip(ranks, data)]
        for work in works:
            work.wait(30)
        np.testing.assert_array_equal(data[0], np.full(4, 3.0, np.float32))
    assert healthy(sidecar)


# -- nothing left behind --------------------------------------------------------------------

CHILD = r"""
import os, sys, time
from collectived import Client
client = Client(sys.argv[1], name="doomed")
buffers = [client.allocate(1 << 20) for _ in range(3)]
print("ready", flush=True)
time.sleep(600)
"""


def memfd_mappings(pid):
    with open(f"/proc/{pid}/maps") as maps:
        return sum("memfd:collectived-buffer" in line for line in maps)


def test_a_killed_client_leaves_no_mapping_and_no_file(sidecar):
    before = set(os.listdir("/dev/shm"))
    baseline = memfd_mappings(sidecar.process.pid)
    child = subprocess.Popen([sys.executable, "-c", CHILD, sidecar.unix_address],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    try:
        assert child.stdout.readline().strip() == "ready"
        assert memfd_mappings(sidecar.process.pid) == baseline + 3
        assert set(os.listdir("/dev/shm")) == before  # the memory never had a name
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while memfd_mappings(sidecar.process.pid) > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert memfd_mappings(sidecar.process.pid) == baseline
        assert set(os.listdir("/dev/shm")) == before
    finally:
        child.kill()
        child.wait()
    assert healthy(sidecar)


def test_a_stopped_sidecar_removes_its_fd_socket(tmpdir_short):
    from conftest import Sidecar
    side = Sidecar(tmpdir_short, "short-lived").start()
    path = side.socket_path + ".fd"
    assert os.path.exists(path)
    assert side.stop() == 0, side.log()
    assert not os.path.exists(path)


# -- who is on the other end ------------------------------------------------------------------

def test_describe_shows_the_kernels_credentials_of_each_local_rank(sidecar):
    with Client(sidecar.unix_address, name="described") as client:
        client.allocate(8192)
        name = one_rank_group(client)
        admin = admin_pb2_grpc.AdminStub(client._channel)
        detail = admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group=name), timeout=10)
        session = detail.placement[0].session
        assert session.label == client.session_label
        assert session.client_name == "described"
        assert (session.peer_pid, session.peer_uid, session.peer_gid) == \
            (os.getpid(), os.getuid(), os.getgid())
        assert session.buffers == 1 and session.registered_bytes == 8192
        shown = collectivectl("--address", sidecar.unix_address, "describe", name).stdout
        assert f"{client.session_label} 'described' pid {os.getpid()} uid {os.getuid()}" in shown
        assert "1 buffers" in shown
