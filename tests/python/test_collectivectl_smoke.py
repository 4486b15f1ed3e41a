"""`collectivectl smoke`: every collective against real sidecars, each reported with its result."""

import os
import re

from conftest import collectivectl, free_port

COLLECTIVES = ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
               "allgather_into_tensor", "allgather_coalesced", "reduce_scatter",
               "reduce_scatter_tensor", "alltoall", "alltoall_single", "gather", "scatter",
               "barrier", "send/recv")


def results(stdout):
    """{collective: result} from the smoke table."""
    table = {}
    for line in stdout.splitlines():
        match = re.match(r"^(\S+)\s+(OK|FAILED|WRONG)\b", line)
        if match:
            table[match.group(1)] = match.group(2)
    return table


def assert_all_ok(out):
    assert out.returncode == 0, out.stdout + out.stderr
    table = results(out.stdout)
    assert set(table) == set(COLLECTIVES), out.stdout
    assert all(result == "OK" for result in table.values()), out.stdout
    assert f"{len(COLLECTIVES)} of {len(COLLECTIVES)} collectives OK" in out.stdout


def test_smoke_four_ranks_interleaved_on_two_sidecars(two_sidecars):
    a, b = two_sidecars
    ranks = ",".join([a.unix_address, b.unix_address, a.unix_address, b.unix_address])
    out = collectivectl("smoke", "--ranks", ranks, timeout=120)
    assert_all_ok(out)
    assert "4 ranks on 2 sidecars" in out.stdout
    # The default store is the first sidecar's TCP address, learned from its GetInfo.
    assert f"store {a.tcp_address}" in out.stdout


def test_smoke_inline_tensors_over_tcp_with_an_explicit_store(two_sidecars):
    a, b = two_sidecars
    out = collectivectl("smoke", "--ranks", f"{a.tcp_address},{b.tcp_address}",
                        "--store", b.tcp_address, "--inline", "--count", "33", timeout=120)
    assert_all_ok(out)
    assert f"store {b.tcp_address}" in out.stdout and "inline tensors" in out.stdout


def test_smoke_two_local_ranks_on_one_sidecar_leaves_no_group(sidecar):
    out = collectivectl("smoke", "--ranks", f"{sidecar.unix_address},{sidecar.unix_address}",
                        timeout=120)
    assert_all_ok(out)
    assert "2 ranks on 1 sidecar," in out.stdout
    groups = collectivectl("--address", sidecar.unix_address, "groups")
    assert groups.returncode == 0, groups.stderr
    assert "smoke-" not in groups.stdout


def test_smoke_fails_clearly_when_a_rank_cannot_connect(sidecar, tmpdir_short):
    missing = f"unix://{tmpdir_short}/missing.sock"
    out = collectivectl("smoke", "--ranks", f"{sidecar.unix_address},{missing}", timeout=60)
    assert out.returncode != 0
    assert "rank 1" in out.stderr and "missing.sock" in out.stderr


def test_smoke_fails_clearly_when_the_store_is_unreachable(sidecar):
    out = collectivectl("--timeout-ms", "3000", "smoke", "--ranks",
                        f"{sidecar.unix_address},{sidecar.unix_address}",
                        "--store", f"127.0.0.1:{free_port()}", timeout=60)
    assert out.returncode != 0
    assert "creating group" in out.stderr


def test_smoke_needs_two_ranks():
    out = collectivectl("smoke", "--ranks", "unix:///nonexistent.sock")
    assert out.returncode != 0 and "at least two" in out.stderr


def test_store_check_names_each_key(sidecar):
    assert collectivectl("--address", sidecar.unix_address, "store", "set", "here", "1").returncode == 0
    out = collectivectl("--address", sidecar.unix_address, "store", "check", "here", "not-here")
    assert out.returncode == 1
    assert out.stdout.splitlines() == ["present here", "missing not-here"]
    out = collectivectl("--address", sidecar.unix_address, "store", "check", "here")
    assert out.returncode == 0 and out.stdout == "present here\n"


def test_abort_without_a_credential_says_which_flag_gives_one(sidecar):
    env = dict(os.environ)
    env.pop("COLLECTIVED_ADMIN_TOKEN_FILE", None)
    out = collectivectl("--address", sidecar.unix_address, "abort", "no-such-group", env=env)
    assert out.returncode == 1
    assert "--admin-token-file" in out.stderr and "--job-token-env" in out.stderr, out.stderr
