"""Trust: sessions that cannot be borrowed, authorised admin, and the refusal metric.

Real sidecars on loopback. A session is usable only from the connection that attached it; its
id is a secret that never leaves the sidecar except in the Attach `opened` event. Admin reads
are open locally; AbortGroup needs an admin credential. Each refusal is counted in
collectived_refused_calls_total.

Over TCP the sidecars serve mutual TLS (conftest's certificates): the thief presents a valid
client certificate of its own, so what refuses it is the session's binding to the connection.
A second channel with its own subchannel pool is a second TCP connection, as another process
would have.
"""

import json
import os
import re
import subprocess
import urllib.request
import uuid

import grpc
import numpy as np
import pytest

import collectived
from raw.raw_client import RawClient as Client  # sessions spoken on the wire: ids, connections
from collectived.channel import TlsOptions, open_channel
from collectived.v1 import (admin_pb2, admin_pb2_grpc, collectives_pb2, collectives_pb2_grpc,
                            common_pb2, group_pb2, group_pb2_grpc, session_pb2, session_pb2_grpc)
from conftest import BIN, Sidecar, collectivectl, daemon_env, tls_certs

DENIED = ("session {label} was attached by another connection; a session is usable only from "
          "the connection that attached it")
NO_CREDENTIAL = ("AbortGroup needs an admin credential: the admin token as 'authorization: "
                 "Bearer ...', an admin client certificate (--admin-names), or the group's job "
                 "token as 'collectived-job-token: ...'; none was presented")


def unique(stem):
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def tls_as(name):
    """TLS options presenting conftest's certificate `name` (client, admin, sidecar; None:
    plaintext)."""
    if name is None:
        return TlsOptions()
    certs = tls_certs()
    return TlsOptions(ca=str(certs / "ca.crt"), cert=str(certs / f"{name}.crt"),
                      key=str(certs / f"{name}.key"))


def new_connection(address, certificate="client"):
    """A channel with a TCP (or Unix) connection of its own (gRPC would otherwise share one
    subchannel between channels with equal arguments); over TCP it presents `certificate`."""
    return open_channel(address, tls_as(certificate),
                        options=[("grpc.use_local_subchannel_pool", 1)])


def metrics_text(side):
    with urllib.request.urlopen(f"http://127.0.0.1:{side.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def refused(side, method, code):
    """collectived_refused_calls_total{method, code}, 0 when the series does not exist yet."""
    pattern = re.compile(r'^collectived_refused_calls_total\{([^}]*)\} (\S+)$')
    for line in metrics_text(side).splitlines():
        match = pattern.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if labels == {"method": method, "code": code}:
                return float(match.group(2))
    return 0.0


def inline_allreduce(session_id, group, values):
    request = collectives_pb2.CollectiveRequest(session_id=session_id, group=group,
                                                client_op_id=0)
    data = np.asarray(values, dtype=np.float32)
    request.allreduce.tensor.CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.FLOAT32, count=data.size, inline=data.tobytes()))
    return request


def session_calls(victim, group, buffer, client_op_id):
    """Every session-scoped unary call, naming the victim's session: (method, stub name, request)."""
    sid = victim.session_id
    return [
        ("Collectives.Run", "collectives", "Run", inline_allreduce(sid, group, [1.0])),
        ("Collectives.Submit", "collectives", "Submit", inline_allreduce(sid, group, [1.0])),
        ("Collectives.Wait", "collectives", "Wait",
         collectives_pb2.WaitRequest(session_id=sid, client_op_id=client_op_id, timeout_ms=100)),
        ("Groups.CreateGroup", "groups", "CreateGroup",
         group_pb2.CreateGroupRequest(session_id=sid, name=unique("stolen"), rank=0,
                                      world_size=1, timeout_ms=2000)),
        ("Groups.DestroyGroup", "groups", "DestroyGroup",
         group_pb2.DestroyGroupRequest(session_id=sid, group=group)),
        ("Session.UnregisterBuffer", "session", "UnregisterBuffer",
         session_pb2.UnregisterBufferRequest(session_id=sid,
                                             buffer_id=buffer.id if buffer else 1)),
    ]


