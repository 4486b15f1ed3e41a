"""CompletionFlag, the threading.Event stand-in every op's completion sets (no sidecar needed)."""

import threading
import time

from collectived.completion_flag import CompletionFlag


def test_set_before_wait_returns_at_once():
    flag = CompletionFlag()
    assert not flag.is_set()
    assert flag.wait(0) is False
    flag.set()
    assert flag.is_set()
    assert flag.wait() is True
    assert flag.wait(0) is True
    flag.set()  # a second set changes nothing
    assert flag.is_set()


def test_wait_times_out_when_nobody_sets_it():
    flag = CompletionFlag()
    start = time.monotonic()
    assert flag.wait(0.05) is False
    assert time.monotonic() - start >= 0.04
    assert flag._sleepers == []  # the timed-out waiter left no lock behind
    flag.set()
    assert flag.wait(0.05) is True


def test_set_on_another_thread_wakes_every_sleeper():
    flag = CompletionFlag()
    woken = []
    lock = threading.Lock()

    def sleeper(timeout):
        result = flag.wait(timeout)
        with lock:
            woken.append(result)

    threads = [threading.Thread(target=sleeper, args=(t,)) for t in (None, 10.0, None, 10.0)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while (flag._sleepers is None or len(flag._sleepers) < 4) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(flag._sleepers) == 4, "the sleepers did not go to sleep"
    assert woken == []
    flag.set()
    for thread in threads:
        thread.join(5)
    assert woken == [True] * 4
    assert flag._sleepers is None


def test_racing_set_and_wait_never_lose_a_wake_up():
    # Many short races between one setter and one waiter: a waiter that registers just as the
    # flag is set must still return (within its generous timeout), and report the flag set.
    for _ in range(500):
        flag = CompletionFlag()
        results = []
        waiter = threading.Thread(target=lambda: results.append(flag.wait(5.0)))
        waiter.start()
        flag.set()
        waiter.join(5)
        assert not waiter.is_alive()
        assert results == [True]
