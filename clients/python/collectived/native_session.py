"""A session of the C++ client, driven through libcollectived_native.so (ctypes): the one op
path of the torch backend (collectived.torch.backend).

An op through it is one call into the library: the C++ client exports the tensor, writes the
request to the session's submission ring and takes the completion on its own reader thread. No
Python runs per completion and no thread of this process waits for the GIL to run it, where the
Python client takes each completion in Python (a few tens of microseconds of the trainer's CPU
per op, and a hand-off of the GIL). The library links the C++ client (gRPC) but no CUDA
library: its CUDA half (libcollectived_cuda.so) is opened at the first CUDA tensor.
"""

import collections
import ctypes
import math
import threading

import numpy as np

from collectived import cuda as _cuda
from collectived import dtypes, errors, native, op_table

LIBRARY = native.NATIVE

_ERROR_BYTES = 2048
_DONE_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_uint64)


class _Tensor(ctypes.Structure):
    """collectived_native_tensor (native_session_c.cc)."""
    _fields_ = [("data", ctypes.c_void_p), ("buffer", ctypes.c_void_p),
                ("offset", ctypes.c_uint64), ("count", ctypes.c_uint64),
                ("dtype", ctypes.c_int32), ("cuda_device", ctypes.c_int32)]


class _Op(ctypes.Structure):
    """collectived_native_op (native_session_c.cc)."""
    _fields_ = [("type", ctypes.c_int32), ("reduce_kind", ctypes.c_int32),
                ("scale", ctypes.c_double), ("root", ctypes.c_int32), ("peer", ctypes.c_int32),
                ("tag", ctypes.c_int64), ("input_splits", ctypes.POINTER(ctypes.c_uint64)),
                ("input_split_count", ctypes.c_uint64),
                ("output_splits", ctypes.POINTER(ctypes.c_uint64)),
                ("output_split_count", ctypes.c_uint64), ("timeout_ms", ctypes.c_int64),
                ("cuda_stream", ctypes.c_void_p)]


# OpKind's numbers (engine/vocabulary/op.h): op_table lists the ops in that order, from 1.
OP_KINDS = {name: number for number, name in enumerate(op_table.OPS, start=1)}


