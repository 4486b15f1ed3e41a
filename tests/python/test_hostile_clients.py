"""Hostile clients end to end: every RPC of a real sidecar, over its Unix socket and its TCP
listener, gets empty, absurd, randomly mutated and unparseable requests (hostile_requests.py).

The daemon must answer every call (a wait may run into the caller's deadline, nothing else may),
never with UNKNOWN (an unhandled exception) nor INTERNAL for a request that parses, stay alive
and SERVING after every batch, not balloon in memory or threads, and afterwards still run a
normal 4-rank job across two sidecars with exact results. Counts are printed (run with -s).

Environment: COLLECTIVED_HOSTILE_SEED (default below, printed), COLLECTIVED_HOSTILE_CALLS
(default 2600), COLLECTIVED_HOSTILE_DEADLINE_S (per call, default 5).
"""

import logging
import os
import threading
import time
import uuid

import grpc
import numpy as np
import pytest

from collectived import Client, open_channel
from hostile_requests import MAX_MESSAGE_BYTES, BadStatusMessages, Ids, Runner
from torch_helpers import Sidecars

SEED = int(os.environ.get("COLLECTIVED_HOSTILE_SEED", "20240611"))
CALLS = int(os.environ.get("COLLECTIVED_HOSTILE_CALLS", "2600"))
DEADLINE_S = float(os.environ.get("COLLECTIVED_HOSTILE_DEADLINE_S", "5"))
BATCH = 200
RSS_GROWTH_BOUND = 1 << 30  # a safety bound, not a measurement: the figure is printed
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def proc_status(pid):
    """VmRSS (bytes), thread count and open fds of a live process."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return {"rss": int(fields["VmRSS"][0]) * 1024, "threads": int(fields["Threads"][0]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def health(channel, timeout=10.0):
    return channel.unary_unary(HEALTH_CHECK)(b"", timeout=timeout)


def log_tail(side, chars=6000):
    return f"--- {side.log_path} (tail)\n{side.log()[-chars:]}"


class Barrage:
    """The sidecars, the hostile runner and what was measured around it."""

    def __init__(self, sides, runner, before, after, after_settled, victim_info,
                 bad_status_messages):
        self.sides = sides
        self.runner = runner
        self.before = before
        self.after = after
        self.after_settled = after_settled
        self.victim_info = victim_info
        self.bad_status_messages = bad_status_messages


def _settle(pid, baseline_threads, timeout=15.0):
    """Waits (bounded) for the daemon's thread count to come back near its baseline."""
    deadline = time.monotonic() + timeout
    status = proc_status(pid)
    while time.monotonic() < deadline and status["threads"] > baseline_threads + 8:
        time.sleep(0.25)
        status = proc_status(pid)
    return status


@pytest.fixture(scope="module")
def barrage():
    sides = Sidecars(2)
    target = sides[0]
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    # Over TCP with the tests' client certificate (mutual TLS): hostile but authenticated.
    channels = {"unix": open_channel(target.unix_address, options=options),
                "tcp": open_channel(target.tcp_address, options=options)}
    victim = None
    bad_messages = BadStatusMessages()
    grpc_logger = logging.getLogger("grpc._cython.cygrpc")
    grpc_logger.addHandler(bad_messages)
    try:
        # A real session with a real buffer and a real one-rank group: hostile requests that
        # carry these ids get past the first checks and reach the engine.
        victim = Client(target.unix_address, name="hostile-victim")
        buffer = victim.allocate(4096)
        group = f"hostile-{uuid.uuid4().hex[:8]}"
        victim.create_group(group, 0, 1, store_address=target.tcp_address, timeout=30)
        victim.store().set("hostile/key", b"v")
        ids = Ids(session_id=victim.session_id, group=group, buffer_id=buffer.id,
                  store_address=target.tcp_address,
                  keys=["hostile/key"], client_op_ids=[1, 2, 3])
        runner = Runner(channels, ids, SEED, deadline_s=DEADLINE_S)
        pid = target.process.pid
        before = proc_status(pid)
        print(f"\nhostile clients: seed {SEED}, {CALLS} calls, deadline {DEADLINE_S} s, "
              f"{len(runner.methods)} methods x {len(channels)} listeners")
        jobs = runner.jobs(CALLS)
        started = time.monotonic()

        def check_alive(done):
            if target.process.poll() is not None:
                pytest.fail(f"collectived exited with {target.process.returncode} after {done} "
                            f"calls\n{log_tail(target)}")
            for listener, channel in channels.items():
                try:
                    answer = health(channel)
                except grpc.RpcError as error:
                    pytest.fail(f"health over {listener} failed after {done} calls: "
                                f"{error}\n{log_tail(target)}")
                assert answer == SERVING, f"health over {listener}: {answer!r}"

        # Alive and SERVING after every BATCH answers, asked while the rest are in flight.
        runner.run(jobs, every=BATCH, between=check_alive)
        check_alive(len(jobs))
        elapsed = time.monotonic() - started
        after = proc_status(pid)
        victim_info = victim.sidecar_info()
        victim.close()
        victim = None
        after_settled = _settle(pid, before["threads"])
        print(runner.table())
        print(f"{len(runner.outcomes)} calls in {elapsed:.1f} s")
        for name, status in (("before", before), ("after", after),
                             ("after sessions closed", after_settled)):
            print(f"daemon {name}: RSS {status['rss'] / (1 << 20):.1f} MiB, "
                  f"threads {status['threads']}, fds {status['fds']}")
        yield Barrage(sides, runner, before, after, after_settled, victim_info,
                      bad_messages.messages)
    finally:
        grpc_logger.removeHandler(bad_messages)
        if victim is not None:
            victim.close()
        for channel in channels.values():
            channel.close()
        logs = sides.logs()
        codes = sides.stop()
        assert codes == [0, 0], f"sidecars exited with {codes}\n{logs}"


