"""The submission ring: a session's shared-memory data path for ops (rpc/submission_ring.h).

The sidecar hands the ring over the fd channel as a sealed memfd; submissions and completions
are serialized CollectiveRequest / CollectiveResponse messages in two queues, with futex
wake-ups. The queue logic is the C++ client's own (libcollectived_ring.so, loaded with ctypes);
without that library the client keeps using the session stream. The calls that never wait (a
submission with room for it, taking a completion, the bell, a kick) keep the GIL: released, it
goes to the completion reader, which the sidecar's completion of the previous op has woken, and
the submitting thread waits to get it back, a hand-off per op. The waits release it.
"""

import ctypes
import threading

from collectived import native


def _declare(lib):
    """The signatures of the ring functions this module calls."""
    lib.collectived_ring_attach.restype = ctypes.c_void_p
    lib.collectived_ring_attach.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.collectived_ring_detach.argtypes = [ctypes.c_void_p]
    lib.collectived_ring_max_record.restype = ctypes.c_uint64
    lib.collectived_ring_max_record.argtypes = [ctypes.c_void_p]
    lib.collectived_ring_submit.restype = ctypes.c_int
    lib.collectived_ring_submit.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64,
                                            ctypes.c_int64]
    lib.collectived_ring_try_submit.restype = ctypes.c_int
    lib.collectived_ring_try_submit.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64]
    lib.collectived_ring_try_completion.restype = ctypes.c_int64
    lib.collectived_ring_try_completion.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                    ctypes.c_uint64]
    lib.collectived_ring_bell.restype = ctypes.c_uint32
    lib.collectived_ring_bell.argtypes = [ctypes.c_void_p]
    lib.collectived_ring_sleep_since.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                                 ctypes.c_int64]
    lib.collectived_ring_kick.argtypes = [ctypes.c_void_p]
    lib.collectived_ring_reason.restype = ctypes.c_uint64
    lib.collectived_ring_reason.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64]


def _library(keep_gil=False):
    return native.load(native.RING, _declare, keep_gil)


def available():
    """Whether the native half is present (it is built with the client) and loads."""
    try:
        return _library() is not None
    except native.LoadError:
        return False


class RingClosed(Exception):
    """The ring is closed or broken; ``str()`` says why."""


class SubmissionRing:
    """A client's end of the ring. Every method may be called from any thread.

    Completions are taken by whichever thread needs one: a waiter reads ``bell()``, checks
    whether what it waits for happened, takes what is there (``take()``) and otherwise
    ``sleep_since(bell)``; a thread that took completions for others ``kick()``s them."""

    TIMEOUT = -1  # collectived_ring_try_completion: none now

    def __init__(self, fd):
        lib = _library()
        if lib is None:
            raise RingClosed(f"{native.RING} is missing")
        error = ctypes.create_string_buffer(512)
        self._handle = lib.collectived_ring_attach(fd, error, len(error))
        if not self._handle:
            raise RingClosed(error.value.decode("utf-8", "replace"))
        self._lib = lib
        self._quick = _library(keep_gil=True)
        self.max_record = lib.collectived_ring_max_record(self._handle)
        self._completion = ctypes.create_string_buffer(self.max_record)
        self._take_lock = threading.Lock()

    def submit(self, payload, timeout=30.0):
        """Appends one serialized request; raises RingClosed (with why) when it cannot."""
        result = self._quick.collectived_ring_try_submit(self._handle, payload, len(payload))
        if result == 1:  # no room now, or another thread waits for room: wait, GIL released
            result = self._lib.collectived_ring_submit(self._handle, payload, len(payload),
                                                       int(timeout * 1e6))
        if result == 0:
            return
        if result == 1:
            raise RingClosed(f"the sidecar took no submission for {timeout} s (ring full)")
        if result == 2:
            raise RingClosed(f"a request of {len(payload)} bytes exceeds the ring's record "
                             f"limit of {self.max_record}")
        raise RingClosed(self.reason())

    def take(self):
        """The next serialized response if one is there, else None; raises RingClosed."""
        with self._take_lock:
            size = self._quick.collectived_ring_try_completion(self._handle, self._completion,
                                                               self.max_record)
            if size >= 0:
                # string_at copies the record only (.raw would copy the whole buffer: 256 KiB)
                return ctypes.string_at(self._completion, size)
        if size == self.TIMEOUT:
            return None
        raise RingClosed(self.reason())

    def bell(self):
        return self._quick.collectived_ring_bell(self._handle)

    def sleep_since(self, seen, timeout):
        self._lib.collectived_ring_sleep_since(self._handle, seen, int(timeout * 1e6))

    def kick(self):
        self._quick.collectived_ring_kick(self._handle)

    def reason(self):
        text = ctypes.create_string_buffer(2048)
        self._lib.collectived_ring_reason(self._handle, text, len(text))
        return text.value.decode("utf-8", "replace") or "the submission ring is closed"

    def close(self):
        """Unmaps the ring (after the reader stopped)."""
        if self._handle:
            self._lib.collectived_ring_detach(self._handle)
            self._handle = None