def _declare(lib):
    void_p, c_int, c_char_p, u64, i64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                         ctypes.c_uint64, ctypes.c_int64)
    lib.collectived_native_submit.restype = void_p
    lib.collectived_native_submit.argtypes = [void_p, c_char_p, ctypes.POINTER(_Op),
                                              ctypes.POINTER(_Tensor), u64,
                                              ctypes.POINTER(_Tensor), u64]
    lib.collectived_native_work_stream_signal.restype = c_int
    lib.collectived_native_work_stream_signal.argtypes = [void_p]
    lib.collectived_native_work_source_rank.restype = c_int
    lib.collectived_native_work_source_rank.argtypes = [void_p]
    lib.collectived_native_work_sequence_number.restype = u64
    lib.collectived_native_work_sequence_number.argtypes = [void_p]
    lib.collectived_native_work_epoch.restype = c_int
    lib.collectived_native_work_epoch.argtypes = [void_p, ctypes.POINTER(u64)]
    lib.collectived_native_replacements.restype = i64
    lib.collectived_native_replacements.argtypes = [
        void_p, c_char_p, c_int, u64, ctypes.POINTER(ctypes.c_int32), u64,
        ctypes.POINTER(ctypes.c_int32), u64, c_char_p, u64]
    lib.collectived_native_work_inline_result_bytes.restype = u64
    lib.collectived_native_work_inline_result_bytes.argtypes = [void_p]
    lib.collectived_native_buffer_id.restype = u64
    lib.collectived_native_buffer_id.argtypes = [void_p]
    lib.collectived_native_allocate_buffer.restype = void_p
    lib.collectived_native_allocate_buffer.argtypes = [void_p, u64, ctypes.POINTER(void_p),
                                                       c_char_p, u64]
    lib.collectived_native_register_fd.restype = void_p
    lib.collectived_native_register_fd.argtypes = [void_p, c_int, u64, ctypes.POINTER(void_p),
                                                   c_char_p, u64]
    lib.collectived_native_sidecar_address.restype = c_int
    lib.collectived_native_sidecar_address.argtypes = [void_p, c_char_p, u64, c_char_p, u64]
    lib.collectived_native_free_buffer.restype = c_int
    lib.collectived_native_free_buffer.argtypes = [void_p, void_p, c_char_p, u64]
    lib.collectived_native_connect.restype = void_p
    lib.collectived_native_connect.argtypes = [c_char_p, c_char_p, c_int, i64, c_int, c_char_p,
                                               c_char_p, c_char_p, c_char_p, c_char_p, u64]
    lib.collectived_native_session_info.restype = i64
    lib.collectived_native_session_info.argtypes = [void_p, c_int, c_char_p, u64]
    lib.collectived_native_close.argtypes = [void_p]
    lib.collectived_native_create_group.restype = c_int
    lib.collectived_native_create_group.argtypes = [
        void_p, c_char_p, c_int, c_int, ctypes.POINTER(ctypes.c_int32), u64, c_char_p, c_char_p,
        i64, c_char_p, c_int, c_int, c_int, c_char_p, u64, ctypes.POINTER(i64), c_char_p, u64]
    lib.collectived_native_destroy_group.restype = c_int
    lib.collectived_native_destroy_group.argtypes = [void_p, c_char_p, c_char_p, u64]
    lib.collectived_native_allreduce.restype = void_p
    lib.collectived_native_allreduce.argtypes = [void_p, c_char_p, void_p, c_int, void_p, c_int,
                                                 u64, c_int, ctypes.c_double, i64]
    lib.collectived_native_broadcast.restype = void_p
    lib.collectived_native_broadcast.argtypes = [void_p, c_char_p, void_p, c_int, void_p, c_int,
                                                 u64, c_int, i64]
    for name in ("collectived_native_allgather_into_tensor",
                 "collectived_native_reduce_scatter_tensor"):
        call = getattr(lib, name)
        call.restype = void_p
        call.argtypes = [void_p, c_char_p, void_p, void_p, c_int, void_p, c_int, u64, u64] + (
            [c_int, ctypes.c_double] if "reduce" in name else []) + [i64]
    lib.collectived_native_work_wait.restype = c_int
    lib.collectived_native_work_wait.argtypes = [void_p, i64]
    lib.collectived_native_work_wait_stream.restype = c_int
    lib.collectived_native_work_wait_stream.argtypes = [void_p, void_p, i64, c_char_p, u64]
    lib.collectived_native_work_state.restype = c_int
    lib.collectived_native_work_state.argtypes = [void_p]
    lib.collectived_native_work_error.argtypes = [void_p, c_char_p, u64]
    lib.collectived_native_work_on_done.argtypes = [void_p, _DONE_CALLBACK, u64]
    lib.collectived_native_work_free.argtypes = [void_p]
    lib.collectived_native_group_failure.restype = c_int
    lib.collectived_native_group_failure.argtypes = [void_p, c_char_p, c_char_p, u64]
    lib.collectived_native_failure_count.restype = void_p
    lib.collectived_native_failure_count.argtypes = [void_p]


def _library(keep_gil=False):
    try:
        lib = native.load(LIBRARY, _declare, keep_gil)
    except native.LoadError as error:  # e.g. built with CUDA, run where no libcudart is
        raise errors.UnavailableError(f"the native session cannot be opened here: {error}") \
            from None
    if lib is None:
        raise errors.UnavailableError(f"{LIBRARY} was not built with this client")
    return lib


def _milliseconds(timeout):
    """A wait's bound for the library: -1 for none, else whole milliseconds, rounded up."""
    return -1 if timeout is None else max(0, math.ceil(timeout * 1000))


def _op_milliseconds(timeout):
    """An op's timeout for the library: 0 for the group's, else whole milliseconds (at least 1)."""
    return 0 if timeout is None else max(1, math.ceil(timeout * 1000))


def _reduce_kind(op):
    """The API's ReduceOp.Kind of ``op`` (a name): the engine's order."""
    kind = dtypes.REDUCE_OPS.get(op)
    if kind is None:
        raise ValueError(f"unknown reduce op {op!r} (one of {', '.join(dtypes.REDUCE_OPS)})")
    return kind


_buffers = threading.local()
# collectived_native_session_info's subjects, in its order.
_INFO = ("id", "label", "sidecar_id", "sidecar_version", "ring_error")


