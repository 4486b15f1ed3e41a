"""The fd channel: how a local client hands its sidecar memory as a file descriptor.

gRPC cannot carry file descriptors, so they travel on a second Unix socket beside the gRPC one
(``<socket>.fd``, SOCK_SEQPACKET) with SCM_RIGHTS. A connection binds to a session once, with the
one-time token of the session's ``opened`` event; each registration then carries one descriptor.
The format (a 48-byte little-endian header, then a payload) is rpc/fd_channel_wire.h's.
"""

import os
import select
import socket
import struct
import threading

from collectived.errors import CollectivedError, error_from_proto
from collectived.v1 import common_pb2

_HEADER = struct.Struct("<IHHQQQiIQ")  # magic, version, kind, request id, value0, value1,
#                                        error kind, flags, reserved
_MAGIC = 0x64666463
_VERSION = 1
_BIND, _REGISTER, _OPEN_RING, _BOUND, _REGISTERED, _RING_OPENED = 1, 2, 3, 0x81, 0x82, 0x83
_REGISTER_CUDA_VMM, _UNREGISTER_CUDA_VMM = 4, 5
_MAX_PAYLOAD = 4096
FLAG_SEALED = 1


def channel_path(address):
    """The fd channel's path for a ``unix:`` sidecar address, or None for TCP."""
    for prefix in ("unix://", "unix:"):
        if address.startswith(prefix):
            return address[len(prefix):] + ".fd"
    return None


def _error(kind, message):
    return error_from_proto(common_pb2.Error(kind=kind, message=message))


class FdChannel:
    """One bound connection of a session's fd channel. Thread-safe."""

    def __init__(self, path, token, timeout=60.0):
        self.path = path
        self._lock = threading.Lock()
        self._next = 1
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
            answer = self._exchange(_BIND, 0, token.encode())
        except OSError as error:
            self._sock.close()
            raise _error(common_pb2.UNAVAILABLE,
                         f"cannot reach the sidecar's fd channel {path}: {error}") from None
        except CollectivedError:
            self._sock.close()
            raise
        self.session_label = answer[5].decode("utf-8", "replace")

    def _exchange(self, kind, value0, payload=b"", fd=None, received=None, value1=0):
        request_id = self._next
        self._next += 1
        message = _HEADER.pack(_MAGIC, _VERSION, kind, request_id, value0, value1, 0, 0, 0) + \
            payload
        if fd is None:
            self._sock.send(message)
        else:
            socket.send_fds(self._sock, [message], [fd])
        data, fds, _, _ = socket.recv_fds(self._sock, _HEADER.size + _MAX_PAYLOAD, 4)
        if received is not None and fds:
            received.append(fds.pop(0))
        for extra in fds:  # more than asked for: never leak one
            os.close(extra)
        if not data:
            raise _error(common_pb2.UNAVAILABLE, f"the sidecar closed the fd channel {self.path}")
        if len(data) < _HEADER.size:
            raise _error(common_pb2.INTERNAL, "short answer on the fd channel")
        magic, version, answer_kind, answer_id, v0, v1, error_kind, flags, _ = \
            _HEADER.unpack_from(data)
        text = data[_HEADER.size:]
        if magic != _MAGIC or answer_id != request_id:
            raise _error(common_pb2.INTERNAL, f"unexpected answer on the fd channel "
                                              f"(request {answer_id}, expected {request_id})")
        if error_kind != 0:
            for fd_received in received or ():
                os.close(fd_received)
            raise _error(error_kind, text.decode("utf-8", "replace"))
        return answer_kind, v0, v1, flags, error_kind, text

    def register(self, fd, nbytes):
        """Hands ``fd`` (not taken: the caller may close it) to the sidecar.

        Returns (buffer_id, mapped_size, sealed)."""
        with self._lock:
            try:
                _, buffer_id, mapped, flags, _, _ = self._exchange(_REGISTER, nbytes, fd=fd)
            except OSError as error:
                raise _error(common_pb2.UNAVAILABLE,
                             f"fd channel {self.path} broke: {error}") from None
        return buffer_id, mapped, bool(flags & FLAG_SEALED)

    def register_cuda_vmm(self, fd, nbytes, device):
        """Hands the CUDA VMM allocation whose POSIX file descriptor is ``fd`` (not taken),
        ``nbytes`` long on CUDA device ``device``, to the sidecar; returns its registration id
        (for CudaVmmRef.registration_ids)."""
        if device < 0:
            raise _error(common_pb2.INVALID_ARGUMENT,
                         f"CUDA VMM allocation on negative device {device}")
        with self._lock:
            try:
                _, registration, _, _, _, _ = self._exchange(_REGISTER_CUDA_VMM, nbytes, fd=fd,
                                                             value1=device)
            except OSError as error:
                raise _error(common_pb2.UNAVAILABLE,
                             f"fd channel {self.path} broke: {error}") from None
        return registration

    def unregister_cuda_vmm(self, registration):
        """Gives back a registration of register_cuda_vmm (the memory was freed)."""
        with self._lock:
            try:
                self._exchange(_UNREGISTER_CUDA_VMM, registration)
            except OSError as error:
                raise _error(common_pb2.UNAVAILABLE,
                             f"fd channel {self.path} broke: {error}") from None

    def open_ring(self):
        """Asks for the session's submission ring; returns its memfd (the caller closes it)."""
        received = []
        with self._lock:
            try:
                self._exchange(_OPEN_RING, 0, received=received)
            except OSError as error:
                raise _error(common_pb2.UNAVAILABLE,
                             f"fd channel {self.path} broke: {error}") from None
        if not received:
            raise _error(common_pb2.INTERNAL, "the sidecar opened a ring but sent no descriptor")
        return received[0]

    def alive(self):
        """False once the sidecar closed its end (it exited or was killed)."""
        if self._sock.fileno() < 0:
            return False  # closed here
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLRDHUP)
        try:
            events = poller.poll(0)
        except OSError:
            return False
        return not any(mask & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
                       for _, mask in events)

    def close(self):
        self._sock.close()