def stubs(channel):
    return {"collectives": collectives_pb2_grpc.CollectivesStub(channel),
            "groups": group_pb2_grpc.GroupsStub(channel),
            "session": session_pb2_grpc.SessionStub(channel)}


def steal_everything(side, victim, thief_address, group, buffer, client_op_id):
    """Makes every session-scoped call with the victim's session id from another connection;
    asserts each is PERMISSION_DENIED with the message naming the session's label."""
    before = {m: refused(side, m, "permission_denied")
              for m, *_ in session_calls(victim, group, buffer, client_op_id)}
    with new_connection(thief_address) as channel:
        thief = stubs(channel)
        for method, service, name, request in session_calls(victim, group, buffer, client_op_id):
            with pytest.raises(grpc.RpcError) as error:
                getattr(thief[service], name)(request, timeout=10)
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED, \
                f"{method}: {error.value.code()} {error.value.details()}"
            assert error.value.details() == DENIED.format(label=victim.session_label), method
            assert victim.session_id not in error.value.details()
    for method in before:
        assert refused(side, method, "permission_denied") == before[method] + 1, method


def victim_setup(side, address):
    """A session attached at `address` with a one-rank group, a registered buffer (on the Unix
    socket: a TCP session cannot register memory) and a finished asynchronous allreduce whose
    result the sidecar still remembers."""
    victim = Client(address, name="victim")
    group = unique("victim")
    victim.create_group(group, 0, 1, store_address=side.tcp_address, timeout=30)
    buffer = victim.allocate(4096) if address.startswith("unix") else None
    x = np.full(8, 7.0, dtype=np.float32)
    work = victim.allreduce(group, x, async_op=True, timeout=30)
    work.wait(30)
    return victim, group, buffer, work.client_op_id


def victim_still_works(victim, group, buffer):
    x = np.arange(16, dtype=np.float32)
    victim.allreduce(group, x, timeout=30)
    np.testing.assert_array_equal(x, np.arange(16, dtype=np.float32))
    if buffer is not None:
        shared = buffer.array((8,), np.float32)
        shared[:] = 3
        victim.allreduce(group, shared, timeout=30)
        np.testing.assert_array_equal(shared, np.full(8, 3, np.float32))
    victim.destroy_group(group)


# -- sessions ---------------------------------------------------------------------------------

def test_session_ids_are_128_random_bits_and_the_label_is_not_the_id(sidecar):
    clients = [Client(sidecar.unix_address, name=f"c{i}") for i in range(3)]
    try:
        ids = [c.session_id for c in clients]
        for client in clients:
            assert re.fullmatch(r"[0-9a-f]{32}", client.session_id), client.session_id
            assert re.fullmatch(r"s[0-9]+", client.session_label), client.session_label
            assert client.session_label not in client.session_id
        assert len(set(ids)) == 3
        assert len({c.session_label for c in clients}) == 3
        # No derivable structure: consecutive ids agree in about 1/16 of their hex digits by
        # chance; a counter with a shared salt (the old scheme) would agree almost everywhere.
        for a, b in zip(ids, ids[1:]):
            same = sum(x == y for x, y in zip(a, b))
            assert same < 16, (a, b)
    finally:
        for client in clients:
            client.close()


def test_a_session_attached_over_tcp_is_refused_from_another_tcp_connection(sidecar):
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.tcp_address)
    try:
        steal_everything(sidecar, victim, sidecar.tcp_address, group, buffer, op_id)
        victim_still_works(victim, group, buffer)
        # Each refusal is logged with the caller, naming the session by its label.
        refusals = [line for line in sidecar.log().splitlines() if 'msg="call refused"' in line]
        assert len(refusals) == 6, refusals
        assert all("caller=\"tcp 127.0.0.1:" in line for line in refusals)
        assert all(f"session {victim.session_label} was attached" in line for line in refusals)
    finally:
        victim.close()


def test_a_session_attached_over_unix_is_refused_over_tcp(sidecar):
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.unix_address)
    try:
        steal_everything(sidecar, victim, sidecar.tcp_address, group, buffer, op_id)
        victim_still_works(victim, group, buffer)
    finally:
        victim.close()


