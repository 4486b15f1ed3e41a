"""CompletionFlag: a threading.Event for an op's completion that costs little to create.

Every op makes one or two, and threading.Event builds a Condition whose constructor probes its
lock with three failing getattr calls (three raised AttributeErrors): a few microseconds per op,
more than the rest of a small op's bookkeeping. Most flags are never slept on (a ring waiter
polls is_set() while it takes completions itself), so the lock a sleeper needs is made only
when somebody sleeps.
"""

import _thread

# Guards every flag's waiter list; held for a few bytecodes at a time.
_waiters_lock = _thread.allocate_lock()


class CompletionFlag:
    """set() once; is_set(); wait(timeout) -> whether it is set. Thread-safe."""

    __slots__ = ("_set", "_sleepers")

    def __init__(self):
        self._set = False
        self._sleepers = None  # locks held by sleeping waiters, released by set()

    def is_set(self):
        return self._set

    def set(self):
        with _waiters_lock:
            self._set = True
            sleepers, self._sleepers = self._sleepers, None
        if sleepers:
            for sleeper in sleepers:
                sleeper.release()

    def wait(self, timeout=None):
        if self._set:
            return True
        sleeper = _thread.allocate_lock()
        sleeper.acquire()
        with _waiters_lock:
            if self._set:
                return True
            if self._sleepers is None:
                self._sleepers = []
            self._sleepers.append(sleeper)
        if timeout is None:
            sleeper.acquire()
            return True
        if sleeper.acquire(True, max(0.0, timeout)):
            return True
        with _waiters_lock:
            if self._sleepers is not None and sleeper in self._sleepers:
                self._sleepers.remove(sleeper)
        return self._set
