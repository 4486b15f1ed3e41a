"""A client in a process of its own, for tests of what one process can make the sidecar hold:
the sidecar accounts shares per client process, so a second client of the test's own process
would draw on the test's share. Run as ``another_client.py ADDRESS ACTION N [ARG]``; it does
ACTION up to N times, keeps what it got until it exits, and prints a JSON list with one entry per
attempt: null for success, the error's text for a refusal (and stops at the first).

Actions: ``served`` (attach, a group of one, an allreduce: the sidecar still serves a newcomer),
``register`` (an unsealed memfd of ARG bytes), ``allocate`` (a sealed buffer of ARG bytes),
``groups`` (a group of one rank), ``sessions`` (an attached session), ``rank1`` (joins group ARG
as rank 1 of 2, prints "joined", and runs its N allreduces of 4 ones once a line arrives on
stdin)."""

import json
import os
import sys
import uuid

import numpy as np

from collectived import Client


def attempt(client, address, action, size, held):
    if action == "served":
        with Client(address) as victim:
            name = f"victim-{uuid.uuid4().hex[:10]}"
            victim.create_group(name, 0, 1, timeout=10)
            x = np.ones(4, np.float32)
            victim.allreduce(name, x)
            assert (x == 1).all(), x
            victim.destroy_group(name)
    elif action == "register":
        fd = os.memfd_create("another-client", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        held.append(client.register_fd(fd, size))
    elif action == "allocate":
        held.append(client.allocate(size))
    elif action == "groups":
        client.create_group(f"other-{uuid.uuid4().hex[:10]}", 0, 1, timeout=10)
    elif action == "sessions":
        held.append(Client(address))
    elif action == "allreduce":
        client.allreduce(size, np.ones(4, np.float32))
    else:
        raise SystemExit(f"unknown action {action!r}")


def main(address, action, count, size="4096"):
    outcomes, held = [], []
    client = None if action in ("served", "sessions") else Client(address)
    if action == "rank1":
        client.create_group(size, 1, 2, timeout=30)
        print("joined", flush=True)
        sys.stdin.readline()
        action = "allreduce"
    for _ in range(int(count)):
        try:
            attempt(client, address, action, int(size) if size.isdigit() else size, held)
            outcomes.append(None)
        except Exception as error:  # the refusal is the result
            outcomes.append(f"{type(error).__name__}: {error}")
            break
    print(json.dumps(outcomes))
    sys.stdout.flush()
    os._exit(0)  # what it held goes with the process, as a trainer's would


if __name__ == "__main__":
    main(*sys.argv[1:])