def test_a_session_attached_over_unix_is_refused_from_another_unix_connection(sidecar):
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.unix_address)
    try:
        steal_everything(sidecar, victim, sidecar.unix_address, group, buffer, op_id)
        victim_still_works(victim, group, buffer)
    finally:
        victim.close()


THIEF = r"""
import sys
import grpc
from collectived.channel import open_channel
from collectived.v1 import group_pb2, group_pb2_grpc
address, session_id, group = sys.argv[1:4]
with open_channel(address, None) as channel:
    try:
        group_pb2_grpc.GroupsStub(channel).DestroyGroup(
            group_pb2.DestroyGroupRequest(session_id=session_id, group=group), timeout=10)
        print("ALLOWED")
    except grpc.RpcError as error:
        print(error.code().name, error.details())
"""

FD_THIEF = r"""
import sys
from raw.fd_channel import FdChannel
from collectived.errors import CollectivedError
path, token = sys.argv[1:3]
try:
    FdChannel(path, token, timeout=10)
    print("BOUND")
except CollectivedError as error:
    print(type(error).__name__, error)
"""


def test_a_second_local_process_that_knows_the_session_id_is_refused(sidecar):
    """On the Unix socket the session id is not a bearer secret: another process that learned
    it (from a log, /proc, a core dump) still cannot use it, nor the session's fd-channel token."""
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.unix_address)
    try:
        # The thieves import the wire-level fd channel of tests/python/raw as well.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(BIN.parent / "python"), os.path.dirname(os.path.abspath(__file__))]))
        out = subprocess.run(["/usr/bin/python3", "-c", THIEF, sidecar.unix_address,
                              victim.session_id, group],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.stdout.startswith("PERMISSION_DENIED"), out.stdout + out.stderr
        assert victim.session_label in out.stdout and victim.session_id not in out.stdout
        # A token of the session's fd channel, stolen by another process, binds nothing.
        os.environ["COLLECTIVED_RING"] = "0"  # no ring: its token stays unused
        try:
            fresh = Client(sidecar.unix_address, name="fresh")
        finally:
            del os.environ["COLLECTIVED_RING"]
        with fresh:
            token = fresh._fd_channel_token  # not used yet: it registered nothing
            assert token
            out = subprocess.run(["/usr/bin/python3", "-c", FD_THIEF, sidecar.socket_path + ".fd",
                                  token], capture_output=True, text=True, timeout=60, env=env)
            assert out.stdout.startswith("PermissionDeniedError"), out.stdout + out.stderr
            assert "must come from that process" in out.stdout
        victim_still_works(victim, group, buffer)
    finally:
        victim.close()


def test_a_session_attached_over_tcp_is_refused_over_unix(sidecar):
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.tcp_address)
    try:
        steal_everything(sidecar, victim, sidecar.unix_address, group, buffer, op_id)
        victim_still_works(victim, group, buffer)
    finally:
        victim.close()


def test_a_session_is_usable_from_its_own_tcp_connection_through_unary_calls(sidecar):
    """The client's own unary calls (Run, Wait, CreateGroup...) travel on the connection of its
    Attach stream, so binding sessions to connections costs a well-behaved client nothing."""
    with Client(sidecar.tcp_address, name="own") as client:
        group = unique("own")
        client.create_group(group, 0, 1, store_address=sidecar.tcp_address, timeout=30)
        x = np.ones(4, np.float32)
        client.allreduce(group, x, timeout=30)
        work = client.allreduce(group, x, async_op=True, timeout=30)
        work.wait(30)
        client.destroy_group(group)


def test_an_unknown_session_id_is_not_found_and_not_echoed(sidecar):
    guess = "0123456789abcdef0123456789abcdef"
    with new_connection(sidecar.unix_address) as channel:
        stub = group_pb2_grpc.GroupsStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.DestroyGroup(group_pb2.DestroyGroupRequest(session_id=guess, group="g"),
                              timeout=10)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown session: the session_id names no live session" in error.value.details()
    assert guess not in error.value.details()