def _error_buffer():
    """This thread's buffer for the library's error words, for calls made once per op (making
    one costs 0.6 us); its words are read before the thread's next call."""
    try:
        return _buffers.text
    except AttributeError:
        _buffers.text = ctypes.create_string_buffer(_ERROR_BYTES)
        return _buffers.text


def _error(text, what, named=()):
    """The CollectivedError of the library's "<kind>\\n<message>", prefixed by ``what`` unless
    the message already names everything in ``named`` (the sidecar's errors name the op and its
    group)."""
    kind, _, message = text.decode("utf-8", "replace").partition("\n")
    cls = errors.error_class(kind)
    if not what or (named and all(name in message for name in named)):
        return cls(message)
    return cls(f"{what}: {message}")


# Works whose completion callback is pending, by token: ctypes keeps no Python object alive for
# the library, and a callback must find its Work.
_callbacks = {}
_callbacks_lock = threading.Lock()
_tokens = iter(range(1, 1 << 62))
_FIRED = ()  # a NativeWork's callbacks once its completion ran them


@_DONE_CALLBACK
def _on_done(token):
    with _callbacks_lock:
        work = _callbacks.pop(token, None)
    if work is not None:
        work._run_callbacks()


def _describe_array(slot, array, op, buffers):
    """Fills ``slot`` with numpy ``array``: zero-copy in one of ``buffers``, else inline."""
    if not array.flags["C_CONTIGUOUS"]:
        raise ValueError(f"collectived: {op} takes C-contiguous arrays only")
    kind = dtypes.NUMPY_TO_PROTO.get(array.dtype)
    if kind is None:
        raise ValueError(f"collectived does not support dtype {array.dtype}")
    slot.count, slot.dtype, slot.cuda_device = array.size, kind, -1
    start = array.ctypes.data
    for buffer in buffers:
        offset = buffer.holds_span(start, array.nbytes)
        if offset is not None:
            slot.buffer, slot.offset = buffer._handle, offset
            return
    slot.data = start


