"""The torch.distributed backend "collectived": a ProcessGroup whose collectives run in the
local collectived sidecar.

Tensors already in the session's shared memory go zero-copy. Other CPU tensors of at least
64 KiB are adopted (collectived.torch.adoption): their storage moves into shared memory in place
on first use, as ``share_memory_()`` does, and its file descriptor is registered once, so later
ops on them copy nothing. Contiguous tensors of at most 16 KiB travel inline in the request.
The rest (non-contiguous tensors, tensors between the two bounds, or past the adoption bound)
are staged through a shared-memory pool that is reused across ops (never registered per op).

CUDA tensors go to a second sidecar group of the same ranks, a CUDA (NCCL) group that joins on
the group's first CUDA op: the sidecar opens their memory through CUDA IPC and orders its work
after the tensors' current stream. ``Work.wait()`` returns once the sidecar's device work has
completed (stronger than c10d's NCCL semantics, where wait() only orders the current stream).

Errors reach Python as exceptions raised from the call or from ``Work.wait()``: torch 1.13
reports a Future completed with an exception as a success and DDP crashes on it, so futures
always carry the tensors, and a failed group raises from its next call. Futures complete on
threads of their own (collectived.torch.future_completer).

torch 1.13 and 2.x: in both, the creator gets ``(store, group_rank, group_size, timeout)`` and a
plugin written in Python returns a ``ProcessGroup`` subclass. torch 2.x builds its groups from
C++ ``Backend`` objects, but that class has neither a Python constructor nor a trampoline, so a
Python ``Backend`` could not be called from C++ (DDP's reducer); torch 2.x keeps the path where
the creator's ``ProcessGroup`` becomes the group itself. What differs is detected, not assumed
from version numbers: ``register_backend(devices=...)`` (2.1+), the group name and description
torch 2.x sets on the group and later looks it up by, the C++ method names of newer torch
(``all_gather_single``, ``all_to_all_single``, ...), tensor coalescing and ``shutdown``/``abort``.
"""

import atexit
import collections
import datetime
import inspect
import itertools
import os
import threading

import torch
import torch.distributed as dist

from collectived import cuda as _cuda
from collectived import environment
from collectived import torch_names
from collectived.client import Client, InRegion
from collectived.completion_flag import CompletionFlag
from collectived.torch.adoption import Adopter
from collectived.torch.future_completer import FutureCompleter, drain_at_exit
from collectived.torch.sparse import sparse_allreduce
from collectived.torch.staging import StagingPool

BACKEND_NAME = "collectived"
# Contiguous CPU tensors up to this size travel inline in the op's request and response (one
# copy each way inside the message) rather than through a staging stand-in, whose bookkeeping
# costs more than the copy.
INLINE_BYTES = 16 << 10

_client = None
_client_lock = threading.Lock()
_job_token = None
_job_name = None
# This process's groups in creation order (c10d creates them in the same order on every rank).
_group_index = itertools.count()


def set_job_token(token):
    """Sets the job token of the groups this process creates from now on (``None``: take it from
    the environment again). Every rank of a job must present the same token; a rank with another
    one is refused (``PermissionDeniedError``). torch 1.13 hands a third-party backend no init
    options, so this call and the environment are how the token reaches the backend."""
    global _job_token
    _job_token = token


def current_job_token():
    """The job token for new groups: set_job_token's, else the content of the file named by
    ``$COLLECTIVED_JOB_TOKEN_FILE`` (a Kubernetes Secret mounted as a file; re-read for every
    group, so a rotated Secret applies to the next group), else ``$COLLECTIVED_JOB_TOKEN``,
    else none. Surrounding whitespace is ignored."""
    if _job_token is not None:
        return _job_token
    path = environment.get("COLLECTIVED_JOB_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as token_file:
                return token_file.read().strip()
        except OSError as error:
            raise RuntimeError(f"collectived: cannot read the job token file named by "
                               f"COLLECTIVED_JOB_TOKEN_FILE ({path}): {error.strerror}") from None
    return environment.get("COLLECTIVED_JOB_TOKEN", "").strip()


def set_job_name(name):
    """Names the groups this process creates from now on after ``name`` (``None``: take it from
    the environment again), so that metrics, logs and ``collectivectl describe`` tie them to the
    job. Only the job's rank 0 names a group; the others learn the name from it."""
    global _job_name
    _job_name = name


def current_job_name():
    """set_job_name's, else ``$COLLECTIVED_JOB_NAME``, else torchrun's ``$TORCHELASTIC_RUN_ID``
    (unless it is torchrun's default "none"), else "" (the groups are then named ``pg-<hex>``)."""
    if _job_name is not None:
        return _job_name
    for value in (environment.get("COLLECTIVED_JOB_NAME", ""),
                  os.environ.get("TORCHELASTIC_RUN_ID", "")):
        value = value.strip()
        if value and value != "none":
            return value
    return ""


# COLLECTIVED_TORCH_NATIVE=1: allreduce, broadcast, allgather into a tensor and reduce-scatter of
# a tensor, of dense CUDA tensors and of CPU tensors small enough to travel inline, go through a
# session of the C++ client (collectived.native_session): one call into it per op, and no Python
# per completion. Other ops keep the Python client; a group orders
# the two paths where one follows the other (see ProcessGroupCollectived._fence).
_NATIVE_WANTED = environment.get("COLLECTIVED_TORCH_NATIVE", "0") == "1"
_native_session = None


def shared_native_session():
    """This process's native session with its sidecar, made on first use."""
    global _native_session
    with _client_lock:
        if _native_session is None:
            from collectived.native_session import NativeSession
            _native_session = NativeSession(environment.get("COLLECTIVED_ADDRESS"),
                                            name=f"torch rank pid {os.getpid()} (native)")
        return _native_session


def shared_client():
    """This process's session with its sidecar ($COLLECTIVED_ADDRESS), shared by every group."""
    global _client
    with _client_lock:
        if _client is None or _client._lost is not None:
            _client = Client(environment.get("COLLECTIVED_ADDRESS"),
                             name=f"torch rank pid {os.getpid()}")
            _client.staging = StagingPool(_client)
            _client.adopter = Adopter(_client)
        return _client


@atexit.register
def _close_shared_client():
    # An open gRPC stream at interpreter exit can abort the process: end the session first.
    global _client, _native_session
    with _client_lock:
        client, _client = _client, None
        native, _native_session = _native_session, None
    if native is not None:
        native.close()
    if client is not None:
        client.close()


_OP_NAMES = {}  # (type, number) of torch's op -> its name (working it out costs microseconds)


def _reduce_op(opts):
    """(name, scale) of the op of an options object, or of a ReduceOp given in its place (as DDP
    and the ProcessGroup overloads do: ``pg.allreduce(tensor, ReduceOp.MAX)``); the scale is
    PREMUL_SUM's factor, None for the other ops."""
    if opts is None:
        return "SUM", None
    # Each attribute of torch's option and op objects costs 0.3-0.7 us (a pybind11 conversion):
    # read each once, the common case first, and find the name by the op's number.
    try:
        reduce_op = opts.reduceOp
    except AttributeError:  # a ReduceOp given in its place
        reduce_op = opts
    try:
        op = reduce_op.op
    except AttributeError:
        op = reduce_op
    try:
        name = _OP_NAMES[type(op), int(op)]
    except (KeyError, TypeError, ValueError):  # not seen yet, or no number
        name = getattr(op, "name", None) or str(op).split(".")[-1]
        try:
            _OP_NAMES[type(op), int(op)] = name
        except (TypeError, ValueError):
            pass
    if name != "PREMUL_SUM":
        return name, None
    scale = _premul_sum_factor(reduce_op)
    if scale is None:
        raise ValueError("collectived: PREMUL_SUM through torch.distributed needs a torch that "
                         "shows its factor to backend plugins (torch 2.x; 1.13 does not); use "
                         "ReduceOp.SUM and scale, or collectived.Client.allreduce("
                         "op='PREMUL_SUM', scale=...)")
    return name, scale


def _premul_sum_factor(reduce_op):
    """The factor of a ReduceOp made by dist._make_nccl_premul_sum, or None where this torch
    does not show it. torch 2.x pickles such an op as (op, factor), the factor a float or a
    one-element tensor; torch 1.13 keeps it out of Python's reach (detected, not assumed)."""
    try:
        state = reduce_op.__getstate__()
    except Exception:  # noqa: BLE001 - no pickling support: no factor to read
        return None
    if not isinstance(state, tuple) or len(state) != 2 or state[1] is None:
        return None
    factor = state[1]
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"collectived: PREMUL_SUM with a factor tensor of "
                             f"{factor.numel()} elements (one factor is supported)")
        factor = factor.item()
    return float(factor)