def test_the_session_secret_appears_nowhere_the_sidecar_shows(sidecar):
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.tcp_address)
    other = Client(sidecar.unix_address, name="other")
    try:
        # Errors that name the session: a refused theft, an op on a group it is not part of, a
        # wait for an op it never submitted.
        steal_everything(sidecar, victim, sidecar.tcp_address, group, buffer, op_id)
        with pytest.raises(Exception, match=f"session {other.session_label} is not part of"):
            other.allreduce(group, np.ones(2, np.float32), timeout=10)
        shown = []
        for args in (["info"], ["groups"], ["describe", group], ["flight-recorder", "--json"],
                     ["flight-recorder", group]):
            out = collectivectl("--address", sidecar.unix_address, *args)
            assert out.returncode == 0, (args, out.stderr)
            shown.append(out.stdout + out.stderr)
        shown.append(metrics_text(sidecar))
        victim_still_works(victim, group, buffer)
        victim.close()
        other.close()
        shown.append(sidecar.log())
        # The label is what the sidecar shows instead.
        assert f"session={victim.session_label}" in sidecar.log()
        for text in shown:
            for secret in (victim.session_id, other.session_id):
                assert secret not in text
    finally:
        victim.close()
        other.close()


def test_a_refused_submission_on_the_stream_names_the_label_not_the_id(sidecar):
    with Client(sidecar.unix_address, name="stream") as client:
        work = client.allreduce(unique("nowhere"), np.ones(2, np.float32), async_op=True)
        with pytest.raises(Exception) as error:
            work.wait(10)
        assert client.session_id not in str(error.value)
    assert client.session_id not in sidecar.log()


# -- admin ------------------------------------------------------------------------------------

def admin_stub(channel):
    return admin_pb2_grpc.AdminStub(channel)


def abort(address, group, metadata=(), certificate="client"):
    with new_connection(address, certificate) as channel:
        return admin_stub(channel).AbortGroup(
            admin_pb2.AbortGroupRequest(group=group, reason="trust test"),
            metadata=list(metadata), timeout=10)


def one_rank_group(side):
    client = Client(side.unix_address, name="job")
    group = unique("job")
    client.create_group(group, 0, 1, store_address=side.tcp_address, timeout=30)
    return client, group


def group_state(side, group):
    with new_connection(side.unix_address) as channel:
        groups = admin_stub(channel).ListGroups(admin_pb2.ListGroupsRequest(), timeout=10)
    return {g.name: g.state for g in groups.groups}.get(group)


def test_abort_without_a_credential_is_unauthenticated(sidecar):
    client, group = one_rank_group(sidecar)
    try:
        before = refused(sidecar, "Admin.AbortGroup", "unauthenticated")
        with pytest.raises(grpc.RpcError) as error:
            abort(sidecar.unix_address, group)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error.value.details() == NO_CREDENTIAL
        assert refused(sidecar, "Admin.AbortGroup", "unauthenticated") == before + 1
        assert group_state(sidecar, group) == "ready"
        out = collectivectl("--address", sidecar.unix_address, "abort", group)
        assert out.returncode == 1
        assert "unauthenticated" in out.stderr and "needs an admin credential" in out.stderr
        assert group_state(sidecar, group) == "ready"
    finally:
        client.close()


def test_abort_with_a_certificate_that_is_not_an_admin_is_permission_denied(sidecar):
    """Over mutual TLS every caller has a verified certificate: a plain client's is a credential
    that does not allow aborts."""
    client, group = one_rank_group(sidecar)
    try:
        before = refused(sidecar, "Admin.AbortGroup", "permission_denied")
        with pytest.raises(grpc.RpcError) as error:
            abort(sidecar.tcp_address, group)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert ("the client certificate (collectived-client) carries no admin name "
                "(--admin-names)") in error.value.details()
        assert "AbortGroup needs an admin credential" in error.value.details()
        # The admin certificate is no admin on a sidecar whose --admin-names does not list it.
        with pytest.raises(grpc.RpcError) as error:
            abort(sidecar.tcp_address, group, certificate="admin")
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "(collectived-admin) carries no admin name" in error.value.details()
        assert refused(sidecar, "Admin.AbortGroup", "permission_denied") == before + 2
        assert group_state(sidecar, group) == "ready"
    finally:
        client.close()


