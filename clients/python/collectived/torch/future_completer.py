"""Completes the torch futures of the backend's works (``Work.get_future()``) off the clients'
completion threads.

torch runs a future's callbacks (``then``: DDP's communication hooks) on the thread that
completes it, and a callback may wait for another op: PowerSGD's hook waits inside its callbacks
for the allreduces it issues there. Completed on the thread that delivers the clients'
completions, that wait could never end: the op it waits for is delivered by the same thread.

So futures are completed on a thread of their own, in the order their ops completed (callbacks
that issue ops then issue them in the same order on every rank). When completions wait and no
completer thread has taken one for STALL seconds (a callback waiting, most likely for a
completion behind it), one more thread starts; threads are kept for later completions. Once
several run at once, the order in which their callbacks issue ops is up to timing, as with
Gloo's two worker threads.
"""

import atexit
import collections
import os
import threading
import time

STALL = 0.005  # seconds completions may wait with no thread taking one


class FutureCompleter:
    """Runs ``future.set_result(result)`` on completer threads, in order while one suffices.
    Thread-safe."""

    def __init__(self, name="collectived-futures", stall=STALL):
        self._name = name
        self._stall = stall
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A child has none of the threads, and a lock one of them held stays held there.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # completer threads wait here
        self._stalled = threading.Condition(self._lock)  # the supervisor waits here
        self._drained = threading.Condition(self._lock)  # drain() waits here
        self._queue = collections.deque()  # (future, result, time queued)
        self._threads = 0
        self._idle = 0  # threads waiting for work that no completion has claimed
        self._busy = 0  # threads running a completion (and its callbacks)
        self._taken = 0.0  # when a thread last took a completion
        self._supervised = False

    def complete(self, future, result):
        start = False
        with self._lock:
            self._queue.append((future, result, time.monotonic()))
            if self._idle > 0:
                self._idle -= 1  # claimed: the next completion needs another
                self._work.notify()
            elif self._threads == 0:
                self._threads = 1
                start = True
            else:
                self._stalled.notify()
        if start:
            self._start_thread(1)

    def threads(self):
        """How many completer threads were started (for tests)."""
        with self._lock:
            return self._threads

    def drain(self, timeout):
        """Waits up to ``timeout`` seconds until no completion is queued or running: at exit, so
        that no completer thread is inside torch when the interpreter finalizes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._drained.wait(left):
                    return False
        return True

    def _start_thread(self, number):
        threading.Thread(target=self._run, name=f"{self._name}-{number}", daemon=True).start()
        with self._lock:
            if self._supervised:
                return
            self._supervised = True
        threading.Thread(target=self._supervise, name=f"{self._name}-supervisor",
                         daemon=True).start()

    def _supervise(self):
        """Starts one more thread when completions wait, every thread is busy, and none took a
        completion for STALL seconds (a burst that the threads work through starts none)."""
        while True:
            number = None
            with self._lock:
                if not self._queue or self._idle > 0 or self._busy < self._threads:
                    self._stalled.wait()
                    continue
                waited = time.monotonic() - max(self._taken, self._queue[0][2])
                if waited < self._stall:
                    self._stalled.wait(self._stall - waited)
                    continue
                self._threads += 1
                number = self._threads
            self._start_thread(number)

    def _run(self):
        while True:
            with self._lock:
                while not self._queue:
                    self._idle += 1
                    self._work.wait()
                future, result, _ = self._queue.popleft()
                self._busy += 1
                self._taken = time.monotonic()
            try:
                future.set_result(result)
            except Exception:  # noqa: BLE001 - a callback's error is the future's, not ours
                pass
            future = result = None  # not kept alive while this thread waits
            with self._lock:
                self._busy -= 1
                if not self._queue and not self._busy:
                    self._drained.notify_all()
                if self._queue:
                    self._stalled.notify()  # still behind: the supervisor keeps counting


def drain_at_exit(completer, timeout=2.0):
    """Registers ``completer.drain(timeout)`` to run at interpreter exit."""
    atexit.register(completer.drain, timeout)