def test_every_call_answers_without_an_unhandled_error(barrage):
    outcomes = barrage.runner.outcomes
    assert len(outcomes) == CALLS
    problems = [o for o in outcomes if o.problem()]
    assert not problems, (f"{len(problems)} bad outcomes (seed {SEED}), first ones:\n" +
                          "\n".join(f"{o.problem()}: {o.describe()}" for o in problems[:25]))


def test_status_messages_are_valid_utf8(barrage):
    """gRPC status messages must be UTF-8; error messages quote request bytes (store values)."""
    bad = barrage.bad_status_messages
    assert not bad, f"{len(bad)} status messages that are not UTF-8, first ones:\n" + \
        "\n".join(bad[:5])


def test_every_method_and_listener_was_exercised(barrage):
    runner = barrage.runner
    seen = {(o.listener, o.method.path) for o in runner.outcomes}
    expected = {(listener, m.path) for listener in runner.channels for m in runner.methods}
    assert seen == expected, f"not called: {sorted(expected - seen)}"
    # The generator reached past parsing: well-formed requests got real answers.
    assert sum(o.parsed for o in runner.outcomes) > CALLS // 3


def test_refusals_name_what_was_wrong(barrage):
    """INVALID_ARGUMENT / NOT_FOUND answers to requests that parse carry a message."""
    refusals = [o for o in barrage.runner.outcomes if o.parsed and o.code in (
        grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)]
    assert refusals
    silent = [o.describe() for o in refusals if not o.details.strip()]
    assert not silent, "refusals without a message:\n" + "\n".join(silent[:10])


def test_requests_that_do_not_parse_are_invalid_argument(barrage):
    unparsed = [o for o in barrage.runner.outcomes
                if not o.parsed and not o.method.client_streaming]
    assert unparsed
    wrong = [o.describe() for o in unparsed if o.code != grpc.StatusCode.INVALID_ARGUMENT]
    assert not wrong, f"{len(wrong)} of {len(unparsed)}:\n" + "\n".join(wrong[:10])


def test_daemon_stays_healthy_with_bounded_memory_and_threads(barrage):
    target = barrage.sides[0]
    assert target.process.poll() is None, log_tail(target)
    for address in (target.unix_address, target.tcp_address):
        with open_channel(address) as channel:
            assert health(channel) == SERVING
    before, after, settled = barrage.before, barrage.after, barrage.after_settled
    growth = after["rss"] - before["rss"]
    print(f"\nRSS growth over the barrage: {growth / (1 << 20):.1f} MiB "
          f"({before['rss'] >> 20} -> {after['rss'] >> 20} MiB)")
    assert growth < RSS_GROWTH_BOUND
    # Handlers blocked by hostile waits are released once the caller is gone or the session
    # that owned the waited-on work has closed.
    assert settled["threads"] <= before["threads"] + 8, (before, settled)
    assert settled["fds"] <= before["fds"] + 8, (before, settled)
    assert barrage.victim_info.live_sessions >= 1


def test_a_normal_job_still_gives_exact_results(barrage):
    sides = barrage.sides
    n = 4
    name = f"after-{uuid.uuid4().hex[:8]}"
    clients = [Client(sides[r % 2].unix_address, name=f"normal rank {r}") for r in range(n)]
    results, errors = [None] * n, [None] * n

    def rank_fn(rank):
        try:
            client = clients[rank]
            client.create_group(name, rank, n, store_address=sides[0].tcp_address, timeout=60)
            x = np.arange(1000, dtype=np.float64) * (rank + 1)
            client.allreduce(name, x, timeout=60)
            shared = client.empty((257,), np.int32)
            shared[:] = rank * 1000 + np.arange(257, dtype=np.int32)
            outputs = [np.zeros(257, np.int32) for _ in range(n)]
            client.allgather(name, outputs, shared, timeout=60)
            results[rank] = (x, outputs)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors[rank] = error

    threads = [threading.Thread(target=rank_fn, args=(r,), daemon=True) for r in range(n)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(t.is_alive() for t in threads), "the normal job hung"
        assert not any(errors), errors
    finally:
        for client in clients:
            client.close()
    expected_sum = np.arange(1000, dtype=np.float64) * sum(range(1, n + 1))
    for rank, (x, outputs) in enumerate(results):
        np.testing.assert_array_equal(x, expected_sum)
        for source, out in enumerate(outputs):
            np.testing.assert_array_equal(out, source * 1000 + np.arange(257, dtype=np.int32))