def _root(opts):
    """The root of an options object, or the root rank given in its place (the overloads)."""
    if opts is None:
        return 0
    return opts if isinstance(opts, int) else opts.rootRank


def _seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    return seconds if seconds > 0 else None


class _Staging:
    """The shared-memory stand-ins of one op's CPU tensors, and the copies back once it is done.
    CUDA tensors pass as they are (the sidecar opens their memory), or through a contiguous
    copy. It also learns the op's device: every tensor of an op must be on the same one."""

    def __init__(self, client):
        self._client = client
        self._staged = []  # (user tensor, stand-in, pool handle or None, copy back)
        self.device = None  # torch.device of the op's tensors; None until one is seen
        self._stream = None  # CUDA: the current stream when the op was issued

    def _in_shm(self, t):
        nbytes = t.numel() * t.element_size()
        return t.is_contiguous() and any(b.contains(t.data_ptr(), nbytes)
                                         for b in self._client._buffers)

    def _note_device(self, t):
        device = t.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"collectived: expected a CPU or CUDA tensor, got one on {device}")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device is None:
            self.device = device
        elif self.device != device:
            raise ValueError(f"collectived: one op's tensors must live on one device; got "
                             f"tensors on {self.device} and on {device}")

    def _stage(self, t, copy_in, copy_back):
        self._note_device(t)
        if t.device.type == "cuda":
            if t.is_contiguous():
                return t
            if self._stream is None:
                self._stream = torch.cuda.current_stream(t.device)
            dense = t.contiguous() if copy_in else torch.empty_like(
                t, memory_format=torch.contiguous_format)
            self._staged.append((t, dense, None, copy_back))
            return dense
        if t.numel() == 0 or _inline(t, self._client):
            return t  # inline: inside the request and its response, cheaper than a stand-in
        if self._in_shm(t):
            return t
        adopter = getattr(self._client, "adopter", None)
        region = adopter.region_for(t) if adopter is not None else None
        if region is not None:
            return InRegion(t, region)  # its own storage, now shared: nothing to copy
        shm, handle = self._client.staging.tensor(t)
        if copy_in:
            shm.copy_(t)
        self._staged.append((t, shm, handle, copy_back))
        return shm

    def input(self, t):
        return self._stage(t, True, False)

    def output(self, t):
        return self._stage(t, False, True)

    def inout(self, t):
        return self._stage(t, True, True)

    def finish(self, ok):
        on_device = []
        for user, stand_in, handle, copy_back in self._staged:
            if ok and copy_back:
                if stand_in.is_cuda:
                    on_device.append((user, stand_in))
                else:
                    user.copy_(stand_in)
            if handle is not None:
                self._client.staging.release(handle)
        self._staged = []
        if on_device:
            self._copy_back_on_device(on_device)

    def _copy_back_on_device(self, copies):
        """Copies CUDA results from their stand-ins on the stream the op was issued from (where
        the stand-ins were made), not on this (completion) thread's default stream, which a
        side stream of the trainer's does not wait for; with the device made current for it
        alone (a thread with none would make GPU 0's context). The op completes once they are
        in place, for wait() and the future's callbacks on any stream (a staged CUDA op waits
        on the CPU, see _Work)."""
        done = torch.cuda.Event()
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            for user, stand_in in copies:
                user.copy_(stand_in)
            done.record(self._stream)
        done.synchronize()


class _NoStaging:
    """The staging of an op with nothing to undo: one whose tensor travels inline (see _inline),
    or one that finished."""

    device = torch.device("cpu")

    @staticmethod
    def finish(ok):
        pass


