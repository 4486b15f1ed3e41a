"""RawClient: one session with a collectived sidecar, spoken in Python on the wire (tests only:
see tests/python/raw/__init__.py).

A session is a long-lived Attach stream: the sidecar treats the client as gone the moment it
closes (exit, crash, kill -9) and fails its groups on every other rank. Collectives are
submitted on that stream (the low-latency path) and complete through it.

Tensors are numpy arrays or torch CPU tensors (C-contiguous). Those that live in one of this
client's shared-memory buffers (``Client.empty``, ``Buffer.array``, ``Buffer.tensor``) are
passed zero-copy: the sidecar works on them in place. Any other tensor travels inline in the
request, and its result is copied back when the op completes.

Memory reaches the sidecar only as a file descriptor (a sealed memfd, or a torch shared
storage's fd through ``Client.register_fd``), passed over the session's fd channel: it has no
name, and nothing is left in /dev/shm when a process dies.
"""

import ctypes
import itertools
import numbers
import os
import queue
import threading
import time

import grpc
import numpy as np

from collectived import dtypes
from collectived import environment
from collectived.address import resolve_address
from collectived.channel import open_channel
from collectived.errors import (AbortedError, CollectivedError, PermissionDeniedError,
                                UnavailableError, error_from_proto, from_rpc_error)
from raw.fd_channel import FdChannel, channel_path
from raw.raw_memory import Buffer, InRegion, Region, _Raw
from collectived.op_table import OPS
from collectived import cuda as _cuda
from raw import ring as _ring
from raw import stream_signals as _signals
from collectived import wire
from collectived.completion_flag import CompletionFlag
from collectived.client import Client as _Client
from raw.raw_work import Work
from collectived.v1 import (admin_pb2_grpc, collectives_pb2, common_pb2, group_pb2,
                            group_pb2_grpc, session_pb2, session_pb2_grpc)

# Recv's ``src`` that takes the first matching send from any rank (the proto's -1).
ANY_SOURCE = -1

# The stream-signal buffers of this process's sessions, kept mapped until it exits (Client._signals).
_KEPT_SIGNAL_BUFFERS = []

# Ops whose request and inline results each fit in this many bytes go through the submission
# ring (when the session has one); bigger ones through the session stream. Half a ring record.
RING_INLINE_LIMIT = 128 << 10


def _leases_of(writeback):
    """The leased ready events of an op's CUDA tensors (see cuda.export)."""
    return [lease for _, raw in writeback if raw.lease for lease in raw.lease]


# Point-to-point ops always take the stream: a send's order is per (peer, tag), and a fence on
# the path switch (see Client._fence) could wait for a send whose recv is posted after a later
# one.
def op_is_collective(op):
    """Whether ``op`` takes a place in its group's sequence (point-to-point ops do not)."""
    return not OPS[op].point_to_point


def _serialized(request):
    """The bytes of a SessionRequest on the Attach stream: a message, or its wire form."""
    return request if isinstance(request, bytes) else request.SerializeToString()


