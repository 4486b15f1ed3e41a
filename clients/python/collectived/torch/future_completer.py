"""Completes the torch futures of the backend's works (``Work.get_future()``) off the clients'
completion threads.

torch runs a future's callbacks (``then``: DDP's communication hooks) on the thread that
completes it, and a callback may wait for another op: PowerSGD's hook waits inside its callbacks
for the allreduces it issues there. Completed on the thread that delivers the clients'
completions, that wait could never end: the op it waits for is delivered by the same thread. So
futures are completed on threads of their own, one more whenever every one is busy (a callback
waiting for an op whose future, in turn, needs a thread), kept for the next completions.
"""

import collections
import threading


class FutureCompleter:
    """Runs ``future.set_result(result)`` on a completer thread, in the order asked where one
    thread suffices. Thread-safe."""

    def __init__(self, name="collectived-futures"):
        self._name = name
        self._ready = threading.Condition(threading.Lock())
        self._queue = collections.deque()
        self._threads = 0
        self._busy = 0  # threads running a completion (and its callbacks)

    def complete(self, future, result):
        with self._ready:
            self._queue.append((future, result))
            if len(self._queue) <= self._threads - self._busy:
                self._ready.notify()
                return
            self._threads += 1  # every thread is busy: one more
            number = self._threads
        threading.Thread(target=self._run, name=f"{self._name}-{number}", daemon=True).start()

    def threads(self):
        """How many completer threads were started (for tests)."""
        with self._ready:
            return self._threads

    def _run(self):
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                future, result = self._queue.popleft()
                self._busy += 1
            try:
                future.set_result(result)
            except Exception:  # noqa: BLE001 - a callback's error is the future's, not ours
                pass
            future = result = None  # not kept alive while this thread waits
            with self._ready:
                self._busy -= 1
