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
    completer = FutureCompleter()
    callers = []
    for value in range(200):
        future = torch.futures.Future()
        done = future.then(lambda f: callers.append(threading.current_thread().name) or
                           f.value())
        completer.complete(future, value)
        assert done.wait() == value
    assert all(name.startswith("collectived-futures-") for name in callers), set(callers)
    # One at a time: threads that ran a completion serve the next ones. A new one starts only
    # when every one is busy, here when all are still returning from their callbacks as the next
    # completion comes: a few for 200 completions, not one each.
    assert completer.threads() <= 8, completer.threads()


def test_many_completions_at_once_all_complete():
    completer = FutureCompleter()
    futures = [torch.futures.Future() for _ in range(500)]
    for value, future in enumerate(futures):
        completer.complete(future, value)
    assert [future.wait() for future in futures] == list(range(500))
