"""The torch Work of an op of the native session, and its future.

``wait()`` on a CPU op blocks until the op completed (and its results were copied back); on a
CUDA op it makes the current stream wait for the op and returns at once, as ProcessGroupNCCL's
does (``COLLECTIVED_CUDA_WAIT=blocking``: it blocks the CPU instead), unless results land in
stand-ins that must be copied back, which waits on the CPU. A future never carries an error
(torch 1.13 reports a future completed with an exception as a success and DDP crashes on it):
it carries the tensors, the op's ``wait()`` raises its error, and a failure of the group fails
the group's next op. A CUDA collective's future completes at once on a stream of the group's
own, ordered after the op (as ProcessGroupNCCL's); others complete once the op completed, on a
thread of their own (collectived.torch.future_completer), never on the client's reader thread.
"""

import collections
import itertools
import threading

import torch
import torch.distributed as dist

from collectived import cuda as _cuda
from collectived import environment
from collectived.completion_flag import CompletionFlag
from collectived.torch.future_completer import FutureCompleter, drain_at_exit
from collectived.torch.op_options import seconds

# COLLECTIVED_CUDA_WAIT=blocking makes wait() on CUDA ops block the CPU until the op ran, as on
# host memory, instead of ordering the current stream after it (the default, c10d's semantics).
# A stream ordered after a sidecar that then dies may never run again; a blocked CPU gets the
# error.
STREAM_ORDERED_WAIT = environment.get("COLLECTIVED_CUDA_WAIT", "stream") != "blocking"

_WorkBase = getattr(dist, "_Work", None) or dist.Work

# Orders a Work's completion against the first get_future(), so its future completes once.
_future_lock = threading.Lock()
# Completes the futures of ops that complete after get_future(): off the client's reader
# thread, as a future's callbacks (DDP communication hooks) may wait for other ops.
_futures = FutureCompleter()
# Registered before the session's close (atexit runs last what came first): the futures that
# close completes are completed before the interpreter finalizes.
drain_at_exit(_futures)


class FutureStreams:
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
        caller's thread, in the order the caller asks for its futures: the same on every rank.
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


class KeepAlive:
    """The Python Works that torch may still call into. torch keeps only the C++ half of a Work
    returned from Python, and without a Python reference its overrides vanish ("Work::getFuture
    not implemented"): DDP, for one, asks for the future of a Work it never hands to Python.
    A Work stays here until it was waited for or its future was taken (torch needs nothing more
    of it then, and the tensors it holds are freed with it), or until LIMIT newer ones came."""

    LIMIT = 4096

    def __init__(self):
        self._works = collections.OrderedDict()  # key -> Work, oldest first
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


class AllOf:
    """Several native ops seen as one (a coalesced call the sidecar runs as separate ops, or
    none at all: an op that completed while it was issued, such as a sparse allreduce)."""

    def __init__(self, works):
        self._works = works

    def wait(self, timeout=None):
        for work in self._works:
            work.wait(timeout)
        return True

    def wait_stream(self, stream, timeout=None):
        for work in self._works:
            work.wait_stream(stream, timeout)
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self._works)

    def exception(self):
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)

    def add_done_callback(self, callback):
        remaining = [len(self._works)]
        lock = threading.Lock()

        def one_done(_):
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                callback(self)
        if not self._works:
            callback(self)
        for work in self._works:
            work.add_done_callback(one_done)

    def source_rank(self):
        return -1


class Work(_WorkBase):
    """A torch Work over an op of the native session (a NativeWork, or an AllOf of them).
    ``tensors``: the op's OpTensors when it has stand-ins to copy back or give back (None
    otherwise); ``ordinal``: the CUDA device of a CUDA op, None on CPU; ``future_streams``:
    where a collective's future completes at once (None for sends and receives, whose futures
    complete once the op completed)."""

    def __init__(self, nwork, result, tensors, ordinal, keep_alive, future_streams):
        super().__init__()
        self._keep_alive = keep_alive
        self._keep_alive_key = keep_alive.hold(self)
        self._nwork = nwork
        self._result = result
        self._future = None  # made on the first get_future(): most ops never ask
        self._tensors = tensors
        # Results copied back on completion: waits are on the CPU, after the copies.
        self._finished = CompletionFlag() if tensors is not None else None
        self._stream_ordinal = ordinal if (STREAM_ORDERED_WAIT and ordinal is not None and
                                           tensors is None) else None
        self._future_streams = future_streams if self._stream_ordinal is not None else None
        if tensors is not None:
            nwork.add_done_callback(self._on_done)

    def _on_done(self, nwork):
        try:
            self._tensors.finish(nwork.exception() is None)
        finally:
            self._tensors = None
            with _future_lock:
                self._finished.set()
                future = self._future
            if future is not None and not future.done():
                _futures.complete(future, self._result)

    def _completed(self):
        return self._finished.is_set() if self._finished is not None else \
            self._nwork.is_completed()

    def wait(self, timeout=None):
        try:
            if self._stream_ordinal is not None:
                self._nwork.wait_stream(_cuda.current_stream(self._stream_ordinal),
                                        seconds(timeout))
                return True
            self._nwork.wait(seconds(timeout))  # raises the op's error or its timeout
            if self._finished is not None:
                self._finished.wait()  # the copies back, on the thread that completed it
            return True
        finally:
            self._keep_alive.release(self._keep_alive_key)  # whoever waited holds this Work

    def is_completed(self):
        return self._completed()

    def is_success(self):
        return self._completed() and self._nwork.exception() is None

    def exception(self):
        return self._nwork.exception()

    def get_future(self):
        # The future is what the caller keeps; until the op completes, its callback keeps this
        # Work alive.
        self._keep_alive.release(self._keep_alive_key)
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
            completed = self._completed()
            pending_copies = self._finished is not None and not completed
        if completed:
            self._future.set_result(self._result)  # complete already, as the caller may expect
        elif not pending_copies:
            self._nwork.add_done_callback(self._complete_future)
        return self._future  # (pending copies: _on_done completes it)

    def _complete_future(self, nwork):
        _futures.complete(self._future, self._result)

    def result(self):
        return self._result

    def source_rank(self):
        return self._nwork.source_rank()

    def _source_rank(self):
        return self._nwork.source_rank()

    def synchronize(self):
        pass