class NativeWork:
    """An op of a NativeSession: wait(), wait_stream(), is_completed(), exception(), callbacks."""

    __slots__ = ("_handle", "_lib", "_quick", "_orphans", "op", "_group", "_tensor",
                 "_callbacks", "__weakref__")

    def __init__(self, handle, lib, quick, orphans, op, group, tensor):
        self._handle = handle
        if not handle:  # the library had no memory left for the op's handle: nothing was sent
            raise MemoryError(f"collectived: {op} on group '{group.decode()}': no memory for "
                              f"the op")
        self._lib, self._quick = lib, quick
        self._orphans = orphans
        self.op, self._group = op, group  # the group's name as bytes: decoded for words only
        self._tensor = tensor  # its memory is the op's until it completes
        self._callbacks = None

    def __del__(self):
        handle, self._handle = self._handle, None
        if not handle:
            return
        if self._tensor is not None and self._quick.collectived_native_work_state(handle) == 0:
            # Still running (a CUDA op whose stream was ordered after it, or one never waited
            # for): the sidecar still uses its tensor's memory, which must not be reused.
            self._orphans.append((handle, self._tensor))
            return
        self._quick.collectived_native_work_free(handle)

    @property
    def group(self):
        return self._group.decode()

    def _named(self):
        return self.op, f"group '{self.group}'"

    def is_completed(self):
        return self._quick.collectived_native_work_state(self._handle) != 0

    def exception(self):
        """The op's error once it failed, else None."""
        if self._quick.collectived_native_work_state(self._handle) != 2:
            return None
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        self._quick.collectived_native_work_error(self._handle, text, _ERROR_BYTES)
        return _error(text.value, f"{self.op} on group '{self.group}'", self._named())

    def wait(self, timeout=None):
        """Blocks (the GIL released) until the op completes; raises its error, or TimeoutError."""
        done = self._lib.collectived_native_work_wait(self._handle, _milliseconds(timeout))
        if done < 0:
            raise errors.InternalError(f"{self.op} on group '{self.group}': the wait failed "
                                       f"inside the native library")
        if not done:
            raise errors.TimeoutError(f"Timeout: {self.op} on group '{self.group}' did not "
                                      f"complete within {timeout} s")
        error = self.exception()
        if error is not None:
            raise error
        self._tensor = None
        return True

    def wait_stream(self, stream, timeout=None):
        """Makes ``stream`` (a cudaStream_t as an integer) wait for the op's results: on a
        stream-signal word, or on the sidecar's event once it enqueued the op (the CPU waits for
        that). Host ops wait as wait()."""
        text = _error_buffer()
        # The GIL is let go: the event path waits on the CPU for the sidecar's early response,
        # and a driver that refuses a wait on a word makes the signal path wait for the op.
        if self._lib.collectived_native_work_wait_stream(
                self._handle, stream, _milliseconds(timeout), text, _ERROR_BYTES):
            raise _error(text.value, f"{self.op} on group '{self.group}'", self._named())
        return True

    def has_stream_signal(self):
        """Whether the op's CUDA results are waited for on a stream-signal word (no CPU wait)."""
        return bool(self._quick.collectived_native_work_stream_signal(self._handle))

    def source_rank(self):
        """The group rank a completed recv took its message from, else -1."""
        return self._quick.collectived_native_work_source_rank(self._handle)

    def sequence_number(self):
        """The op's sequence number in its group once it completed (the sidecar's), else 0."""
        return self._quick.collectived_native_work_sequence_number(self._handle)

    def epoch(self):
        """``(epoch, first_sequence_number)``: the shrinking group's membership epoch a completed
        op ran in and that epoch's first op; (0, 1) for a group that never changed; None before
        it completed. A step whose first op precedes its last op's epoch ran in two."""
        first = ctypes.c_uint64(1)
        epoch = self._lib.collectived_native_work_epoch(self._handle, ctypes.byref(first))
        return None if epoch < 0 else (epoch, first.value)

    def inline_result_bytes(self):
        """The bytes of results a completed op got back in the sidecar's response (0: every
        result was written in place, in shared memory); 0 before it completed."""
        return self._quick.collectived_native_work_inline_result_bytes(self._handle)

    def add_done_callback(self, callback):
        """Runs ``callback(work)`` once the op completes: on the C++ client's reader thread, or
        at once when it has."""
        token = None
        with _callbacks_lock:  # few ops take callbacks: one lock for all, none made per op
            fired = self._callbacks is _FIRED
            if self._callbacks is None:  # one callback into Python per op, however many it has
                token = next(_tokens)
                _callbacks[token] = self
            if not fired:
                self._callbacks = (self._callbacks or []) + [callback]
        if fired:
            callback(self)
        elif token is not None:
            self._lib.collectived_native_work_on_done(self._handle, _on_done, token)

    def _run_callbacks(self):
        with _callbacks_lock:
            callbacks, self._callbacks = self._callbacks or [], _FIRED
        for callback in callbacks:
            callback(self)


