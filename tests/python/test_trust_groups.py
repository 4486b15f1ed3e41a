"""Job tokens and the store keys of groups, tried as a hostile client would on real sidecars.

A joiner with a wrong token is refused alone (PERMISSION_DENIED) and the rightful ranks still
form the group; a client can neither read nor forge a group's keys in the store (only peer
sidecars may), so writing a live group's `failed` key no longer kills it; tokens appear in no
log, metric or admin output.
"""

import threading
import urllib.request
import uuid

import numpy as np
import pytest

import collectived
from collectived import Client
from collectived.store import StoreClient
from conftest import collectivectl

TOKEN = "job-token-" + uuid.uuid4().hex


def unique(prefix="g"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_in_background(client, *args, **kwargs):
    """Starts client.create_group in a thread; returns (thread, outcome dict)."""
    outcome = {}

    def run():
        try:
            outcome["response"] = client.create_group(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - reported to the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def allreduce_of_two(a, b, name):
    out = [np.full(8, 1.0, np.float32), np.full(8, 2.0, np.float32)]
    worker = threading.Thread(target=b.allreduce, args=(name, out[1]), daemon=True)
    worker.start()
    a.allreduce(name, out[0])
    worker.join(20)
    for x in out:
        np.testing.assert_array_equal(x, np.full(8, 3.0, np.float32))


def test_a_wrong_token_is_refused_alone_and_the_rightful_ranks_form_the_group(two_sidecars):
    side_a, side_b = two_sidecars
    name = unique("tok")
    with Client(side_a.unix_address, name="rank0") as rank0, \
            Client(side_b.unix_address, name="rank1") as rank1, \
            Client(side_b.unix_address, name="intruder") as intruder:
        store = side_a.tcp_address
        thread, outcome = create_in_background(rank0, name, 0, 2, store_address=store,
                                               timeout=30, job_token=TOKEN)
        with pytest.raises(collectived.PermissionDeniedError) as wrong:
            intruder.create_group(name, 1, 2, store_address=store, timeout=30,
                                  job_token="a-guess")
        assert "the job token presented is not the one the group was created with" in str(
            wrong.value)
        assert "a-guess" not in str(wrong.value) and TOKEN not in str(wrong.value)
        with pytest.raises(collectived.PermissionDeniedError) as none:
            intruder.create_group(name, 1, 2, store_address=store, timeout=30)
        assert "presented none" in str(none.value)

        rank1.create_group(name, 1, 2, store_address=store, timeout=30, job_token=TOKEN)
        thread.join(30)
        assert "error" not in outcome, outcome
        assert outcome["response"].group_size == 2
        allreduce_of_two(rank0, rank1, name)

    # The token is in no log, no admin output and no metric.
    for side in two_sidecars:
        assert TOKEN not in side.log()
        for command in (["list"], ["info"]):
            result = collectivectl("--address", side.unix_address, *command)
            assert TOKEN not in result.stdout + result.stderr
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{side.metrics_port}/metrics", timeout=10).read().decode()
        assert TOKEN not in metrics


RESERVED = ["collectived/groups/g/1/failed", "job7/collectived/groups/g/1/rank/0",
            "collectived/groups/g/token"]


@pytest.mark.parametrize("key", RESERVED)
def test_clients_cannot_touch_the_keys_of_groups(sidecar, key):
    store = StoreClient(sidecar.unix_address)
    calls = {
        "set": lambda: store.set(key, b"forged"),
        "get": lambda: store.get(key, timeout=1),
        "add": lambda: store.add(key, 1),
        "compare_set": lambda: store.compare_set(key, b"", b"forged"),
        "wait": lambda: store.wait([key], timeout=1),
        "check": lambda: store.check([key]),
        "delete_key": lambda: store.delete_key(key),
        "multi_get": lambda: store.multi_get(["free", key], timeout=1),
        "multi_set": lambda: store.multi_set(["free", key], [b"1", b"forged"]),
        "append": lambda: store.append(key, b"forged"),
    }
    for method, call in calls.items():
        with pytest.raises(collectived.PermissionDeniedError) as refused:
            call()
        message = str(refused.value)
        assert f"store {method} of key '{key}' refused" in message, message
        assert "only peer sidecars may read or write them" in message
        assert "caller: unix socket" in message
    # Nothing was written, and the job's own keys stay usable.
    store.set("free/collectived/groupsx", b"1")  # not a group key: no '/' before the marker
    store.set("mycollectived/groups/x", b"1")
    assert store.get("mycollectived/groups/x") == b"1"
    assert store.num_keys() == 2


def test_a_forged_failed_key_no_longer_kills_a_live_group(two_sidecars):
    side_a, side_b = two_sidecars
    name = unique("live")
    with Client(side_a.unix_address, name="rank0") as rank0, \
            Client(side_b.unix_address, name="rank1") as rank1:
        store = side_a.tcp_address
        thread, outcome = create_in_background(rank1, name, 1, 2, store_address=store,
                                               timeout=30)
        rank0.create_group(name, 0, 2, store_address=store, timeout=30)
        thread.join(30)
        assert "error" not in outcome, outcome
        allreduce_of_two(rank0, rank1, name)
        # The attack of the issue: write the group's `failed` key (incarnation 1) in its store.
        hostile = StoreClient(side_a.unix_address)
        with pytest.raises(collectived.PermissionDeniedError):
            hostile.set(f"collectived/groups/{name}/1/failed", b"cd3forged")
        with pytest.raises(collectived.PermissionDeniedError):
            hostile.get(f"collectived/groups/{name}/1/rank/0", timeout=1)
        allreduce_of_two(rank0, rank1, name)


TORCH_RANK = r"""
import datetime, sys
import torch, torch.distributed as dist
import collectived.torch  # registers the backend
init, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    dist.init_process_group("collectived", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
except Exception as error:
    print("@@REFUSED", type(error).__name__, error, flush=True)
    sys.exit(3)
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
print("@@SUM", t.tolist(), flush=True)
dist.destroy_process_group()
"""


def run_torch_ranks(sidecars, tmpdir, envs, timeout=120):
    import subprocess
    import sys

    from conftest import free_port
    from torch_helpers import python_path

    script = f"{tmpdir}/token_rank.py"
    with open(script, "w") as f:
        f.write(TORCH_RANK)
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank, extra in enumerate(envs):
        env = {k: v for k, v in __import__("os").environ.items()
               if not k.startswith("COLLECTIVED_JOB_TOKEN")}
        env.update({"PYTHONPATH": python_path(), "OMP_NUM_THREADS": "1",
                    "COLLECTIVED_ADDRESS": sidecars[rank % len(sidecars)].unix_address, **extra})
        procs.append(subprocess.Popen([sys.executable, script, init, str(rank), str(len(envs))],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def test_torch_ranks_take_the_job_token_from_a_file_or_the_environment(two_sidecars,
                                                                        tmpdir_short):
    token_file = f"{tmpdir_short}/token"
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")  # as a mounted Secret may end
    procs = run_torch_ranks(two_sidecars, tmpdir_short,
                            [{"COLLECTIVED_JOB_TOKEN_FILE": token_file},
                             {"COLLECTIVED_JOB_TOKEN": TOKEN}])
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, outputs
        assert "@@SUM [3.0, 3.0, 3.0, 3.0]" in output, outputs
    for side in two_sidecars:
        assert TOKEN not in side.log()


def test_a_torch_rank_with_another_token_is_refused_at_init(two_sidecars, tmpdir_short):
    procs = run_torch_ranks(two_sidecars, tmpdir_short,
                            [{"COLLECTIVED_JOB_TOKEN": TOKEN},
                             {"COLLECTIVED_JOB_TOKEN": "not-the-job-token"}])
    try:
        output = procs[1].communicate(timeout=90)[0]
        assert procs[1].returncode == 3, output
        assert "@@REFUSED PermissionDeniedError" in output, output
        assert "the job token presented is not the one the group was created with" in output
        assert "not-the-job-token" not in output.split("@@REFUSED", 1)[1]
    finally:
        procs[0].kill()
        procs[0].communicate()