class _OnDevice:
    """The staging of a CUDA op with nothing to stage (see _dense_cuda_device): its device."""

    __slots__ = ("device",)
    _staged = ()

    def __init__(self, device):
        self.device = device

    @staticmethod
    def finish(ok):
        pass


def _dense_cuda_device(*tensors):
    """The device of ``tensors`` where every one is a dense contiguous CUDA tensor and all are
    on one device: an op that passes them as they are, on the short path (no staging, no
    routing); else None (the op takes the general path, which says what is wrong)."""
    device = None
    for tensor in tensors:
        if not tensor.is_cuda or tensor.layout != torch.strided or not tensor.is_contiguous():
            return None
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            return None
    return device


def _contiguous(tensors, in_place=True):
    """``tensors`` when each is contiguous, else a list of them with a contiguous copy of each
    that is not (with ``in_place`` False, an empty one: a result only written)."""
    for tensor in tensors:
        if not tensor.is_contiguous():
            break
    else:
        return tensors
    return [t if t.is_contiguous() else t.contiguous() if in_place else
            torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]


def _inline_bytes(client):
    """The largest CPU tensor that travels inline: INLINE_BYTES, or less where adoption is set
    to take smaller tensors (COLLECTIVED_TORCH_ADOPT_MIN_BYTES): adoption then comes first."""
    adopter = getattr(client, "adopter", None)
    if adopter is None or adopter.max_bytes <= 0:
        return INLINE_BYTES
    return min(INLINE_BYTES, adopter.min_bytes - 1)


def _inline(tensor, client):
    """Whether ``tensor`` is a small dense CPU tensor that travels inside its request."""
    return (tensor.layout == torch.strided and tensor.is_cpu and  # no torch.device made
            0 < tensor.numel() * tensor.element_size() <= _inline_bytes(client) and
            tensor.is_contiguous())


class _Router:
    """The client as one op's build function sees it: each call's group name is replaced, once
    its arguments (and so its tensors, through _Staging) have been seen, by the sidecar group of
    the op's device: the process group's CPU group, or its CUDA group (created on first use)."""

    def __init__(self, group, client, staging, collective):
        self._group = group
        self._client = client
        self._staging = staging
        # Point-to-point ops are not ordered against the collectives of the other path, as
        # NCCL's run on streams of their own: a fence there waits for an op that may need this
        # one's peer (a recv fenced behind a collective the sender issues after it).
        self._fenced = collective

    def __getattr__(self, op):
        method = getattr(self._client, op)

        def call(_name, *args, **kwargs):
            device = self._staging.device
            if self._fenced and self._group._native_tail is not None and device is not None \
                    and device.type == "cuda":
                self._group._order_after_native(device)
            return method(self._group._sidecar_group_for(device), *args, **kwargs)
        return call


_WorkBase = getattr(dist, "_Work", None) or dist.Work

# Orders a _Work's completion against the first get_future(), so its future completes once.
_future_lock = threading.Lock()
# Completes the futures of ops that complete after get_future(): off the clients' completion
# threads, as a future's callbacks (DDP communication hooks) may wait for other ops.
_futures = FutureCompleter()
# Registered before the client's close (atexit runs last what came first): the futures that
# close completes are completed before the interpreter finalizes.
drain_at_exit(_futures)


class _FutureStreams:
    """Where a process group's CUDA futures complete, as ProcessGroupNCCL's: on a stream of the
    group's own per device (made on first use), so that taking a future never makes the
    caller's stream wait for the op (DDP takes each bucket's future during the backward pass,
    whose kernels must not wait for the allreduces)."""

    def __init__(self):
        self._streams = {}  # CUDA ordinal -> torch.cuda.Stream
        self._lock = threading.Lock()

    def complete_at_once(self, wait_stream, ordinal, result):
        """A CUDA op's future completed at once: ``wait_stream(stream)`` makes the group's
        stream of device ``ordinal`` wait for the op, and the future, made for that device,
        records its completion there. Its callbacks (DDP's communication hooks) run now, on the
        caller's thread, in the order the caller asks for its futures: the same on every rank,
        where callbacks run as ops complete would issue their own ops in an order left to
        timing. A stream that takes its value waits for the op first; no stream waits before.
        None when the stream cannot be made to wait (the op failed already, or its event cannot
        be waited on): the caller then completes the future once the op completed."""
        stream = self._streams.get(ordinal)
        if stream is None:
            with self._lock:
                stream = self._streams.get(ordinal) or torch.cuda.Stream(device=ordinal)
                self._streams[ordinal] = stream
        try:
            wait_stream(stream.cuda_stream)
        except Exception:  # noqa: BLE001 - the op's wait() raises it; the future completes later
            return None
        future = torch.futures.Future(devices=[torch.device("cuda", ordinal)])
        with torch.cuda.stream(stream):
            future.set_result(result)
        return future


# COLLECTIVED_CUDA_WAIT=blocking makes wait() on CUDA ops block the CPU until the op ran, as on
# host memory, instead of ordering the current stream after it (the default, c10d's semantics).
# A stream ordered after a sidecar that then dies may never run again; a blocked CPU gets the
# error.
_STREAM_ORDERED_WAIT = environment.get("COLLECTIVED_CUDA_WAIT", "stream") != "blocking"


class _AllOf:
    """Several client ops seen as one (a coalesced call the sidecar runs as separate ops)."""

    def __init__(self, works):
        self._works = works
        self._remaining = len(works)
        self._lock = threading.Lock()
        self._callbacks = []
        self._error = None
        for work in works:
            work.add_done_callback(self._one_done)

    def _one_done(self, work):
        with self._lock:
            if self._error is None and work.exception() is not None:
                self._error = work.exception()
            self._remaining -= 1
            callbacks = self._callbacks if self._remaining == 0 else []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback):
        with self._lock:
            if self._remaining > 0:
                self._callbacks.append(callback)
                return
        callback(self)

    def exception(self):
        return self._error

    def wait(self, timeout=None):
        for work in self._works:
            work.wait(timeout)
        return True

    def wait_stream(self, stream, timeout=None):
        for work in self._works:
            work.wait_stream(stream, timeout)
        return True

    def wait_event(self, event, timeout=None):
        for work in self._works:
            if work._via_ring:
                return work.wait_event(event, timeout)  # takes completions while it waits
        return event.wait(timeout)

    @property
    def source_rank(self):
        return -1