def test_abort_with_an_admin_certificate_over_tcp(tmpdir_short):
    side = Sidecar(tmpdir_short, "admins", extra_args=["--admin-names", "ops,collectived-admin"])
    side.start()
    try:
        client, group = one_rank_group(side)
        abort(side.tcp_address, group, certificate="admin")
        assert group_state(side, group) == "aborted"
        assert 'by="admin certificate collectived-admin"' in side.log()
        # Over the Unix socket there is no certificate: the name alone is nothing.
        client2, group2 = one_rank_group(side)
        with pytest.raises(grpc.RpcError) as error:
            abort(side.unix_address, group2, certificate="admin")
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        client.close()
        client2.close()
    finally:
        assert side.stop() == 0, side.log()


def test_abort_with_a_wrong_admin_token_is_permission_denied(sidecar):
    client, group = one_rank_group(sidecar)
    try:
        before = refused(sidecar, "Admin.AbortGroup", "permission_denied")
        wrong = "not-the-token-" + uuid.uuid4().hex
        with pytest.raises(grpc.RpcError) as error:
            abort(sidecar.unix_address, group, [("authorization", f"Bearer {wrong}")])
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "the admin token presented is not this sidecar's" in error.value.details()
        assert wrong not in error.value.details()
        with pytest.raises(grpc.RpcError) as malformed:
            abort(sidecar.unix_address, group, [("authorization", f"Basic {wrong}")])
        assert malformed.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "is not 'Bearer <token>'" in malformed.value.details()
        assert refused(sidecar, "Admin.AbortGroup", "permission_denied") == before + 2
        assert group_state(sidecar, group) == "ready"
        assert wrong not in sidecar.log()
    finally:
        client.close()


def test_abort_with_the_admin_token_aborts_and_the_token_is_never_shown(sidecar):
    client, group = one_rank_group(sidecar)
    try:
        abort(sidecar.unix_address, group, [("authorization", f"Bearer {sidecar.admin_token}")])
        assert group_state(sidecar, group) == "aborted"
        with pytest.raises(Exception, match="aborted by an operator: trust test"):
            client.allreduce(group, np.ones(2, np.float32), timeout=10)
        # Through collectivectl, over TCP, with the token file.
        client2, group2 = one_rank_group(sidecar)
        out = collectivectl("--address", sidecar.tcp_address, "abort", "--admin-token-file",
                            sidecar.admin_token_file, group2, "maintenance")
        assert out.returncode == 0, out.stderr
        assert f"aborted group {group2}" in out.stdout
        assert group_state(sidecar, group2) == "aborted"
        client2.close()
        # And with the file from the environment.
        client3, group3 = one_rank_group(sidecar)
        env = dict(os.environ, COLLECTIVED_ADMIN_TOKEN_FILE=sidecar.admin_token_file)
        out = collectivectl("--address", sidecar.unix_address, "abort", group3, env=env)
        assert out.returncode == 0, out.stderr
        assert group_state(sidecar, group3) == "aborted"
        client3.close()
        assert "admin call allowed" in sidecar.log() and "by=\"admin token\"" in sidecar.log()
        assert sidecar.admin_token not in sidecar.log()
        assert sidecar.admin_token not in metrics_text(sidecar)
    finally:
        client.close()


def test_a_rotated_admin_token_file_takes_effect_at_once(sidecar):
    client, group = one_rank_group(sidecar)
    try:
        old = sidecar.admin_token
        new = "rotated-" + uuid.uuid4().hex
        # As Kubernetes does: write the new content beside the file and rename it over.
        staging = sidecar.admin_token_file + ".new"
        with open(staging, "w") as f:
            f.write(new + "\n")
        os.replace(staging, sidecar.admin_token_file)
        with pytest.raises(grpc.RpcError) as error:
            abort(sidecar.unix_address, group, [("authorization", f"Bearer {old}")])
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "the admin token presented is not this sidecar's" in error.value.details()
        assert group_state(sidecar, group) == "ready"
        # Rewritten in place (same inode) works as well.
        newer = "rewritten-" + uuid.uuid4().hex
        with open(sidecar.admin_token_file, "w") as f:
            f.write(newer)
        with pytest.raises(grpc.RpcError):
            abort(sidecar.unix_address, group, [("authorization", f"Bearer {new}")])
        abort(sidecar.unix_address, group, [("authorization", f"Bearer {newer}")])
        assert group_state(sidecar, group) == "aborted"
        assert new not in sidecar.log() and newer not in sidecar.log()
    finally:
        client.close()


