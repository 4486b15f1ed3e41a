"""Work: an op submitted to the sidecar, completed by the client's session (stream or ring)."""

import ctypes
import threading

from collectived import cuda as _cuda
from collectived.completion_flag import CompletionFlag
from collectived.errors import CollectivedError, error_from_proto
from collectived.errors import TimeoutError as CollectivedTimeout


class Work:
    """An asynchronous op: wait(), is_completed(), exception(), callbacks."""

    def __init__(self, client, op, group, client_op_id, writeback):
        self._client = client
        self.op, self.group, self.client_op_id = op, group, client_op_id
        self._writeback = writeback
        self._via_ring = False
        self._done = CompletionFlag()
        self._completing = False  # claimed by the one _complete that completes it
        self._lock = threading.Lock()
        self._callbacks = []
        self._error = None
        self.response = None
        # CUDA ops: the device of their tensors, and the sidecar's completion event once it has
        # enqueued the op's GPU work (set with _enqueued, which completion sets too).
        self._cuda_device = None
        self._completion_event = None
        self._enqueued = None
        # CUDA collectives with a stream-signal word: (StreamSignalWords, Assigned), and the
        # same until the completion released the word.
        self._signal = None
        self._signal_release = None
        # CUDA ops of a client with stream signals: their leased ready events ((device, slot)
        # pairs), given back once the sidecar enqueued the op or it completed.
        self._leases = ()

    @property
    def sequence_number(self):
        return self.response.sequence_number if self.response else 0

    @property
    def source_rank(self):
        return self.response.source_rank if self.response else -1

    def is_completed(self):
        return self._done.is_set()

    def exception(self):
        return self._error

    def wait(self, timeout=None):
        """Blocks until the op completes; raises its error. ``timeout`` in seconds."""
        if not self.wait_event(self._done, timeout):
            raise CollectivedTimeout(f"Timeout: {self.op} (client op {self.client_op_id}) on group "
                                     f"'{self.group}' Timed out: it did not complete within "
                                     f"{timeout} s")
        if self._error is not None:
            raise self._error
        return True

    def wait_stream(self, stream, timeout=None):
        """c10d's ``Work.wait()`` on CUDA: makes ``stream`` (a cudaStream_t as an integer, of
        the op's device) wait for the op's results, blocking only until the sidecar has enqueued
        the op's GPU work (not until it ran); raises the op's error when it failed before that.
        A later failure shows in exception() and fails the group's next ops. Host ops, and ops
        already completed, wait as wait(). An op with a stream-signal word does not block at
        all: the stream waits on the word, which the sidecar's stream sets."""
        if self._signal is not None and not self._done.is_set():
            words, assigned = self._signal
            try:
                _cuda.wait_signal(self._cuda_device, stream, assigned.address, assigned.value)
                return True
            except _cuda.SignalWaitUnavailable:
                words.disable()  # later ops take the event path; this one waits on the CPU
                return self.wait(timeout)
            except ValueError as error:
                raise CollectivedError(f"{self.op} (client op {self.client_op_id}) on group "
                                       f"'{self.group}': {error}") from None
        if self._enqueued is None or self._done.is_set():
            return self.wait(timeout)
        if not self.wait_event(self._enqueued, timeout):
            return self.wait(0)  # raises the timeout, unless the op completed just now
        if self._done.is_set():
            return self.wait()  # completed: its GPU work ran; returns at once
        try:
            _cuda.wait_sidecar_event(self._cuda_device, stream, self._completion_event)
        except ValueError as error:
            raise CollectivedError(f"{self.op} (client op {self.client_op_id}) on group "
                                   f"'{self.group}': {error}") from None
        return True

    def _take_leases(self):
        with self._lock:
            leases, self._leases = self._leases, ()
        return leases

    def _release_ready(self):
        if self._leases:  # most ops lease nothing (taking them clears it: no race is lost)
            _cuda.release_ready(self._take_leases())

    def _mark_enqueued(self, completion_event):
        self._release_ready()  # enqueued: the sidecar's stream waited on them
        if self._enqueued is None or not completion_event:
            return
        with self._lock:
            if self._done.is_set():
                return
            self._completion_event = completion_event
            self._enqueued.set()

    def wait_event(self, event, timeout=None):
        """Waits for ``event``, which this op's completion sets (itself, or a callback's), as
        fast as the op's path allows. Returns whether it is set."""
        if self._via_ring:
            return self._client._await(event, timeout)
        return event.wait(timeout)

    def add_done_callback(self, callback):
        """Runs ``callback(work)`` once the op completes (at once if it already has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def _complete(self, response=None, error=None):
        # Once: a completion can race another (the ring's and a session that closed).
        with self._lock:
            if self._completing:
                return
            self._completing = True
        self.response = response
        if error is None and response is not None:
            error = error_from_proto(response.error)
            if error is None:
                error = self._apply_writeback(response)
        self._error = error
        self._release_ready()  # the sidecar waited on them, or never will
        self._writeback = ()  # the op's tensors: needed no more, not kept by a kept Work
        with self._lock:
            # Once, before the op shows as done: a completion racing this one finds it released.
            signal, self._signal_release = self._signal_release, None
            if signal is not None:
                signal[0].completed(signal[1], error is None)
            self._done.set()
            if self._enqueued is not None:
                self._enqueued.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def _apply_writeback(self, response):
        outputs = list(response.outputs)
        for index, raw in self._writeback:
            if index is None:
                continue  # a CUDA tensor: the sidecar wrote it in place
            if index >= len(outputs):
                if self.op == "reduce":
                    continue  # non-root ranks get nothing back
                return CollectivedError(f"{self.op}: the sidecar returned {len(outputs)} outputs, "
                                        f"expected output {index}")
            data = outputs[index]
            if not data and raw.nbytes:
                continue
            if len(data) != raw.nbytes:
                return CollectivedError(f"{self.op}: output {index} has {len(data)} bytes, expected "
                                        f"{raw.nbytes}")
            ctypes.memmove(raw.ptr, data, raw.nbytes)
        return None