class _KeepAlive:
    """The Python Works that torch may still call into. torch keeps only the C++ half of a Work
    returned from Python, and without a Python reference its overrides vanish ("Work::getFuture
    not implemented"): DDP, for one, asks for the future of a Work it never hands to Python.
    A Work stays here until it was waited for or its future was taken (torch needs nothing more
    of it then, and the tensors it holds are freed with it), or until LIMIT newer ones came."""

    LIMIT = 4096

    def __init__(self):
        self._works = collections.OrderedDict()  # key -> _Work, oldest first
        self._keys = itertools.count()

    def hold(self, work):
        key = next(self._keys)
        self._works[key] = work
        if len(self._works) > self.LIMIT:
            try:
                self._works.popitem(last=False)
            except KeyError:  # emptied meanwhile by releases on other threads
                pass
        return key

    def release(self, key):
        self._works.pop(key, None)


class _Work(_WorkBase):
    """A torch Work over a collectived op."""

    def __init__(self, cwork, staging, result, on_error, keep_alive, future_streams=None):
        super().__init__()
        self._keep_alive = keep_alive
        self._keep_alive_key = keep_alive.hold(self)
        self._cwork = cwork
        self._staging = staging
        self._result = result
        self._future = None  # made on the first get_future(): most ops never ask
        self._finished = CompletionFlag()
        self._on_error = on_error
        # CUDA ops with nothing to copy back: wait() orders the current stream after the op
        # instead of blocking until it ran (c10d's NCCL semantics).
        device = staging.device
        self._stream_ordinal = device.index if (
            _STREAM_ORDERED_WAIT and device is not None and device.type == "cuda" and
            not getattr(staging, "_staged", ())) else None
        # Where a collective's future completes at once (None: once the op completed).
        self._future_streams = future_streams if self._stream_ordinal is not None else None
        cwork.add_done_callback(self._on_done)

    def _on_done(self, cwork):
        error = cwork.exception()
        try:
            self._staging.finish(error is None)
        finally:
            self._staging = _NoStaging  # what it held (stand-ins, pool handles) is not needed
            if error is not None:
                self._on_error(error)
            with _future_lock:
                self._finished.set()
                future = self._future
            if future is not None and not future.done():  # not one completed on a stream
                _futures.complete(future, self._result)

    def wait(self, timeout=None):
        if self._stream_ordinal is not None and not self._finished.is_set():
            self._cwork.wait_stream(_cuda.current_stream(self._stream_ordinal),
                                    _seconds(timeout))
            self._keep_alive.release(self._keep_alive_key)
            return True
        # One wake-up: _finished is set after the copies back, on the thread that completed
        # the op; waking on the op first and then on the copies costs a second GIL hand-off.
        if not self._cwork.wait_event(self._finished, _seconds(timeout)):
            self._cwork.wait(0)  # raises the op's timeout error, unless it just completed
            self._finished.wait()
        self._keep_alive.release(self._keep_alive_key)  # whoever waited holds this Work
        error = self._cwork.exception()
        if error is not None:
            raise error
        return True

    def is_completed(self):
        return self._finished.is_set()

    def is_success(self):
        return self._finished.is_set() and self._cwork.exception() is None

    def exception(self):
        return self._cwork.exception()

    def get_future(self):
        # The future is what the caller keeps; until the op completes, its client Work's
        # callback keeps this Work alive.
        self._keep_alive.release(self._keep_alive_key)
        on_stream = None
        if self._future_streams is not None and self._future is None and \
                not self._finished.is_set():
            on_stream = self._future_streams.complete_at_once(
                self._cwork.wait_stream, self._stream_ordinal, self._result)
        with _future_lock:
            if self._future is None:
                self._future = on_stream or torch.futures.Future()
                if on_stream is not None or not self._finished.is_set():
                    return self._future  # complete, or _on_done completes it
            else:
                return self._future
        self._future.set_result(self._result)  # the op completed before anyone asked
        return self._future

    def result(self):
        return self._result

    def source_rank(self):
        return self._cwork.source_rank

    def _source_rank(self):
        return self._cwork.source_rank

    def synchronize(self):
        pass


class _NativeWork(_WorkBase):
    """A torch Work over an op of the native session (collectived.native_session.NativeWork)."""

    def __init__(self, nwork, result, ordinal, keep_alive, future_streams):
        super().__init__()
        self._keep_alive = keep_alive
        self._keep_alive_key = keep_alive.hold(self)
        self._nwork = nwork
        self._result = result
        self._future = None
        # CUDA ops (``ordinal``: their device's, None on CPU): wait() orders the current stream
        # after the op (c10d's NCCL semantics).
        self._stream_ordinal = ordinal if _STREAM_ORDERED_WAIT else None
        self._future_streams = future_streams if self._stream_ordinal is not None else None

    def wait(self, timeout=None):
        try:
            if self._stream_ordinal is not None:
                self._nwork.wait_stream(_cuda.current_stream(self._stream_ordinal),
                                        _seconds(timeout))
            else:
                self._nwork.wait(_seconds(timeout))
        finally:
            self._keep_alive.release(self._keep_alive_key)
        return True

    def is_completed(self):
        return self._nwork.is_completed()

    def is_success(self):
        return self._nwork.is_completed() and self._nwork.exception() is None

    def exception(self):
        return self._nwork.exception()

    def get_future(self):
        self._keep_alive.release(self._keep_alive_key)  # the op's callback holds it until done
        on_stream = None
        if self._future_streams is not None and self._future is None and \
                not self._nwork.is_completed():
            on_stream = self._future_streams.complete_at_once(
                self._nwork.wait_stream, self._stream_ordinal, self._result)
        with _future_lock:
            if self._future is not None:
                return self._future
            self._future = on_stream or torch.futures.Future()
        if on_stream is not None:
            return on_stream
        if self._nwork.is_completed():
            self._future.set_result(self._result)  # complete already, as the caller may expect
        else:
            self._nwork.add_done_callback(self._complete_future)
        return self._future

    def _complete_future(self, nwork):
        # As _Work's: never an error through a future (torch 1.13's DDP crashes on those); the
        # op's wait() raises it, and a failure of its group fails the group's next op.
        _futures.complete(self._future, self._result)

    def result(self):
        return self._result

    def source_rank(self):
        return -1

    def _source_rank(self):
        return -1

    def synchronize(self):
        pass