def test_an_admin_token_is_refused_by_a_sidecar_without_one(tmpdir_short):
    side = Sidecar(tmpdir_short, "notoken")
    side.args.remove("--admin-token-file")
    side.args.remove(side.admin_token_file)
    side.start()
    try:
        client, group = one_rank_group(side)
        with pytest.raises(grpc.RpcError) as error:
            abort(side.unix_address, group, [("authorization", "Bearer anything")])
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "this sidecar has no admin token (--admin-token-file)" in error.value.details()
        client.close()
    finally:
        assert side.stop() == 0, side.log()


def test_a_missing_or_empty_admin_token_file_stops_the_start(tmpdir_short):
    empty = os.path.join(tmpdir_short, "empty-token")
    open(empty, "w").close()
    for path, why in ((os.path.join(tmpdir_short, "absent"), "cannot be read"),
                      (empty, "is empty")):
        result = subprocess.run(
            [str(BIN / "collectived"), "--socket", os.path.join(tmpdir_short, "x.sock"),
             "--listen", "127.0.0.1:0", "--metrics", "", "--admin-token-file", path],
            capture_output=True, text=True, timeout=30, env=daemon_env())
        assert result.returncode != 0
        assert f"--admin-token-file {path}" in result.stderr + result.stdout
        assert why in result.stderr + result.stdout


def test_a_job_may_abort_its_own_group_with_its_job_token(sidecar):
    token, other_token = "job-" + uuid.uuid4().hex, "job-" + uuid.uuid4().hex
    mine, theirs, plain = (Client(sidecar.unix_address, name=n) for n in ("mine", "theirs", "plain"))
    try:
        groups = {}
        for client, stem, job_token in ((mine, "mine", token), (theirs, "theirs", other_token),
                                        (plain, "plain", "")):
            groups[stem] = unique(stem)
            client.create_group(groups[stem], 0, 1, store_address=sidecar.tcp_address,
                                timeout=30, job_token=job_token)
        before = refused(sidecar, "Admin.AbortGroup", "permission_denied")
        # Another job's token, a made-up one, any token on a group created without one.
        for group, presented, why in (
                (groups["theirs"], token, f"is not group '{groups['theirs']}'"),
                (groups["mine"], "a-guess", f"is not group '{groups['mine']}'"),
                (groups["plain"], token, "was created without a job token")):
            with pytest.raises(grpc.RpcError) as error:
                abort(sidecar.unix_address, group, [("collectived-job-token", presented)])
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert why in error.value.details()
            assert presented not in error.value.details()
        assert refused(sidecar, "Admin.AbortGroup", "permission_denied") == before + 3
        assert {group_state(sidecar, g) for g in groups.values()} == {"ready"}
        # Its own token aborts its own group, over either listener.
        abort(sidecar.tcp_address, groups["mine"], [("collectived-job-token", token)])
        assert group_state(sidecar, groups["mine"]) == "aborted"
        assert group_state(sidecar, groups["theirs"]) == "ready"
        # collectivectl reads the token from an environment variable, never from argv.
        env = dict(os.environ, THEIR_TOKEN=other_token)
        out = collectivectl("--address", sidecar.unix_address, "abort", "--job-token-env",
                            "THEIR_TOKEN", groups["theirs"], env=env)
        assert out.returncode == 0, out.stderr
        assert group_state(sidecar, groups["theirs"]) == "aborted"
        out = collectivectl("--address", sidecar.unix_address, "abort", "--job-token-env",
                            "NO_SUCH_VARIABLE_SET", groups["plain"])
        assert out.returncode == 1 and "holds no job token" in out.stderr
        log = sidecar.log()
        assert 'by="job token"' in log
        assert token not in log and other_token not in log
    finally:
        for client in (mine, theirs, plain):
            client.close()


