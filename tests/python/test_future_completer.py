"""FutureCompleter: the torch backend completes its works' futures on threads of their own, so
that a future's callback may wait for another op's future (PowerSGD's DDP hook does), and reuses
those threads."""

import threading

import torch

from collectived.torch.future_completer import FutureCompleter


def test_a_callback_that_waits_for_another_future_gets_it():
    completer = FutureCompleter()
    outer, inner = torch.futures.Future(), torch.futures.Future()
    seen = []

    def callback(future):
        completer.complete(inner, 7)  # as an op issued inside the callback completes
        seen.append(inner.wait())  # on another completer thread: this one is busy here
        return future.value() + 1

    chained = outer.then(callback)
    completer.complete(outer, 3)
    assert chained.wait() == 4
    assert seen == [7]
    assert completer.threads() == 2


def test_futures_complete_off_the_calling_thread_and_threads_are_reused():
    completer = FutureCompleter(stall=1.0)
    callers = []
    for value in range(200):
        future = torch.futures.Future()
        done = future.then(lambda f: callers.append(threading.current_thread().name) or
                           f.value())
        completer.complete(future, value)
        assert done.wait() == value
    assert all(name.startswith("collectived-futures-") for name in callers), set(callers)
    # One at a time, none waiting inside a callback: the thread that ran a completion serves
    # the next ones.
    assert completer.threads() == 1, completer.threads()


def test_a_burst_completes_in_order_on_one_thread():
    # A stall long enough that a busy machine (the GIL, the scheduler) cannot fake one.
    completer = FutureCompleter(stall=1.0)
    futures = [torch.futures.Future() for _ in range(500)]
    order = []
    chained = [future.then(lambda f: order.append(f.value()) or f.value()) for future in futures]
    for value, future in enumerate(futures):
        completer.complete(future, value)
    assert [future.wait() for future in chained] == list(range(500))
    # Nothing waited inside a callback: one thread ran them all, in the order completed.
    assert order == list(range(500))
    assert completer.threads() == 1


def test_drain_waits_for_the_completions_queued_and_running():
    completer = FutureCompleter()
    release = threading.Event()
    future = torch.futures.Future()
    future.then(lambda f: release.wait())
    completer.complete(future, 1)
    assert not completer.drain(0.05), "drained while a callback was still running"
    release.set()
    assert completer.drain(5.0)