class ProcessGroupCollectived(dist.ProcessGroup):
    """A process group served by the local collectived sidecar."""

    def __init__(self, store, rank, size, timeout=datetime.timedelta(minutes=30), client=None,
                 job_token=None):
        super().__init__(rank, size)
        self._client = client or shared_client()
        self._timeout = _seconds(timeout) or 1800.0
        self._sequence_number = 0
        self._failure = None
        self._keep_alive = _KeepAlive()
        self._future_streams = _FutureStreams()
        # Bootstrap from the store torch handed us (a PrefixStore unique to this group): rank 0
        # names the group and offers its sidecar's store for the sidecars' own rendezvous.
        index = next(_group_index)
        if rank == 0:
            info = self._client.sidecar_info()
            store.set(torch_names.BOOTSTRAP_KEY, torch_names.bootstrap_record(
                torch_names.group_name(current_job_name(), index), info.advertise_address))
        name, store_address = torch_names.parse_bootstrap_record(
            store.get(torch_names.BOOTSTRAP_KEY))
        self._name = name
        # torch 2.x names each group ("0", "1", or a hash of its ranks), registers it under that
        # name and finds it again by it; the sidecar's name stays ours (unique per incarnation).
        self._torch_group_name = None
        self._group_desc = "undefined"
        self._destroyed = False
        self._store_address = store_address
        self._job_token = job_token if job_token is not None else current_job_token()
        self._cuda_group = None  # (sidecar group name, torch.device), created on first use
        # The native path's groups (see _NATIVE_WANTED): CUDA ordinal (None for CPU) -> sidecar
        # group name (bytes). The last CUDA op of each path, until a CUDA op of the other path
        # ordered itself after it (see _fence): (work, CUDA ordinal).
        self._native = None
        self._native_groups = {}
        self._native_cuda = None  # the CUDA ordinal of the native CUDA group
        self._native_failures_seen = 0  # the native session's failure_count() when last read
        self._native_tail = None
        self._python_tail = None
        self._client.create_group(name, rank, size, store_address=store_address,
                                  timeout=self._timeout, job_token=self._job_token)
        if _NATIVE_WANTED:
            # Joined with the group, as its Python twin: a first op issued asynchronously must
            # not wait for the other ranks to join (the CUDA groups join at their first op, as
            # NCCL's communicators do).
            self._native_group_for(None)

    def _sidecar_group_for(self, device):
        """The sidecar group of ``device``'s tensors. The CUDA group joins the sidecars at the
        first CUDA op, which every rank issues at the same point (c10d's rule that ranks issue
        the same ops in the same order), as NCCL's process group creates its communicators."""
        if device is None or device.type == "cpu":
            return self._name
        if self._cuda_group is None:
            name = f"{self._name}-cuda"
            self._client.create_group(name, self.rank(), self.size(),
                                      store_address=self._store_address, timeout=self._timeout,
                                      job_token=self._job_token, device=str(device))
            self._cuda_group = (name, device)
        name, joined = self._cuda_group
        if device != joined:
            raise ValueError(f"collectived: this process group's CUDA tensors live on {joined} "
                             f"(where its first CUDA op ran), not on {device}")
        return name

    # -- identity --------------------------------------------------------------------------

    def getBackendName(self):
        return BACKEND_NAME

    def _get_backend_name(self):
        return BACKEND_NAME

    def name(self):
        return BACKEND_NAME

    @property
    def sidecar_group(self):
        """The group's name in the sidecars (``collectivectl describe NAME``)."""
        return self._name

    @property
    def group_name(self):
        return self._torch_group_name or self._name

    def _set_group_name(self, name):
        self._torch_group_name = name

    # The C++ names, which newer torch lets a Python group override.
    def setGroupName(self, name):
        self._set_group_name(name)

    def getGroupName(self):
        return self.group_name

    @property
    def group_desc(self):
        return self._group_desc

    def _set_group_desc(self, desc):
        self._group_desc = desc

    def setGroupDesc(self, desc):
        self._set_group_desc(desc)

    def getGroupDesc(self):
        return self._group_desc

    @property
    def _device_types(self):
        # torch 2.x picks a group's device for object collectives and barrier from its
        # backends; this group registers none (it is its own backend).
        return [torch.device(kind) for kind in _served_device_types()]

    def _get_backend(self, device):
        """torch 2.x asks a group for its backend per device: this group serves CPU, and CUDA
        when the client can pass CUDA tensors, itself."""
        device = torch.device(device)
        if device.type not in _served_device_types():
            raise RuntimeError(f"collectived: no backend for device type {device.type} "
                               f"(this client serves {', '.join(_served_device_types())})")
        return self

    @property
    def supports_splitting(self):
        return False

    @property
    def supports_coalescing(self):
        return False

    # -- lifetime --------------------------------------------------------------------------

    def shutdown(self):
        """Leaves the group in the sidecars; the other ranks' pending ops fail naming this rank."""
        if self._destroyed:
            return
        self._destroyed = True
        names = [self._name] + ([self._cuda_group[0]] if self._cuda_group else [])
        for name in names:
            try:
                self._client.destroy_group(name)
            except Exception:  # noqa: BLE001 - the sidecar or the session may already be gone
                pass
        for name in self._native_groups.values():
            try:
                self._native.destroy_group(name.decode())
            except Exception:  # noqa: BLE001 - as above
                pass

    def abort(self):
        self.shutdown()

    def _get_sequence_number_for_group(self):
        return self._sequence_number

    def __repr__(self):
        return (f"ProcessGroupCollectived(group={self._name}, rank={self.rank()}, "
                f"size={self.size()})")

    # -- plumbing --------------------------------------------------------------------------

    def _record_error(self, error):
        if getattr(error, "kind", "") in ("peer_lost", "aborted", "timeout"):
            self._failure = error

    def _run(self, collective, build, result, counts=True):
        """Submits ``build(client, staging)`` (which returns the client's Work) as one op."""
        self._check_usable(collective)
        staging = _Staging(self._client)
        try:
            cwork = build(_Router(self, self._client, staging, collective=counts), staging)
        except BaseException:
            staging.finish(False)
            raise
        return self._track(cwork, staging, result, counts)

    def _track(self, cwork, staging, result, counts=True):
        """The torch Work of the client's Work ``cwork``, kept alive (see _KeepAlive)."""
        if counts:
            self._sequence_number += 1
        if counts and self._native_groups and staging.device is not None and \
                staging.device.type == "cuda":  # collectives only (see _Router._fenced)
            self._python_tail = (cwork, staging.device.index)
        # A send or recv that timed out leaves the sidecar's group working: only collectives'
        # failures poison the group here (a lost peer fails the sidecar's group anyway).
        # Sends' and receives' futures complete once the op completed: completed at once, on
        # the event path each would wait on the CPU until its peer posted the other half.
        return _Work(cwork, staging, result, self._record_error if counts else lambda error: None,
                     self._keep_alive, self._future_streams if counts else None)

    def _check_usable(self, collective):
        """Raises when the group can take no more ops (a native group's failure included)."""
        if self._native_groups:
            # The native session counts its groups' failures: ask which only when it changed.
            failures = self._native.failure_count()
            if failures != self._native_failures_seen:
                for name in self._native_groups.values():
                    self._note_native_failure(name)
                self._native_failures_seen = failures  # once every group was asked
        if self._failure is not None:
            raise type(self._failure)(str(self._failure))
        if self._destroyed:
            raise RuntimeError(f"collectived: {collective} on a process group that was shut "
                               f"down (group {self.group_name}, sidecar group {self._name})")

    def _run_inline(self, collective, submit, result):
        """As _run, for an op whose one CPU tensor travels inline: ``submit()`` returns the
        client's Work (no staging, no routing: the CPU group)."""
        self._check_usable(collective)
        return self._track(submit(), _NoStaging, result)

    def _run_on_device(self, collective, device, submit, result):
        """As _run, for an op of dense CUDA tensors on ``device`` (see _dense_cuda_device):
        ``submit(group)`` returns the client's Work of the op on the sidecar group ``group``."""
        self._check_usable(collective)
        if self._native_tail is not None:
            self._order_after_native(device)
        return self._track(submit(self._sidecar_group_for(device)), _OnDevice(device), result)

    # -- the native path (COLLECTIVED_TORCH_NATIVE=1) ---------------------------------------

    def _native_op(self, what, written, read, submit, in_place=True):
        """An op through the native session (``submit(group, written, read)`` with contiguous
        tensors returns its NativeWork), or None when it takes the Python path. ``written``: the
        tensors the op writes (read first too when ``in_place``), ``read``: those it only reads.
        The choice rests only on what every rank's tensors have in common (their device type and
        sizes), so that every rank takes the same path: non-empty CUDA tensors on one device, and
        CPU tensors small enough to travel inline; a non-contiguous one goes through a
        contiguous copy."""
        first = written[0]
        if first.layout != torch.strided or (read and any(t.layout != torch.strided
                                                          for t in read)):
            return None
        largest = max(t.numel() * t.element_size() for t in written + read) if read else \
            first.numel() * first.element_size()
        if largest == 0:
            return None  # an empty CUDA tensor has no memory to share: the Python path
        # Each tensor's device is read without making a torch.device (0.1 against 0.7 us).
        if first.is_cuda:
            device = first.get_device()
            if read and any(not t.is_cuda or t.get_device() != device for t in read):
                return None  # the Python path says what is wrong
        elif first.is_cpu:
            if read and any(not t.is_cpu for t in read):
                return None
            if largest > _inline_bytes(self._client):
                return None
            device = None
        else:
            return None
        # A failure of any of the group's sidecar groups, or its shutdown, raises here: before a
        # group is joined (a group just joined has no failure yet).
        self._check_usable(what)
        group = self._native_groups.get(device) or self._native_group_for(device)
        if device is not None and self._python_tail is not None:
            if self._python_tail[1] == device:
                self._fence(self._python_tail)
            self._python_tail = None
        dense_written = _contiguous(written, in_place)
        work = submit(group, dense_written, _contiguous(read) if read else read)
        self._sequence_number += 1
        if dense_written is not written:  # the results land in copies: back into the tensors
            if device is not None and _STREAM_ORDERED_WAIT:
                work.wait_stream(_cuda.current_stream(device))  # the copies follow the op
            else:
                work.wait()
            for tensor, dense in zip(written, dense_written):
                if dense is not tensor:
                    tensor.copy_(dense)
        if device is not None:
            self._native_tail = (work, device)
        # A copied-back result is written on the caller's stream, after the op: its future
        # completes once the op completed, as a staged op's on the Python path.
        return _NativeWork(work, written, device, self._keep_alive,
                           self._future_streams if dense_written is written else None)

    def _native_group_for(self, device):
        """The native path's group of ``device`` (a CUDA ordinal, None for CPU), joined on first
        use; every rank joins at the same op, its first one on that path. One CUDA device per
        process group, as on the Python path."""
        if device is not None and self._native_cuda is not None:
            raise ValueError(f"collectived: this process group's CUDA tensors live on "
                             f"cuda:{self._native_cuda} (where its first CUDA op ran), "
                             f"not on cuda:{device}")
        if self._native is None:
            self._native = shared_native_session()
        # The same name on every rank, whichever GPU each rank uses.
        name = f"{self._name}-native" if device is None else f"{self._name}-cuda-native"
        self._native.create_group(name, self.rank(), self.size(),
                                  store_address=self._store_address, timeout=self._timeout,
                                  job_token=self._job_token, device=device)
        if device is not None:
            self._native_cuda = device
        self._native_groups[device] = name.encode()
        return self._native_groups[device]

    def _note_native_failure(self, group):
        """Takes the failure of a native group (peer lost, aborted, timed out) as the group's."""
        if self._failure is None:
            error = self._native.group_failure(group)
            if error is not None:
                self._failure = error

    def _order_after_native(self, device):
        """Before a Python-path op on CUDA ``device``: orders it after the native path's last
        CUDA op there, if that came last (see _fence)."""
        if self._native_tail is not None and self._native_tail[1] == device.index:
            self._fence(self._native_tail)
            self._native_tail = None

    @staticmethod
    def _fence(tail):
        """Orders a CUDA op about to be issued on the device of ``tail`` ((work, CUDA ordinal)),
        the last CUDA op of the other path there, as one NCCL stream orders a group's ops: the
        current stream waits for it (the CPU, with COLLECTIVED_CUDA_WAIT=blocking). Called only
        where the path changes, on the same device. Host ops are not ordered across paths: an
        async op's bytes are read when it runs, in Gloo too. The op's own failure is not raised
        here (its wait raises it, and one that fails its group fails the next op). A stream
        wait that fails (an event that cannot be opened or waited on) falls back to the CPU's
        wait, so that the ordering is never lost."""
        work, ordinal = tail
        if _STREAM_ORDERED_WAIT:
            try:
                work.wait_stream(_cuda.current_stream(ordinal))
                return
            except Exception:  # noqa: BLE001 - ordered on the CPU below
                pass
        try:
            work.wait()
        except Exception:  # noqa: BLE001 - the op's own failure, see above
            pass

    def _one(self, tensors, what):
        if isinstance(tensors, torch.Tensor):  # the ProcessGroup overloads' single tensor
            return tensors
        if len(tensors) != 1:
            raise ValueError(f"collectived: {what} takes exactly one tensor per process "
                             f"(got {len(tensors)})")
        return tensors[0]

    # -- collectives -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "allreduce")
        op, scale = _reduce_op(opts)
        if _NATIVE_WANTED:
            work = self._native_op("allreduce", [tensor], [], lambda group, w, r:
                                   self._native.allreduce(group, w[0], op=op, scale=scale))
            if work is not None:
                return work
        if tensor.layout == torch.sparse_coo:
            return self._run("allreduce", lambda c, s: self._sparse_allreduce(tensor, op),
                             [tensor])
        if _inline(tensor, self._client):  # the common small op: the shortest path
            return self._run_inline("allreduce", lambda: self._client.allreduce(
                self._name, tensor, op=op, scale=scale, async_op=True), [tensor])
        device = _dense_cuda_device(tensor)
        if device is not None:  # DDP's buckets
            return self._run_on_device("allreduce", device, lambda group: self._client.allreduce(
                group, tensor, op=op, scale=scale, async_op=True), [tensor])
        return self._run("allreduce", lambda c, s: c.allreduce(
            self._name, s.inout(tensor), op=op, scale=scale, async_op=True), [tensor])

    def _sparse_allreduce(self, tensor, op):
        # Runs to completion here (three sidecar allgathers, as Gloo does it); raises on failure.
        # CPU tensors only, as Gloo's.
        client = self._client

        def allgather(output, input):
            staging = _Staging(client)
            ok = False
            try:
                client.allgather_into_tensor(self._name, staging.output(output),
                                             staging.input(input))
                ok = True
            finally:
                staging.finish(ok)
        sparse_allreduce(allgather, self._name, tensor, op, self.size())
        return _AllOf([])  # nothing left to wait for

    def allreduce_coalesced(self, tensors, opts=None):
        op, scale = _reduce_op(opts)
        return self._run("allreduce_coalesced", lambda c, s: c.allreduce_coalesced(
            self._name, [s.inout(t) for t in tensors], op=op, scale=scale, async_op=True),
            tensors)

    def broadcast(self, tensors, opts=None):
        tensor = self._one(tensors, "broadcast")
        root = _root(opts)
        if _NATIVE_WANTED:
            work = self._native_op("broadcast", [tensor], [], lambda group, w, r:
                                   self._native.broadcast(group, w[0], root))
            if work is not None:
                return work
        device = _dense_cuda_device(tensor)
        if device is not None:
            return self._run_on_device("broadcast", device, lambda group: self._client.broadcast(
                group, tensor, root, async_op=True), [tensor])
        return self._run("broadcast", lambda c, s: c.broadcast(
            self._name, s.inout(tensor), root, async_op=True), [tensor])

    def reduce(self, tensors, opts=None, op=None):
        tensor = self._one(tensors, "reduce")
        root = _root(opts)
        op, scale = _reduce_op(op if isinstance(opts, int) else opts)
        return self._run("reduce", lambda c, s: c.reduce(
            self._name, s.inout(tensor), root, op=op, scale=scale, async_op=True), [tensor])

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(input_tensors, "allgather")
        if isinstance(input_tensors, torch.Tensor):  # allgather(outputs, tensor)
            output_tensors = [output_tensors]
        outputs = output_tensors[0]
        return self._run("allgather", lambda c, s: c.allgather(
            self._name, [s.output(t) for t in outputs], s.input(tensor), async_op=True),
            output_tensors)

    def _allgather_base(self, output, input, opts=None):
        if _NATIVE_WANTED and output.dtype == input.dtype:
            work = self._native_op("allgather_into_tensor", [output], [input],
                                   lambda group, w, r: self._native.allgather_into_tensor(
                                       group, w[0], r[0]), in_place=False)
            if work is not None:
                return work
        device = _dense_cuda_device(output, input)
        if device is not None:  # FSDP's parameters
            return self._run_on_device(
                "allgather_into_tensor", device, lambda group: self._client.allgather_into_tensor(
                    group, output, input, async_op=True), [output])
        return self._run("allgather_into_tensor", lambda c, s: c.allgather_into_tensor(
            self._name, s.output(output), s.input(input), async_op=True), [output])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # torch lays outputs out as [rank][input]; the client takes [input][rank].
        by_input = [[output_lists[r][i] for r in range(len(output_lists))]
                    for i in range(len(input_list))]
        return self._run("allgather_coalesced", lambda c, s: c.allgather_coalesced(
            self._name, [[s.output(t) for t in outputs] for outputs in by_input],
            [s.input(t) for t in input_list], async_op=True), output_lists)

    def gather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        outputs = output_tensors[0] if output_tensors else []
        return self._run("gather", lambda c, s: c.gather(
            self._name, s.input(tensor), [s.output(t) for t in outputs], root, async_op=True),
            output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        inputs = input_tensors[0] if input_tensors else []
        return self._run("scatter", lambda c, s: c.scatter(
            self._name, s.output(tensor), [s.input(t) for t in inputs], root, async_op=True),
            output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(output_tensors, "reduce_scatter")
        op, scale = _reduce_op(opts)
        return self._run("reduce_scatter", lambda c, s: c.reduce_scatter(
            self._name, s.output(tensor), [s.input(t) for t in input_tensors[0]], op=op,
            scale=scale, async_op=True), output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op, scale = _reduce_op(opts)
        if _NATIVE_WANTED and output.dtype == input.dtype:
            work = self._native_op("reduce_scatter_tensor", [output], [input],
                                   lambda group, w, r: self._native.reduce_scatter_tensor(
                                       group, w[0], r[0], op=op, scale=scale), in_place=False)
            if work is not None:
                return work
        device = _dense_cuda_device(output, input)
        if device is not None:  # FSDP's gradients
            return self._run_on_device(
                "reduce_scatter_tensor", device, lambda group: self._client.reduce_scatter_tensor(
                    group, output, input, op=op, scale=scale, async_op=True), [output])
        return self._run("reduce_scatter_tensor", lambda c, s: c.reduce_scatter_tensor(
            self._name, s.output(output), s.input(input), op=op, scale=scale, async_op=True),
            [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        def elements(tensor, splits):
            if not splits:
                return None
            row = tensor.numel() // tensor.shape[0] if tensor.dim() > 0 and tensor.shape[0] else 1
            return [int(split) * row for split in splits]
        return self._run("alltoall_single", lambda c, s: c.alltoall_single(
            self._name, s.output(output), s.input(input),
            output_splits=elements(output, output_split_sizes),
            input_splits=elements(input, input_split_sizes), async_op=True), [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"collectived: allgather_into_tensor_coalesced got {len(outputs)} "
                             f"outputs for {len(inputs)} inputs")
        world = self.size()

        def per_rank(output):
            if not output.is_contiguous() or output.numel() % world:
                raise ValueError("collectived: allgather_into_tensor_coalesced needs contiguous "
                                 f"outputs of world size ({world}) times the input's elements")
            return list(output.view(world, -1).unbind(0))

        def submit(c, s):
            if len({t.dtype for t in inputs}) > 1:  # one sidecar op carries one dtype
                # Stage everything before submitting anything: a failure half-way must not
                # leave ops running on staging buffers that are released.
                staged = [(s.output(o), s.input(i)) for o, i in zip(outputs, inputs)]
                return _AllOf([c.allgather_into_tensor(self._name, o, i, async_op=True)
                               for o, i in staged])
            return c.allgather_coalesced(
                self._name, [[s.output(t) for t in per_rank(o)] for o in outputs],
                [s.input(t.reshape(-1)) for t in inputs], async_op=True)
        return self._run("allgather_into_tensor_coalesced", submit, outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"collectived: reduce_scatter_tensor_coalesced got {len(outputs)} "
                             f"outputs for {len(inputs)} inputs")
        op, scale = _reduce_op(opts)

        def submit(c, s):
            staged = [(s.output(o), s.input(i)) for o, i in zip(outputs, inputs)]
            return _AllOf([c.reduce_scatter_tensor(self._name, o, i, op=op, scale=scale,
                                                   async_op=True) for o, i in staged])
        return self._run("reduce_scatter_tensor_coalesced", submit, outputs)

    # The names newer torch's C++ calls these by (its Python API keeps the names above).
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._run("alltoall", lambda c, s: c.alltoall(
            self._name, [s.output(t) for t in output_tensors],
            [s.input(t) for t in input_tensors], async_op=True), output_tensors)

    def barrier(self, opts=None):
        return self._run("barrier", lambda c, s: c.barrier(self._name, async_op=True), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        seconds = _seconds(timeout) or self._timeout
        work = self._run("barrier", lambda c, s: c.barrier(self._name, async_op=True,
                                                             timeout=seconds), [])
        work.wait()

    def send(self, tensors, dst, tag=0):
        tensor = self._one(tensors, "send")
        return self._run("send", lambda c, s: c.send(
            self._name, s.input(tensor), dst, tag, async_op=True), tensors, counts=False)

    def recv(self, tensors, src, tag=0):
        tensor = self._one(tensors, "recv")
        return self._run("recv", lambda c, s: c.recv(
            self._name, s.output(tensor), src, tag, async_op=True), tensors, counts=False)

    def recv_anysource(self, tensors, tag=0):
        # torch's dist.recv(t) without src: the work's _source_rank() names the sender.
        tensor = self._one(tensors, "recv")
        return self._run("recv", lambda c, s: c.recv(
            self._name, s.output(tensor), None, tag, async_op=True), tensors, counts=False)


def _create(store, rank, world_size, timeout):
    return ProcessGroupCollectived(store, rank, world_size, timeout)


def _served_device_types():
    """CPU, and CUDA when this client was built with CUDA (without loading CUDA: that waits for
    the first CUDA tensor); whether the sidecar has a GPU is its to say, when the CUDA group is
    created."""
    return ["cpu", "cuda"] if _cuda.built() else ["cpu"]


def _registration_options():
    """torch 2.1+ asks which devices a plugin serves, so that "collectived" alone (or
    "cuda:collectived") picks it for CUDA tensors too. torch sends a Python process group the
    tensors of every device (the group is the whole ProcessGroup, not one device's Backend):
    _Staging refuses the others."""
    parameters = inspect.signature(dist.Backend.register_backend).parameters
    return {"devices": _served_device_types()} if "devices" in parameters else {}


def register():
    """Registers the backend "collectived" with torch.distributed (idempotent)."""
    if hasattr(dist.Backend, BACKEND_NAME.upper()):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, **_registration_options())