def test_the_python_client_aborts_with_a_token_and_is_refused_without(sidecar):
    token = "job-" + uuid.uuid4().hex
    with Client(sidecar.unix_address, name="py") as client:
        group = unique("py-abort")
        client.create_group(group, 0, 1, store_address=sidecar.tcp_address, timeout=30,
                            job_token=token)
        with pytest.raises(collectived.UnauthenticatedError,
                           match="AbortGroup needs an admin credential"):
            client.abort_group(group, "no credential")
        with pytest.raises(collectived.PermissionDeniedError,
                           match="the admin token presented is not this sidecar's") as wrong:
            client.abort_group(group, "wrong", admin_token="not-" + sidecar.admin_token)
        assert sidecar.admin_token not in str(wrong.value)
        assert group_state(sidecar, group) == "ready"
        assert client.abort_group(group, "the job aborts itself", job_token=token) == 0
        assert group_state(sidecar, group) == "aborted"
        with pytest.raises(collectived.AbortedError, match="the job aborts itself"):
            client.allreduce(group, np.ones(2, np.float32), timeout=10)
        other = unique("py-abort")
        client.create_group(other, 0, 1, store_address=sidecar.tcp_address, timeout=30)
        client.abort_group(other, "operator", admin_token=sidecar.admin_token)
        assert group_state(sidecar, other) == "aborted"


def test_a_wrong_job_token_and_a_reserved_store_key_are_counted_too(sidecar):
    """The refusals of job tokens (CreateGroup) and of the store's group keys land in the same
    metric."""
    token = "job-" + uuid.uuid4().hex
    name = unique("counted")
    before_create = refused(sidecar, "Groups.CreateGroup", "permission_denied")
    with Client(sidecar.unix_address, name="rank0") as rank0, \
            Client(sidecar.unix_address, name="intruder") as intruder:
        outcome = {}

        def create():
            try:
                rank0.create_group(name, 0, 2, store_address=sidecar.tcp_address, timeout=10,
                                   job_token=token)
            except Exception as error:  # noqa: BLE001 - the rank times out: reported below
                outcome["error"] = error

        import threading
        thread = threading.Thread(target=create, daemon=True)
        thread.start()
        with pytest.raises(collectived.PermissionDeniedError):
            intruder.create_group(name, 1, 2, store_address=sidecar.tcp_address, timeout=10,
                                  job_token="a-guess")
        thread.join(30)
        assert refused(sidecar, "Groups.CreateGroup", "permission_denied") == before_create + 1
        store = intruder.store()
        before_store = {m: refused(sidecar, m, "permission_denied") for m in ("Store.Set", "Store.Get")}
        with pytest.raises(collectived.PermissionDeniedError):
            store.set(f"collectived/groups/{name}/failed", b"forged")
        after = {m: refused(sidecar, m, "permission_denied") for m in ("Store.Set", "Store.Get")}
        assert sum(after.values()) == sum(before_store.values()) + 1, (before_store, after)