class RawClient:
    """A session with a collectived sidecar. Thread-safe."""

    def __init__(self, address=None, name=None, connect_timeout=10.0, tls=None,
                 stream_signals=None):
        """``tls``: a ``TlsOptions`` for a TCP address (None: from $COLLECTIVED_TLS_*).
        ``stream_signals``: CUDA collectives' ``Work.wait_stream`` makes the stream wait on a word
        the sidecar's stream writes (collectived.stream_signals) instead of first waiting on the
        CPU for the response naming the sidecar's event; None = $COLLECTIVED_STREAM_WAIT
        ("signal" or "event"; default "event" until the sidecar's point-to-point staging without
        CPU waits has run on a GPU, see docs/gpu.md)."""
        self.address = resolve_address(address)
        self._channel = open_channel(self.address, tls)
        self._session_stub = session_pb2_grpc.SessionStub(self._channel)
        self._groups_stub = group_pb2_grpc.GroupsStub(self._channel)
        self._admin_stub = admin_pb2_grpc.AdminStub(self._channel)
        self._requests = queue.SimpleQueue()
        self._pending = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._buffers = []
        self._groups = set()
        self._closed = False
        self._lost = None
        name = name or f"python pid {os.getpid()}"
        self._requests.put(session_pb2.SessionRequest(
            open=session_pb2.OpenSession(client_name=name, pid=os.getpid())))
        # Attach, with a request serializer that passes a submission queued already serialized
        # (wire) through as it is.
        attach = self._channel.stream_stream(
            "/collectived.v1.Session/Attach", request_serializer=_serialized,
            response_deserializer=session_pb2.SessionEvent.FromString)
        self._stream = attach(iter(self._requests.get, None))
        try:
            first = self._next_event(connect_timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error, f"cannot attach to the sidecar at {self.address}") from None
        if not first.HasField("opened"):
            raise CollectivedError(f"the sidecar at {self.address} did not open a session")
        # The session id is a secret (whoever holds it could use this session through this
        # connection): show session_label, the public name the sidecar's logs use, instead.
        self.session_id = first.opened.session_id
        self.session_label = first.opened.session_label
        self.sidecar_id = first.opened.sidecar_id
        # One-time: binds this session's fd channel on the first registration.
        self._fd_channel_token = first.opened.fd_channel.token
        self._fd_channel = None
        self._fd_channel_lock = threading.Lock()
        # CUDA VMM allocations (expandable_segments) registered over the fd channel.
        self._cuda_vmm = _cuda.VmmRegistrations(
            lambda fd, nbytes, device: self._fd_channel_locked().register_cuda_vmm(
                fd, nbytes, device),
            lambda registration: self._fd_channel_locked().unregister_cuda_vmm(registration))
        if stream_signals is None:
            stream_signals = environment.get("COLLECTIVED_STREAM_WAIT", "event") == "signal"
        self._stream_signals_wanted = stream_signals
        self._retired_leases = []  # of ops a closed ring stranded: released at close
        self._signal_words = None  # made on the first CUDA collective (_signals)
        self._signal_buffer = None
        self._signal_lock = threading.Lock()
        self.signal_error = None  # why CUDA collectives take the event path, when wanted
        self._reader = threading.Thread(target=self._read_events, name="collectived-session",
                                        daemon=True)
        self._reader.start()
        # The submission ring, when the session is local and it can be had; else the stream.
        self._ring = None
        self._ring_usable = False
        self._ring_reader = None
        self._ring_waiters = 0  # threads in _await: a taker of their completions kicks them
        self._ring_waiters_lock = threading.Lock()
        self._reader_nudge = threading.Event()
        # Held while taking and completing ring completions (reentrant: a callback may wait).
        self._dispatch_lock = threading.RLock()
        self._last_submit = {}  # group -> (went through the ring, the work): see _fence
        self.ring_error = None  # why the session has no ring (None while it has one)
        if environment.get("COLLECTIVED_RING", "1") == "0":
            self.ring_error = "disabled by COLLECTIVED_RING=0"
        elif not _ring.available():
            self.ring_error = "the native ring library is not built"
        else:
            self._open_ring()

    def _open_ring(self):
        try:
            fd = self._fd_channel_locked().open_ring()
        except CollectivedError as error:
            self.ring_error = str(error)
            return
        try:
            self._ring = _ring.SubmissionRing(fd)
        except _ring.RingClosed as error:
            self.ring_error = str(error)
            return
        finally:
            os.close(fd)
        self._ring_usable = True
        self._ring_reader = threading.Thread(target=self._read_ring, name="collectived-ring",
                                             daemon=True)
        self._ring_reader.start()

    def _take_completions(self):
        """Completes the works of every completion the ring holds, in the ring's order; raises
        RingClosed. One thread at a time takes and completes (callbacks run in completion
        order); a thread that finds another doing it returns, and is kicked when it is done."""
        if not self._dispatch_lock.acquire(blocking=False):
            return
        took = False
        try:
            while True:
                data = self._ring.take()
                if data is None:
                    break
                took = True
                if self._closed:
                    break  # what is pending fails as the stream's pending ops do
                response = collectives_pb2.CollectiveResponse.FromString(data)
                self._deliver(response)
        finally:
            self._dispatch_lock.release()
        if took and self._ring_waiters:
            self._ring.kick()  # a waiter may sleep on a completion this thread took

    def _deliver(self, response):
        """Hands a response from the sidecar to its op: a completion, or a CUDA op's early
        response saying its GPU work is enqueued (the completion follows)."""
        with self._pending_lock:
            if response.enqueued:
                work = self._pending.get(response.client_op_id)
            else:
                work = self._pending.pop(response.client_op_id, None)
        if work is None:
            return
        if response.enqueued:
            work._mark_enqueued(response.completion_event)
        else:
            work._complete(response)

    def _await(self, event, timeout=None):
        """Waits for ``event`` (set when a ring op completes), taking completions from the ring
        on this thread: the op's own completion wakes it, with no hand-off from the reader."""
        if event.is_set():
            return True
        if not self._ring_usable:
            return event.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ring_waiters_lock:
            self._ring_waiters += 1
        try:
            while True:
                seen = self._ring.bell()
                if event.is_set():
                    return True
                try:
                    self._take_completions()
                except _ring.RingClosed:
                    break  # the reader fails the ops stranded on the ring
                if event.is_set():
                    return True
                if not self._ring_usable:
                    break
                wait = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                if wait <= 0:
                    return False
                self._ring.sleep_since(seen, wait)
        finally:
            with self._ring_waiters_lock:
                self._ring_waiters -= 1
                last = self._ring_waiters == 0
            if last and self._pending:
                self._reader_nudge.set()  # ops still pending: the reader takes over
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        return event.wait(remaining)

    def _read_ring(self):
        """Takes completions nobody waits for (asynchronous ops, callbacks, futures).

        While a thread waits in _await it takes the completions itself, and this thread keeps
        off the ring's doorbell: woken by every completion too, it would take the GIL from the
        waiter each time. It looks again every 2 ms, and at once when the last waiter leaves
        with ops still pending."""
        reason = None
        while not self._closed and self._lost is None:
            if self._ring_waiters:
                self._reader_nudge.wait(0.002)
                self._reader_nudge.clear()
            seen = self._ring.bell()
            try:
                self._take_completions()
            except _ring.RingClosed as error:
                reason = str(error)
                break
            if not self._fd_channel.alive():
                reason = "the sidecar closed the session's fd channel (it went away)"
                break
            if not self._ring_waiters:
                self._ring.sleep_since(seen, 0.1)
        self._take_what_is_left()
        # Ops submitted through the ring will not complete through it any more.
        with self._pending_lock:
            self._ring_usable = False
            stranded = [w for w in self._pending.values() if w._via_ring]
            for work in stranded:
                del self._pending[work.client_op_id]
        self.ring_error = reason or "the session closed"
        if stranded:
            error = self._lost or (AbortedError("the client closed its session") if self._closed
                                   else None) or UnavailableError(
                f"the submission ring of session {self.session_label} closed with ops in "
                f"flight: {self.ring_error}")
            if self._lost is None and not self._closed:
                # The session goes on over its stream, and the sidecar may still enqueue ops it
                # took from the ring: their ready events stay leased until the session ends.
                for work in stranded:
                    self._retired_leases.extend(work._take_leases())
            for work in stranded:
                work._complete(error=error)

    def _next_event(self, timeout):
        result, failure = [], []

        def read():
            try:
                result.append(next(self._stream))
            except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
                failure.append(error)
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(timeout)
        if failure:
            raise failure[0]
        if not result:
            self._stream.cancel()
            raise UnavailableError(f"the sidecar at {self.address} did not answer within "
                                   f"{timeout} s (is collectived running?)")
        return result[0]

    def _read_events(self):
        reason = None
        try:
            for event in self._stream:
                if event.HasField("completion"):
                    self._deliver(event.completion)
                elif event.HasField("closing"):
                    reason = error_from_proto(event.closing)
        except grpc.RpcError as error:
            if not self._closed:
                reason = reason or from_rpc_error(error, f"session to {self.address} lost")
        if reason is None:
            reason = (AbortedError("the client closed its session") if self._closed else
                      UnavailableError(f"session to {self.address} lost"))
        self._take_what_is_left()
        self._lost = reason
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for work in pending.values():
            work._complete(error=reason)

    def _take_what_is_left(self):
        """Completes the ops whose completions the sidecar wrote to the ring before it (or the
        session) went: they are still in the ring's memory, and complete rather than fail."""
        if self._closed or self._ring is None:
            return
        with self._dispatch_lock:
            try:
                while (data := self._ring.take()) is not None:
                    self._deliver(collectives_pb2.CollectiveResponse.FromString(data))
            except _ring.RingClosed:
                pass

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self):
        """Ends the session: pending ops fail, buffers are released."""
        if self._closed:
            return
        self._closed = True
        # Leaving the groups first tells the sidecar this is a clean exit, not a lost rank.
        for name in list(self._groups):
            try:
                self.destroy_group(name)
            except CollectivedError:
                pass
        for buffer in list(self._buffers):
            try:
                buffer.close()
            except CollectivedError:
                pass
        self._buffers.clear()
        if self._fd_channel is not None:
            self._fd_channel.close()
        if len(self._cuda_vmm):
            self._cuda_vmm.close()
        if self._ring_reader is not None:
            self._ring_reader.join(10)
            if not self._ring_reader.is_alive():
                with self._dispatch_lock:  # the session reader may be taking what is left
                    self._ring.close()
        self._requests.put(None)
        self._reader.join(10)
        self._channel.close()
        retired, self._retired_leases = self._retired_leases, []
        _cuda.release_ready(retired)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- memory ------------------------------------------------------------------------------

    def _fd_channel_locked(self):
        """The session's fd channel, bound on first use."""
        with self._fd_channel_lock:
            if self._fd_channel is None:
                path = channel_path(self.address)
                if path is None or not self._fd_channel_token:
                    raise PermissionDeniedError(
                        f"session {self.session_label} to {self.address} cannot register "
                        f"memory: only a client on the sidecar's Unix socket hands memory over "
                        f"(as a file descriptor); over TCP tensors travel inline")
                token, self._fd_channel_token = self._fd_channel_token, ""
                self._fd_channel = FdChannel(path, token)
            return self._fd_channel

    def _register_fd(self, fd, nbytes):
        """Hands the memory behind ``fd`` to the sidecar; returns (buffer_id, size, sealed)."""
        return self._fd_channel_locked().register(fd, nbytes)

    def register_fd(self, fd, nbytes, address=None):
        """Registers memory the caller already shares as a file descriptor (a memfd, or the fd
        of a torch shared storage: ``storage._share_fd_cpu_()``); the fd is not taken. With
        ``address``, where the caller maps the same bytes, tensors inside
        [address, address + nbytes) are passed zero-copy from then on. Returns a ``Region``
        (``.id``, ``.close()``). A file not sealed against shrinking is checked on every use:
        truncating it fails ops, never the sidecar."""
        buffer_id, _, sealed = self._register_fd(fd, nbytes)
        region = Region(self, buffer_id, address, nbytes, sealed)
        if address is not None:
            self._buffers.append(region)
        return region

    def _unregister(self, buffer_id):
        self._call(self._session_stub.UnregisterBuffer,
                   session_pb2.UnregisterBufferRequest(session_id=self.session_id,
                                                       buffer_id=buffer_id),
                   "unregister buffer")

    def allocate(self, nbytes):
        """A new shared-memory Buffer of ``nbytes`` registered with the sidecar."""
        buffer = Buffer(self, nbytes)
        self._buffers.append(buffer)
        return buffer

    def free(self, buffer):
        buffer.close()

    def empty(self, shape, dtype=np.float32):
        """A zero-copy numpy array in a buffer of its own."""
        dtype = np.dtype(dtype)
        nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
        return self.allocate(nbytes).array(shape, dtype)

    def empty_tensor(self, shape, dtype=None):
        """A zero-copy torch tensor in a buffer of its own."""
        import torch
        dtype = dtype or torch.float32
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(1, int(np.prod(shape)) * itemsize)
        return self.allocate(nbytes).tensor(shape, dtype)

    # -- groups and store --------------------------------------------------------------------

    def create_group(self, name, rank, world_size, members=None, store_address="",
                     store_prefix="", timeout=1800.0, job_token="", device="cpu"):
        """Joins a group; returns the CreateGroupResponse (group_rank, group_size, members, ...).

        Blocks until every member has joined through its own sidecar. ``device`` is where the
        group's tensors live: "cpu" (Gloo), or "cuda" / "cuda:N" (NCCL on GPU N of the sidecar;
        refused, with the reason, by a sidecar that has no GPU backend or sees no GPU).
        """
        kind, _, index = str(device).partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        request = group_pb2.CreateGroupRequest(
            session_id=self.session_id, name=name, rank=rank, world_size=world_size,
            members=list(members or []), store_address=store_address, store_prefix=store_prefix,
            timeout_ms=int(timeout * 1000), job_token=job_token,
            device_type=common_pb2.CUDA if kind == "cuda" else common_pb2.CPU,
            cuda_device=int(index or 0))
        response = self._call(self._groups_stub.CreateGroup, request, f"create group '{name}'")
        self._groups.add(name)
        return response

    def destroy_group(self, name):
        self._groups.discard(name)
        if self._signal_words is not None:
            self._signal_words.forget(name)
        self._call(self._groups_stub.DestroyGroup,
                   group_pb2.DestroyGroupRequest(session_id=self.session_id, group=name),
                   f"destroy group '{name}'")

    # The calls that name no session are the product client's own: they need only _call,
    # _admin_stub, address and _channel, which this client has too.
    _call = _Client._call
    sidecar_info = _Client.sidecar_info
    list_groups = _Client.list_groups
    flight_recorder = _Client.flight_recorder
    abort_group = _Client.abort_group
    store = _Client.store

    # -- collectives -------------------------------------------------------------------------

    def _tensor(self, x, is_output, writeback, index):
        """The Tensor message of ``x``, in wire form (collectived.wire)."""
        placed = x.region if isinstance(x, InRegion) else None
        raw = _Raw(x.tensor if placed is not None else x)
        if raw.cuda:
            # A client whose streams wait on stream-signal words leases its ready events (see
            # cuda.export): given back once the sidecar waited on them, or the op completed.
            leases = _leases_of(writeback) if self._stream_signals_wanted else None
            before = len(leases) if leases is not None else 0
            try:
                data = _cuda.export_tensor(raw.obj, self._cuda_vmm, leases)
            except ValueError as error:
                raise ValueError(f"CUDA tensor on {raw.obj.device}: {error}") from None
            raw.lease = (leases[before:] or None) if leases is not None else None
            writeback.append((None, raw))  # held until the op completes (its lease with it)
            return wire.tensor(raw.dtype, raw.count, data)
        candidates = (placed,) if placed is not None else self._buffers
        for buffer in candidates:
            if raw.nbytes and buffer.contains(raw.ptr, raw.nbytes):
                return wire.tensor(raw.dtype, raw.count,
                                   wire.shm(buffer.id, raw.ptr - buffer.address, raw.nbytes))
        if index is not None:
            writeback.append((index, raw))
        if is_output or not raw.nbytes:
            return wire.tensor(raw.dtype, raw.count, wire.inline(b""))
        return wire.tensor(raw.dtype, raw.count, wire.inline(ctypes.string_at(raw.ptr, raw.nbytes)))

    def _submit(self, group, op, encode, timeout, async_op):
        """Submits op ``op``, whose message ``encode(writeback)`` writes (wire.op()'s), through
        the ring when it can, else the session stream."""
        if self._lost is not None:
            raise self._lost
        client_op_id = next(self._ids)
        writeback = []
        try:
            op_field = encode(writeback)
        except BaseException:
            _cuda.release_ready(_leases_of(writeback))
            raise
        work = Work(self, op, group, client_op_id, writeback)
        if self._stream_signals_wanted:  # only such clients lease ready events (see _tensor)
            work._leases = _leases_of(writeback)
        via_ring = False
        try:
            signal, stream_ordered = None, False
            if writeback and writeback[0][1].cuda:  # an op's tensors share one device
                work._cuda_device = writeback[0][1].obj.device.index
                words = self._signals(work._cuda_device) if op_is_collective(op) else None
                assigned = words.assign(group) if words is not None else None
                if assigned is not None:
                    # Work.wait_stream waits on the op's word, which the sidecar's stream sets.
                    work._signal = work._signal_release = (words, assigned)
                    signal = (self._signal_buffer.id, assigned.offset, assigned.value)
                else:
                    # Asynchronous CUDA ops hear when their GPU work is enqueued
                    # (Work.wait_stream).
                    stream_ordered = True
                    work._enqueued = CompletionFlag()
            payload = wire.request(group, client_op_id, op_field,
                                   int(timeout * 1000) if timeout else 0, stream_ordered, signal)
            via_ring = self._ring_usable and op_is_collective(op) and \
                wire.size(payload) <= RING_INLINE_LIMIT and \
                sum(raw.nbytes for index, raw in writeback if index is not None) <= \
                RING_INLINE_LIMIT
            self._fence(group, via_ring, work)
            with self._pending_lock:
                if self._lost is not None:  # lost while this op was built: it would never end
                    raise self._lost
                via_ring = via_ring and self._ring_usable  # the ring may have closed meanwhile
                work._via_ring = via_ring
                self._pending[client_op_id] = work
        except BaseException:
            work._release_ready()  # never submitted
            if work._signal_release is not None:  # never submitted: its word is free again
                words, assigned = work._signal_release
                work._signal_release = None
                words.cancel(assigned)
            raise
        if via_ring:
            try:
                self._ring.submit(wire.join(payload))
            except _ring.RingClosed as error:
                with self._pending_lock:
                    self._pending.pop(client_op_id, None)
                work._complete(error=UnavailableError(
                    f"{op} on group '{group}': the submission ring of session "
                    f"{self.session_label} took no submission: {error}"))
        else:
            self._requests.put(wire.session_submit(self.session_id, payload))
        if async_op:
            return work
        work.wait()
        return work

    def _signals(self, device):
        """The session's StreamSignalWords, made on first use (registered with CUDA with
        ``device`` current); None when not wanted or not to be had (signal_error says why)."""
        if not self._stream_signals_wanted:
            return None
        with self._signal_lock:
            if self._signal_words is None and self.signal_error is None:
                buffer = None
                try:
                    buffer = Buffer(self, _signals.BUFFER_BYTES)
                    _cuda.register_signal_words(buffer.address, _signals.BUFFER_BYTES, device)
                except (CollectivedError, ValueError) as error:
                    self.signal_error = str(error)
                    if buffer is not None:  # registered with the sidecar, refused by CUDA
                        try:
                            buffer.close()
                        except CollectivedError:
                            pass  # the session ending frees it as well
                    return None
                # Mapped and registered for the life of the process: a stream may read its word
                # after the session ended (unregistering memory a stream waits on is undefined).
                _KEPT_SIGNAL_BUFFERS.append(buffer)
                self._signal_buffer = buffer
                self._signal_words = _signals.StreamSignalWords(
                    buffer.address, _signals.BUFFER_BYTES // 4)
            return self._signal_words

    def _fence(self, group, via_ring, work):
        """Keeps a group's collectives in issue order across the two paths: the sidecar numbers
        them as they arrive, and the ring and the stream race. A group's collectives complete in
        order, so before the first op of one path follows ops of the other, the last of those
        is awaited."""
        if not op_is_collective(work.op):
            return
        last = self._last_submit.get(group)
        if last is not None and last[0] != via_ring:
            last[1].wait_event(last[1]._done)
        self._last_submit[group] = (via_ring, work)

    def _op(self, group, op, inputs=(), outputs=(), root=None, reduce_op=None, peer=None, tag=0,
            input_splits=None, output_splits=None, timeout=None, async_op=False):
        """Submits ``op``, its request written by the rules of the op table (op_table.py,
        generated from engine/vocabulary/op_traits.h): in-place tensors send their bytes and receive the
        result, inputs send theirs, outputs only receive."""
        spec = OPS[op]
        in_place = spec.in_place

        def encode(writeback):
            tensor = self._tensor
            return wire.op(
                op,
                [tensor(t, False, writeback, i if in_place else None)
                 for i, t in enumerate(inputs)],
                [tensor(t, True, writeback, i) for i, t in enumerate(outputs)],
                # The fields an op does not take are not written (wire.op follows the op table).
                wire.reduce_op(reduce_op.kind, reduce_op.scale) if spec.reduces else b"",
                root, peer, int(tag), input_splits or (), output_splits or ())
        return self._submit(group, op, encode, timeout, async_op)

    def allreduce(self, group, tensor, op="SUM", scale=None, async_op=False, timeout=None):
        return self._op(group, "allreduce", [tensor], reduce_op=dtypes.reduce_op(op, scale),
                        timeout=timeout, async_op=async_op)

    def allreduce_coalesced(self, group, tensors, op="SUM", scale=None, async_op=False,
                            timeout=None):
        return self._op(group, "allreduce_coalesced", list(tensors),
                        reduce_op=dtypes.reduce_op(op, scale), timeout=timeout,
                        async_op=async_op)

    def broadcast(self, group, tensor, root, async_op=False, timeout=None):
        return self._op(group, "broadcast", [tensor], root=root, timeout=timeout,
                        async_op=async_op)

    def reduce(self, group, tensor, root, op="SUM", scale=None, async_op=False, timeout=None):
        return self._op(group, "reduce", [tensor], root=root,
                        reduce_op=dtypes.reduce_op(op, scale), timeout=timeout,
                        async_op=async_op)

    def allgather(self, group, outputs, input, async_op=False, timeout=None):
        return self._op(group, "allgather", [input], list(outputs), timeout=timeout,
                        async_op=async_op)

    def allgather_into_tensor(self, group, output, input, async_op=False, timeout=None):
        return self._op(group, "allgather_into_tensor", [input], [output], timeout=timeout,
                        async_op=async_op)

    def allgather_coalesced(self, group, output_lists, inputs, async_op=False, timeout=None):
        """output_lists[i][r] receives rank r's inputs[i]."""
        return self._op(group, "allgather_coalesced", list(inputs),
                        [t for outputs in output_lists for t in outputs], timeout=timeout,
                        async_op=async_op)

    def reduce_scatter(self, group, output, inputs, op="SUM", scale=None, async_op=False,
                       timeout=None):
        return self._op(group, "reduce_scatter", list(inputs), [output],
                        reduce_op=dtypes.reduce_op(op, scale), timeout=timeout,
                        async_op=async_op)

    def reduce_scatter_tensor(self, group, output, input, op="SUM", scale=None, async_op=False,
                              timeout=None):
        return self._op(group, "reduce_scatter_tensor", [input], [output],
                        reduce_op=dtypes.reduce_op(op, scale), timeout=timeout,
                        async_op=async_op)

    def alltoall(self, group, outputs, inputs, async_op=False, timeout=None):
        return self._op(group, "alltoall", list(inputs), list(outputs), timeout=timeout,
                        async_op=async_op)

    def alltoall_single(self, group, output, input, output_splits=None, input_splits=None,
                        async_op=False, timeout=None):
        """Splits are in elements; None means equal splits."""
        return self._op(group, "alltoall_single", [input], [output], input_splits=input_splits,
                        output_splits=output_splits, timeout=timeout, async_op=async_op)

    def gather(self, group, input, outputs=None, root=0, async_op=False, timeout=None):
        return self._op(group, "gather", [input], list(outputs or []), root=root,
                        timeout=timeout, async_op=async_op)

    def scatter(self, group, output, inputs=None, root=0, async_op=False, timeout=None):
        return self._op(group, "scatter", list(inputs or []), [output], root=root,
                        timeout=timeout, async_op=async_op)

    def barrier(self, group, async_op=False, timeout=None):
        return self._op(group, "barrier", timeout=timeout, async_op=async_op)

    def send(self, group, tensor, dst, tag=0, async_op=False, timeout=None):
        return self._op(group, "send", [tensor], peer=dst, tag=tag, timeout=timeout,
                        async_op=async_op)

    def recv(self, group, tensor, src=None, tag=0, async_op=False, timeout=None):
        """Receives into ``tensor`` from group rank ``src``, or from whichever rank sends first
        with ``tag`` when ``src`` is None (or -1); the work's ``source_rank`` names the sender."""
        if src is None:
            src = ANY_SOURCE
        source = "any rank" if src == ANY_SOURCE else f"rank {src}"
        where = f"recv (from {source}, tag {tag!r}) on group '{group}'"
        if isinstance(tag, bool) or not isinstance(tag, numbers.Integral) \
                or not -2**63 <= tag < 2**63:
            raise ValueError(f"{where}: the tag must be an integer of 64 bits")
        try:
            _Raw(tensor)
        except (ValueError, TypeError, AttributeError) as error:
            raise ValueError(f"{where}: {error}") from None

        return self._op(group, "recv", outputs=[tensor], peer=src, tag=tag, timeout=timeout,
                        async_op=async_op)