class NativeBuffer:
    """Shared memory registered with a NativeSession's sidecar (NativeSession.allocate): tensors
    in it (``tensor()``) travel zero-copy. Valid until freed or its session closes."""

    def __init__(self, session, handle, address, nbytes):
        self._session, self._handle = session, handle
        self.address, self.nbytes = address, nbytes
        self._memory = (ctypes.c_byte * nbytes).from_address(address)

    def tensor(self, shape, dtype, offset=0):
        """A torch tensor of ``shape`` and ``dtype`` over the buffer's bytes from ``offset``."""
        import torch
        count = math.prod(shape)
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"collectived: {nbytes} bytes at offset {offset} do not fit in a "
                             f"buffer of {self.nbytes}")
        flat = torch.frombuffer(self._memory, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(dtype).view(shape)

    def holds(self, tensor):
        """The byte offset of ``tensor``'s memory in the buffer, or None when it is not in it."""
        start = tensor.data_ptr()
        return self.holds_span(start, tensor.numel() * tensor.element_size())

    def holds_span(self, start, nbytes):
        """The byte offset of the ``nbytes`` at address ``start`` in the buffer, or None."""
        if nbytes and self.address <= start and start + nbytes <= self.address + self.nbytes:
            return start - self.address
        return None

    @property
    def size(self):
        return self.nbytes

    @property
    def id(self):
        """The sidecar's id of the buffer (ShmRef.buffer_id), for raw requests of its session."""
        handle = self._handle
        if not handle:
            raise ValueError("collectived: the buffer was freed")
        return self._session._quick.collectived_native_buffer_id(handle)

    def free(self):
        """Unregisters and unmaps the buffer (no op may still use it); once."""
        handle, self._handle = self._handle, None
        if handle:
            self._session._free_buffer(handle)

    close = free


class NativeSession:
    """A session of the C++ client with the sidecar at ``address``. Thread-safe."""

    def __init__(self, address=None, name=None, stream_signals=None, connect_timeout=None,
                 tls=None):
        """``tls``: a collectived.TlsOptions for a TCP address (None: from $COLLECTIVED_TLS_*);
        ``connect_timeout``: seconds to reach the sidecar and open the session (None: 10)."""
        self._lib = _library()
        self._quick = _library(keep_gil=True)
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        files = (tls.ca, tls.cert, tls.key, tls.server_name) if tls is not None else ("",) * 4
        self._handle = self._lib.collectived_native_connect(
            (address or "").encode(), (name or "").encode(),
            -1 if stream_signals is None else int(bool(stream_signals)),
            0 if connect_timeout is None else max(1, math.ceil(connect_timeout * 1000)),
            -1 if tls is None else int(tls.enabled), *(f.encode() for f in files), text,
            _ERROR_BYTES)
        if not self._handle:
            raise _error(text.value, "native session")
        # The session's count of groups with a failure, read without a call (failure_count).
        self._failure_count = ctypes.c_uint64.from_address(
            self._quick.collectived_native_failure_count(self._handle))
        # (work handle, tensor) of ops whose NativeWork went before they completed, oldest first;
        # let go once completed, by the next op's call (no callback into Python per op).
        self._orphans = collections.deque()
        self._sweeping = threading.Lock()

    def _open(self):
        """The library's session; UnavailableError once closed (the handle is freed then)."""
        handle = self._handle
        if not handle:
            raise errors.UnavailableError("the native session is closed")
        return handle

    def sidecar_address(self):
        """The host:port under which the sidecar's peers reach it (its advertise address)."""
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        address = ctypes.create_string_buffer(1024)
        if self._lib.collectived_native_sidecar_address(self._open(), address, 1024, text,
                                                        _ERROR_BYTES):
            raise _error(text.value, "sidecar address")
        return address.value.decode()

    def info(self, what):
        """What the session is: "id" (a secret: whoever holds it could use the session from
        this connection), "label" (its public name in the sidecar's logs), "sidecar_id",
        "sidecar_version", or "ring_error" (why it has no submission ring; None while it has
        one)."""
        which = _INFO.index(what)
        handle = self._open()
        size = 256
        while True:
            text = ctypes.create_string_buffer(size)
            length = self._quick.collectived_native_session_info(handle, which, text, size)
            if length < 0:
                raise errors.UnavailableError("the native session is closed")
            if length < size:
                value = text.raw[:length].decode("utf-8", "replace")
                return (value or None) if what == "ring_error" else value
            size = length + 1

    def create_group(self, name, rank, world_size, store_address="", timeout=1800.0,
                     job_token="", device=None, members=None, store_prefix="",
                     fault_tolerance="fail-fast", min_ranks=1):
        """Joins group ``name``: a CPU group, or with ``device`` (a CUDA ordinal) a CUDA group;
        ``members``: the global ranks of a subgroup (None: all); ``fault_tolerance``: "fail-fast"
        or "shrink" (go on among the live ranks, down to ``min_ranks``; docs/fault-tolerance.md).
        Returns the group as a collectived.v1.CreateGroupResponse (group_rank, group_size,
        members, ...)."""
        if fault_tolerance not in ("fail-fast", "shrink"):
            raise ValueError(f"fault_tolerance {fault_tolerance!r} is not 'fail-fast' or 'shrink'")
        from collectived.v1 import group_pb2
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        members = [int(m) for m in (members or ())]
        ranks = (ctypes.c_int32 * max(1, len(members)))(*members)
        info = ctypes.create_string_buffer(64 + 16 * (len(members) or world_size or 1))
        info_bytes = ctypes.c_int64(0)
        if self._lib.collectived_native_create_group(
                self._open(), name.encode(), rank, world_size, ranks if members else None,
                len(members), store_address.encode(), store_prefix.encode(),
                int(timeout * 1000), job_token.encode(), -1 if device is None else device,
                int(fault_tolerance == "shrink"), int(min_ranks), info, len(info),
                ctypes.byref(info_bytes), text, _ERROR_BYTES):
            raise _error(text.value, f"create group '{name}'")
        if info_bytes.value < 0:
            raise errors.InternalError(f"create group '{name}': the group's description did "
                                       f"not fit its buffer")
        return group_pb2.CreateGroupResponse.FromString(info.raw[:info_bytes.value])

    _REPLACEMENT_ACTIONS = {"list": 0, "accept": 1, "admit": 2}

    def replacements(self, group, action="list", after_sequence=0, joiners=()):
        """Replacements of lost ranks in shrinking group ``group`` (a name): "accept" says the
        job admits them, "admit" admits group ranks ``joiners`` after this rank's last op
        ``after_sequence`` (every live rank at the same step boundary). Returns the lost group
        ranks whose replacement waits."""
        if action not in self._REPLACEMENT_ACTIONS:
            raise ValueError(f"replacements: unknown action {action!r}")
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        joiners = [int(j) for j in joiners]
        admitted = (ctypes.c_int32 * max(1, len(joiners)))(*joiners)
        capacity = 64
        while True:
            waiting = (ctypes.c_int32 * capacity)()
            count = self._lib.collectived_native_replacements(
                self._open(), group.encode() if isinstance(group, str) else group,
                self._REPLACEMENT_ACTIONS[action], int(after_sequence), admitted, len(joiners),
                waiting, capacity, text, _ERROR_BYTES)
            if count < 0:
                raise _error(text.value, f"replacements of group '{group}'")
            if count <= capacity:
                return [waiting[i] for i in range(count)]
            capacity = count
            action = "list"  # done once: only list again

    def destroy_group(self, name):
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        if self._lib.collectived_native_destroy_group(self._open(), name.encode(), text,
                                                      _ERROR_BYTES):
            raise _error(text.value, f"destroy group '{name}'")

    def allreduce(self, group, tensor, op="SUM", scale=None, timeout=None):
        """Submits an allreduce of ``tensor`` (a contiguous torch tensor, kept until the op
        completes) on group ``group`` (bytes): on a CPU tensor its bytes travel in the request
        (at most the client's inline limit), a CUDA tensor's ordered after its device's current
        stream. Returns a NativeWork; an op the client refuses at once is one that failed.
        Raises ValueError for a tensor it cannot take."""
        device, stream, dtype = self._prepare(group, tensor)
        kind = _reduce_kind(op)
        handle = self._lib.collectived_native_allreduce(
            self._open(), group, tensor.data_ptr(), device, stream, dtype, tensor.numel(),
            kind, 1.0 if scale is None else float(scale), _op_milliseconds(timeout))
        return NativeWork(handle, self._lib, self._quick, self._orphans, "allreduce",
                          group, tensor)

    def broadcast(self, group, tensor, root, timeout=None):
        """Submits a broadcast of ``tensor`` from group rank ``root``; as allreduce."""
        device, stream, dtype = self._prepare(group, tensor)
        handle = self._lib.collectived_native_broadcast(
            self._open(), group, tensor.data_ptr(), device, stream, dtype, tensor.numel(),
            int(root), _op_milliseconds(timeout))
        return NativeWork(handle, self._lib, self._quick, self._orphans, "broadcast",
                          group, tensor)

    def allgather_into_tensor(self, group, output, input, timeout=None):
        """Submits an allgather of every rank's ``input`` into ``output`` (group size times its
        elements, in rank order); both kept until the op completes, on one device with one
        dtype. As allreduce otherwise."""
        device, stream, dtype = self._prepare(group, output, input)
        handle = self._lib.collectived_native_allgather_into_tensor(
            self._open(), group, output.data_ptr(), input.data_ptr(), device, stream, dtype,
            output.numel(), input.numel(), _op_milliseconds(timeout))
        return NativeWork(handle, self._lib, self._quick, self._orphans,
                          "allgather_into_tensor", group, (output, input))

    def reduce_scatter_tensor(self, group, output, input, op="SUM", scale=None, timeout=None):
        """Submits a reduce-scatter of every rank's ``input`` (group size times ``output``'s
        elements): this rank's share of the reduction into ``output``. As allgather_into_tensor
        otherwise."""
        device, stream, dtype = self._prepare(group, output, input)
        kind = _reduce_kind(op)
        handle = self._lib.collectived_native_reduce_scatter_tensor(
            self._open(), group, output.data_ptr(), input.data_ptr(), device, stream, dtype,
            output.numel(), input.numel(), kind, 1.0 if scale is None else float(scale),
            _op_milliseconds(timeout))
        return NativeWork(handle, self._lib, self._quick, self._orphans,
                          "reduce_scatter_tensor", group, (output, input))

    def allocate(self, nbytes):
        """A NativeBuffer of ``nbytes`` bytes of shared memory registered with the sidecar."""
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        data = ctypes.c_void_p()
        handle = self._lib.collectived_native_allocate_buffer(self._open(), int(nbytes),
                                                              ctypes.byref(data), text,
                                                              _ERROR_BYTES)
        if not handle:
            raise _error(text.value, f"allocate a buffer of {nbytes} bytes")
        return NativeBuffer(self, handle, data.value, int(nbytes))

    def register_fd(self, fd, nbytes, address=None):
        """A NativeBuffer over the first ``nbytes`` bytes of the shared-memory file ``fd``
        (memory this process already uses; it keeps ``fd``), registered with the sidecar.
        ``address``: where this process already maps the file (a torch storage moved into shared
        memory): tensors there are found in the buffer; else the library's own mapping."""
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        data = ctypes.c_void_p()
        handle = self._lib.collectived_native_register_fd(self._open(), int(fd), int(nbytes),
                                                          ctypes.byref(data), text, _ERROR_BYTES)
        if not handle:
            raise _error(text.value, f"register descriptor {fd} ({nbytes} bytes)")
        return NativeBuffer(self, handle, data.value if address is None else address,
                            int(nbytes))

    def _free_buffer(self, handle):
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        if self._lib.collectived_native_free_buffer(self._open(), handle, text, _ERROR_BYTES):
            raise _error(text.value, "free a buffer")

    def submit(self, group, op, inputs=(), outputs=(), reduce_op="SUM", scale=None, root=0,
               peer=-1, tag=0, input_splits=None, output_splits=None, timeout=None,
               buffers=()):
        """Submits any collective (``op``: its name in collectived.op_table, "allgather",
        "recv", ...) on group ``group`` (bytes) with ``inputs`` and ``outputs`` (contiguous
        torch tensors, kept until the op completes, in the layout op_table gives the op). A
        tensor that lies in one of ``buffers`` (NativeBuffer) travels zero-copy, another CPU
        tensor inline, a CUDA tensor in place, ordered after its device's current stream.
        ``peer`` -1 on a recv takes the first matching send from any rank (the work's
        source_rank() says whose). Returns a NativeWork."""
        kind = OP_KINDS.get(op)
        if kind is None:
            raise ValueError(f"collectived: unknown op {op!r} (one of {', '.join(OP_KINDS)})")
        if not isinstance(group, bytes):
            raise TypeError(f"collectived: a group name as bytes, not {type(group).__name__}")
        tensors = list(inputs) + list(outputs)
        device = -1  # the CUDA tensors' device (the C++ client refuses a mix)
        described = (_Tensor * max(1, len(tensors)))()
        for slot, tensor in zip(described, tensors):
            if isinstance(tensor, np.ndarray):  # host memory: inline, or in one of buffers
                _describe_array(slot, tensor, op, buffers)
                continue
            if not tensor.is_contiguous():
                raise ValueError(f"collectived: {op} takes contiguous tensors only")
            slot.count = tensor.numel()
            slot.dtype = dtypes.torch_to_proto(tensor.dtype)
            slot.cuda_device = tensor.get_device() if tensor.is_cuda else -1
            if slot.cuda_device >= 0:
                device, slot.data = slot.cuda_device, tensor.data_ptr()
                continue
            for buffer in buffers:
                offset = buffer.holds(tensor)
                if offset is not None:
                    slot.buffer, slot.offset = buffer._handle, offset
                    break
            else:
                slot.data = tensor.data_ptr()
        request = _Op(type=kind, reduce_kind=_reduce_kind(reduce_op) if
                      op_table.OPS[op].reduces else 0,
                      scale=1.0 if scale is None else float(scale), root=int(root),
                      peer=int(peer), tag=int(tag), timeout_ms=_op_milliseconds(timeout),
                      cuda_stream=_cuda.current_stream(device) if device >= 0 else None)
        for side, splits in (("input", input_splits), ("output", output_splits)):
            if splits is not None:
                # The request's pointer field keeps the array alive (ctypes' _objects).
                words = (ctypes.c_uint64 * max(1, len(splits)))(*[int(x) for x in splits])
                setattr(request, f"{side}_splits",
                        ctypes.cast(words, ctypes.POINTER(ctypes.c_uint64)))
                setattr(request, f"{side}_split_count", len(splits))
        if self._orphans:
            self._let_go_of_completed()
        inputs_count = len(inputs)
        handle = self._lib.collectived_native_submit(
            self._open(), group, ctypes.byref(request), described, inputs_count,
            ctypes.cast(ctypes.byref(described, inputs_count * ctypes.sizeof(_Tensor)),
                        ctypes.POINTER(_Tensor)), len(outputs))
        return NativeWork(handle, self._lib, self._quick, self._orphans, op, group,
                          tuple(tensors))

    def _prepare(self, group, tensor, other=None):
        """(device ordinal or -1, stream or None, dtype number) of an op's tensors, checked;
        lets go of the orphaned ops that completed since the last op."""
        if not isinstance(group, bytes):
            raise TypeError(f"collectived: a group name as bytes, not {type(group).__name__}")
        if not tensor.is_contiguous() or (other is not None and not other.is_contiguous()):
            raise ValueError("collectived: the native path takes contiguous tensors only")
        device = tensor.get_device()  # -1 on CPU
        if other is not None:
            if other.get_device() != device or other.device.type != tensor.device.type:
                raise ValueError(f"collectived: an op's tensors on one device, not "
                                 f"{tensor.device} and {other.device}")
            if other.dtype != tensor.dtype:
                raise ValueError(f"collectived: an op's tensors of one dtype, not {tensor.dtype} "
                                 f"and {other.dtype}")
        dtype = dtypes.torch_to_proto(tensor.dtype)
        if self._orphans:
            self._let_go_of_completed()
        # The GIL is let go by the op calls: a full ring makes the call wait, and the C++
        # client's reader may need the GIL meanwhile to run a done callback before it can take
        # more completions.
        return device, _cuda.current_stream(device) if device >= 0 else None, dtype

    def _let_go_of_completed(self, everything=False):
        """Frees the orphaned ops that completed: the oldest ones until one that has not (ops
        mostly complete in issue order: the rest wait for the next call), or with ``everything``
        (at close) every completed one, waiting for another thread's sweep first."""
        if not self._sweeping.acquire(blocking=everything):
            return  # another thread does it
        try:
            orphans, quick = self._orphans, self._quick
            for _ in range(len(orphans)):
                handle = orphans[0][0]
                if quick.collectived_native_work_state(handle) == 0:
                    if not everything:
                        break
                    # Still running: a call racing with close keeps the client, and so this op,
                    # alive a little longer. Its memory stays held (a few bytes, at close only).
                    orphans.rotate(-1)
                    continue
                orphans.popleft()
                quick.collectived_native_work_free(handle)
        finally:
            self._sweeping.release()

    def failure_count(self):
        """How many of the session's groups have a failure (group_failure says which): it only
        grows, and costs no call into the library, so a caller can read it before each op."""
        return self._failure_count.value

    def group_failure(self, group):
        """The error of the first op of ``group`` (bytes) that failed it (peer lost, aborted,
        timed out), or None."""
        handle = self._open()
        if not self._quick.collectived_native_group_failure(handle, group, None, 0):
            return None  # the common case, asked once per op: no buffer made for it
        text = ctypes.create_string_buffer(_ERROR_BYTES)
        self._quick.collectived_native_group_failure(handle, group, text, _ERROR_BYTES)
        return _error(text.value, "")

    def close(self):
        """Ends the session: its pending ops fail. Calls racing with it, or made after it, raise
        UnavailableError (the library's handle stays valid for them)."""
        handle, self._handle = self._handle, None
        if handle:
            self._lib.collectived_native_close(handle)
            self._let_go_of_completed(everything=True)