def test_reads_are_open_locally_and_to_verified_certificates(sidecar):
    client, group = one_rank_group(sidecar)
    try:
        client.allreduce(group, np.ones(2, np.float32), timeout=10)
        for address, certificate in ((sidecar.unix_address, None),
                                     (sidecar.tcp_address, "client"),
                                     (sidecar.tcp_address, "admin")):
            with new_connection(address, certificate) as channel:
                admin = admin_stub(channel)
                assert admin.GetInfo(admin_pb2.GetInfoRequest(), timeout=10).live_sessions >= 1
                names = [g.name for g in admin.ListGroups(admin_pb2.ListGroupsRequest(),
                                                          timeout=10).groups]
                assert group in names
                detail = admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group),
                                             timeout=10)
                assert detail.summary.name == group
                recorder = admin.GetFlightRecorder(
                    admin_pb2.GetFlightRecorderRequest(group=group), timeout=10)
                assert any(op.op == "allreduce" for op in recorder.ops)
        out = collectivectl("--address", sidecar.unix_address, "flight-recorder", group, "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["ops"]
    finally:
        client.close()


def test_reads_on_an_insecure_loopback_listener_are_open_to_anyone(tmpdir_short):
    side = Sidecar(tmpdir_short, "plain", tls=False).start()
    try:
        with grpc.insecure_channel(side.tcp_address) as channel:
            info = admin_stub(channel).GetInfo(admin_pb2.GetInfoRequest(), timeout=10)
            assert info.live_groups == 0
            with pytest.raises(grpc.RpcError) as error:
                admin_stub(channel).AbortGroup(admin_pb2.AbortGroupRequest(group="g"),
                                               timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error.value.details() == NO_CREDENTIAL
    finally:
        assert side.stop() == 0, side.log()


def test_a_plaintext_tcp_caller_is_no_sidecar_unless_the_flag_says_so(tmpdir_short):
    from collectived.v1 import store_pb2, store_pb2_grpc
    key = f"collectived/groups/{unique('plain')}/failed"
    for trusted in (False, True):
        side = Sidecar(tmpdir_short, f"plain{int(trusted)}", tls=False)
        if not trusted:
            side.args.remove("--trust-plaintext-peers")
        side.start()
        try:
            with grpc.insecure_channel(side.tcp_address) as channel:
                store = store_pb2_grpc.StoreStub(channel)
                request = store_pb2.StoreSetRequest(key=key, value=b"forged")
                if trusted:
                    store.Set(request, timeout=10)
                    continue
                with pytest.raises(grpc.RpcError) as error:
                    store.Set(request, timeout=10)
                assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "--trust-plaintext-peers" in error.value.details()
                assert refused(side, "Store.Set", "permission_denied") == 1
                # The job's own keys stay open to it.
                store.Set(store_pb2.StoreSetRequest(key="job/key", value=b"v"), timeout=10)
        finally:
            assert side.stop() == 0, side.log()


def test_every_refusal_is_counted_by_method_and_code(sidecar):
    methods = ("Collectives.Run", "Collectives.Wait", "Groups.DestroyGroup", "Admin.AbortGroup")
    victim, group, buffer, op_id = victim_setup(sidecar, sidecar.tcp_address)
    try:
        rounds = 3
        before = {m: refused(sidecar, m, "permission_denied")
                  for m in methods}
        unauthenticated = refused(sidecar, "Admin.AbortGroup", "unauthenticated")
        with new_connection(sidecar.unix_address) as channel:
            thief = stubs(channel)
            for _ in range(rounds):
                for call in (
                        lambda: thief["collectives"].Run(
                            inline_allreduce(victim.session_id, group, [1.0]), timeout=10),
                        lambda: thief["collectives"].Wait(collectives_pb2.WaitRequest(
                            session_id=victim.session_id, client_op_id=op_id), timeout=10),
                        lambda: thief["groups"].DestroyGroup(group_pb2.DestroyGroupRequest(
                            session_id=victim.session_id, group=group), timeout=10)):
                    with pytest.raises(grpc.RpcError) as error:
                        call()
                    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
                for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED),
                                       ((("authorization", "Bearer wrong"),),
                                        grpc.StatusCode.PERMISSION_DENIED)):
                    with pytest.raises(grpc.RpcError) as error:
                        abort(sidecar.unix_address, group, metadata)
                    assert error.value.code() == code
        for method in methods:
            assert refused(sidecar, method, "permission_denied") == before[method] + rounds, method
        assert refused(sidecar, "Admin.AbortGroup", "unauthenticated") == unauthenticated + rounds
        text = metrics_text(sidecar)
        assert "# TYPE collectived_refused_calls_total counter" in text
        # Labels are method names and codes only: nothing a caller sent.
        for line in text.splitlines():
            if line.startswith("collectived_refused_calls_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                assert set(labels) == {"method", "code"}
                assert labels["code"] in ("permission_denied", "unauthenticated")
                assert re.fullmatch(r"[A-Z][A-Za-z]+\.[A-Z][A-Za-z]+", labels["method"]), line
        victim_still_works(victim, group, buffer)
    finally:
        victim.close()
