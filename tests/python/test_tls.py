"""Mutual TLS on the TCP listener, and the refusal of plaintext on the network.

Real sidecars on loopback with certificates from scripts/gen-certs.sh: each refusal is shown
with its status code and message (no client certificate, a certificate of another CA, plaintext
on the TLS port, a non-loopback listener without TLS, unreadable or mismatched files), the
certificates are rotated on disk under a running sidecar, and two sidecars form a group whose
rendezvous store is reached over mutual TLS.
"""

import os
import pathlib
import shutil
import subprocess
import time
import urllib.request

import grpc
import numpy as np
import pytest

import collectived
from collectived import Client, TlsOptions
from collectived.v1 import admin_pb2, admin_pb2_grpc
from conftest import BIN, Sidecar, collectivectl, daemon_env, free_port, gen_certs, tls_certs
from test_client import run_ranks

LOCAL_POOL = [("grpc.use_local_subchannel_pool", 1)]


def client_tls(certs, name="client"):
    certs = pathlib.Path(certs)
    return TlsOptions(ca=str(certs / "ca.crt"), cert=str(certs / f"{name}.crt"),
                      key=str(certs / f"{name}.key"))


def get_info(address, tls, timeout=10):
    """Admin.GetInfo over a fresh channel (its own connection); raises grpc.RpcError."""
    with collectived.open_channel(address, tls, options=LOCAL_POOL) as channel:
        return admin_pb2_grpc.AdminStub(channel).GetInfo(admin_pb2.GetInfoRequest(),
                                                         timeout=timeout)


def refusal(address, tls):
    """The error of a GetInfo that the TLS handshake refuses: UNAVAILABLE, naming the address
    (gRPC gives no reason on the client side when the server rejects the client's certificate
    after a TLS 1.3 handshake: the server just closes the connection)."""
    with pytest.raises(grpc.RpcError) as caught:
        get_info(address, tls)
    error = caught.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert "failed to connect to all addresses" in error.details(), error.details()
    assert address in error.details(), error.details()
    return error


def wait_for_log(side, text, timeout=10):
    """The sidecar's log says `text` (gRPC logs why it refused a handshake)."""
    deadline = time.monotonic() + timeout
    while text not in side.log():
        assert time.monotonic() < deadline, f"{text!r} not in the log:\n{side.log()[-3000:]}"
        time.sleep(0.05)


def start_daemon(args, timeout=20):
    """Runs collectived with `args` (no TLS variables inherited) until it exits."""
    return subprocess.run([str(BIN / "collectived"), *args], capture_output=True, text=True,
                          env=daemon_env(), timeout=timeout)


def test_mutual_tls_client_is_served_and_the_mode_is_shown(sidecar):
    info = get_info(sidecar.tcp_address, client_tls(tls_certs()))
    assert info.tcp_security == "mutual-tls"
    out = collectivectl("--address", sidecar.unix_address, "info")
    assert out.returncode == 0, out.stderr
    assert "tcp security: mutual-tls" in out.stdout
    # collectivectl's flags, without the environment.
    certs = tls_certs()
    env = daemon_env()
    out = collectivectl("--address", sidecar.tcp_address, "--tls-ca", str(certs / "ca.crt"),
                        "--tls-cert", str(certs / "client.crt"), "--tls-key",
                        str(certs / "client.key"), "health", env=env)
    assert out.returncode == 0, out.stderr
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics",
                                timeout=10) as response:
        assert 'tcp_security="mutual-tls"' in response.read().decode()
    assert "tcp_security=mutual-tls" in sidecar.log()


def test_tcp_client_without_a_certificate_is_refused(sidecar):
    certs = tls_certs()
    refusal(sidecar.tcp_address, TlsOptions(ca=str(certs / "ca.crt")))
    wait_for_log(sidecar, "peer did not return a certificate")
    # The C++ client and collectivectl are refused the same way.
    env = dict(daemon_env(), COLLECTIVED_TLS_CA=str(certs / "ca.crt"))
    out = collectivectl("--address", sidecar.tcp_address, "--timeout-ms", "3000", "health",
                        env=env)
    assert out.returncode != 0
    assert "health check of " + sidecar.tcp_address + " failed" in out.stderr


def test_certificate_from_another_ca_is_refused(sidecar):
    certs = tls_certs()
    # A sidecar-looking certificate signed by the rogue CA; the client trusts the real CA.
    rogue = TlsOptions(ca=str(certs / "ca.crt"), cert=str(certs / "rogue-sidecar.crt"),
                       key=str(certs / "rogue-sidecar.key"))
    refusal(sidecar.tcp_address, rogue)
    wait_for_log(sidecar, "certificate verify failed")
    # A client that trusts only the rogue CA does not accept the real sidecar either.
    error = refusal(sidecar.tcp_address, TlsOptions(ca=str(certs / "rogue-ca.crt"),
                                                    cert=str(certs / "client.crt"),
                                                    key=str(certs / "client.key")))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_on_the_tls_port_is_refused(sidecar):
    error = refusal(sidecar.tcp_address, TlsOptions())
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(collectived.UnavailableError) as caught:
        collectived.StoreClient(sidecar.tcp_address, tls=TlsOptions()).get("k", timeout=2)
    assert caught.value.kind == "unavailable"


def test_wrong_server_name_is_refused(sidecar):
    certs = tls_certs()
    tls = TlsOptions(ca=str(certs / "ca.crt"), cert=str(certs / "client.crt"),
                     key=str(certs / "client.key"), server_name="not-collectived")
    error = refusal(sidecar.tcp_address, tls)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    # The shared name every sidecar certificate carries is accepted.
    ok = TlsOptions(ca=tls.ca, cert=tls.cert, key=tls.key, server_name="collectived")
    assert get_info(sidecar.tcp_address, ok).tcp_security == "mutual-tls"


def test_non_loopback_listener_without_tls_is_refused_at_start(tmpdir_short):
    for listen in (f"0.0.0.0:{free_port()}", f"[::]:{free_port()}", f"example.com:{free_port()}"):
        result = start_daemon(["--socket", os.path.join(tmpdir_short, "x.sock"), "--listen",
                               listen, "--metrics", ""])
        assert result.returncode == 1, result.stdout + result.stderr
        output = result.stdout + result.stderr
        assert f"refusing to serve plaintext gRPC on the non-loopback address --listen " \
               f"{listen}" in output, output
        assert "--tls-cert, --tls-key and --tls-ca" in output and "--insecure-listen" in output
        assert "127.0.0.1" in output
    # The environment variable COLLECTIVED_LISTEN is checked the same way.
    result = subprocess.run([str(BIN / "collectived"), "--socket",
                             os.path.join(tmpdir_short, "y.sock"), "--metrics", ""],
                            capture_output=True, text=True, timeout=20,
                            env=dict(daemon_env(), COLLECTIVED_LISTEN="0.0.0.0:0"))
    assert result.returncode == 1 and "refusing to serve plaintext" in result.stderr


def test_insecure_listen_starts_warns_and_shows_the_mode(tmpdir_short):
    side = Sidecar(tmpdir_short, "insecure", tls=False, extra_args=["--insecure-listen"])
    side.args[side.args.index("--listen") + 1] = f"0.0.0.0:{side.port}"
    side.start()
    try:
        out = collectivectl("--address", side.unix_address, "info")
        assert out.returncode == 0, out.stderr
        assert "tcp security: insecure (--insecure-listen)" in out.stdout
        assert "plaintext without authentication (--insecure-listen)" in side.log()
        with urllib.request.urlopen(f"http://127.0.0.1:{side.metrics_port}/metrics",
                                    timeout=10) as response:
            assert 'tcp_security="insecure (--insecure-listen)"' in response.read().decode()
        # Plaintext clients are served there.
        assert get_info(f"127.0.0.1:{side.port}", TlsOptions()).tcp_security == \
            "insecure (--insecure-listen)"
    finally:
        assert side.stop() == 0, side.log()
    # Loopback without TLS is allowed and says so.
    loop = Sidecar(tmpdir_short, "loop", tls=False).start()
    try:
        assert get_info(loop.tcp_address, TlsOptions()).tcp_security == "insecure (loopback)"
    finally:
        assert loop.stop() == 0, loop.log()


def test_missing_garbage_or_mismatched_tls_files_fail_at_start(tmpdir_short):
    certs = tls_certs()
    sock = ["--socket", os.path.join(tmpdir_short, "z.sock"), "--listen", "127.0.0.1:0",
            "--metrics", ""]
    good = {"--tls-cert": str(certs / "sidecar.crt"), "--tls-key": str(certs / "sidecar.key"),
            "--tls-ca": str(certs / "ca.crt")}
    garbage = pathlib.Path(tmpdir_short, "garbage.pem")
    garbage.write_text("this is not a certificate\n")

    def run(**changes):
        files = dict(good)
        for flag, value in changes.items():
            flag = "--" + flag.replace("_", "-")
            if value is None:
                del files[flag]
            else:
                files[flag] = value
        args = [a for pair in files.items() for a in pair]
        result = start_daemon(sock + args)
        assert result.returncode == 1, result.stdout + result.stderr
        return result.stderr

    missing = str(pathlib.Path(tmpdir_short, "missing.crt"))
    err = run(tls_cert=missing)
    assert f"--tls-cert {missing}: cannot read it: No such file or directory" in err, err
    err = run(tls_cert=str(garbage))
    assert f"--tls-cert {garbage}: no PEM certificate in it" in err, err
    err = run(tls_key=str(garbage))
    assert f"--tls-key {garbage}: no PEM private key in it" in err, err
    err = run(tls_key=str(certs / "client.key"))
    assert "this private key does not belong to the certificate in " + str(
        certs / "sidecar.crt") in err, err
    err = run(tls_ca=str(garbage))
    assert f"--tls-ca {garbage}: no PEM certificate in it" in err, err
    err = run(tls_key=None, tls_ca=None)
    assert "mutual TLS needs --tls-cert, --tls-key and --tls-ca together: --tls-key and " \
           "--tls-ca missing" in err, err


def test_rotated_certificates_are_picked_up_without_a_restart(tmp_path, tmpdir_short):
    old = gen_certs(tmp_path / "old", "collectived CA one")
    new = gen_certs(tmp_path / "new", "collectived CA two")
    live = tmp_path / "live"
    live.mkdir()
    for name in ("ca.crt", "sidecar.crt", "sidecar.key"):
        shutil.copy(old / name, live / name)
    side = Sidecar(tmpdir_short, "rotating", tls=live, extra_args=["--tls-refresh-s", "1"])
    side.start()
    try:
        assert get_info(side.tcp_address, client_tls(old)).tcp_security == "mutual-tls"
        refusal(side.tcp_address, client_tls(new))  # not yet trusted
        # Replace the files in place (write aside, then rename), as a Secret update does.
        for name in ("ca.crt", "sidecar.key", "sidecar.crt"):
            shutil.copy(new / name, live / (name + ".tmp"))
            os.replace(live / (name + ".tmp"), live / name)
        deadline = time.monotonic() + 30
        while True:
            try:
                info = get_info(side.tcp_address, client_tls(new), timeout=5)
                break
            except grpc.RpcError as error:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the new CA is still refused: {error.details()}")
                time.sleep(0.2)
        assert info.tcp_security == "mutual-tls"
        # A client of the old CA is refused now.
        error = refusal(side.tcp_address, client_tls(old))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        assert side.stop() == 0, side.log()


def test_two_sidecars_form_a_group_over_mutual_tls_and_allreduce(two_sidecars):
    node0, node1 = two_sidecars
    store = node0.tcp_address  # node1 reaches it over mutual TLS with its sidecar certificate

    def rank_fn(rank):
        with Client((node0 if rank == 0 else node1).unix_address) as client:
            client.create_group("tls-pair", rank, 2, store_address=store, timeout=60)
            x = np.full(1000, rank + 1.0, np.float32)
            client.allreduce("tls-pair", x)
            client.destroy_group("tls-pair")
            return x

    results = run_ranks(rank_fn, 2)
    for x in results:
        np.testing.assert_array_equal(x, np.full(1000, 3.0, np.float32))
    for side in (node0, node1):
        assert get_info(side.tcp_address, client_tls(tls_certs())).tcp_security == "mutual-tls"


def test_a_sidecar_with_a_rogue_certificate_cannot_use_the_store(tmp_path, two_sidecars):
    node0, _ = two_sidecars
    certs = tls_certs()
    rogue_dir = tmp_path / "rogue"
    rogue_dir.mkdir()
    shutil.copy(certs / "rogue-sidecar.crt", rogue_dir / "sidecar.crt")
    shutil.copy(certs / "rogue-sidecar.key", rogue_dir / "sidecar.key")
    shutil.copy(certs / "ca.crt", rogue_dir / "ca.crt")  # it trusts the real sidecars
    rogue = Sidecar(str(pathlib.Path(node0.socket_path).parent), "rogue", tls=rogue_dir).start()
    try:
        with Client(rogue.unix_address) as client:
            with pytest.raises(collectived.CollectivedError) as caught:
                client.create_group("rogue-group", 0, 2, store_address=node0.tcp_address,
                                    timeout=5)
        message = str(caught.value)
        assert node0.tcp_address in message, message
        assert caught.value.kind in ("unavailable", "timeout"), message
    finally:
        assert rogue.stop() == 0, rogue.log()


def test_clients_name_unreadable_tls_files(sidecar, tmpdir_short):
    missing = os.path.join(tmpdir_short, "missing-ca.crt")
    with pytest.raises(collectived.InvalidArgumentError) as caught:
        Client(sidecar.tcp_address, tls=TlsOptions(ca=missing))
    assert f"TLS CA file {missing}: cannot read it" in str(caught.value)
    certs = tls_certs()
    with pytest.raises(collectived.InvalidArgumentError) as caught:
        collectived.StoreClient(sidecar.tcp_address, tls=TlsOptions(ca=str(certs / "ca.crt"),
                                                                    cert=str(certs / "client.crt")))
    assert "certificate and its key come together" in str(caught.value)
    # collectivectl (the C++ client's channel) names the file too.
    out = collectivectl("--address", sidecar.tcp_address, "--tls-ca", missing, "health",
                        env=daemon_env())
    assert out.returncode == 1
    assert f"TLS CA file {missing}: cannot read it: No such file or directory" in out.stderr
    out = collectivectl("--address", sidecar.tcp_address, "--tls-ca", str(certs / "ca.crt"),
                        "--tls-cert", str(certs / "client.crt"), "--tls-key",
                        str(certs / "admin.key"), "health", env=daemon_env())
    assert out.returncode == 1
    assert "does not belong to the certificate in " + str(certs / "client.crt") in out.stderr
    # A Unix socket ignores TLS settings.
    with Client(sidecar.unix_address, tls=TlsOptions(ca=missing)) as client:
        assert client.sidecar_info().tcp_security == "mutual-tls"


def test_peer_name_override_is_what_sidecars_expect_of_each_other(tmpdir_short):
    # Peers reached by an address their certificate does not name (as pods by IP in
    # Kubernetes) are verified against --tls-peer-name: the name every sidecar certificate has.
    node0 = Sidecar(tmpdir_short, "pn0").start()
    good = Sidecar(tmpdir_short, "pn1", extra_args=["--tls-peer-name", "collectived"]).start()
    wrong = Sidecar(tmpdir_short, "pn2", extra_args=["--tls-peer-name", "not-collectived"]).start()
    try:
        def rank_fn(rank):
            with Client((node0 if rank == 0 else good).unix_address) as client:
                client.create_group("named", rank, 2, store_address=node0.tcp_address, timeout=60)
                x = np.full(8, rank + 1.0, np.float32)
                client.allreduce("named", x)
                client.destroy_group("named")
                return x

        for x in run_ranks(rank_fn, 2):
            np.testing.assert_array_equal(x, np.full(8, 3.0, np.float32))
        with Client(wrong.unix_address) as client:
            with pytest.raises(collectived.CollectivedError) as caught:
                client.create_group("misnamed", 1, 2, store_address=node0.tcp_address, timeout=5)
        assert node0.tcp_address in str(caught.value), str(caught.value)
        assert caught.value.kind in ("unavailable", "timeout"), str(caught.value)
        assert "Hostname Verification Check failed" in str(caught.value), str(caught.value)
    finally:
        for side in (node0, good, wrong):
            assert side.stop() == 0, side.log()


def test_group_keys_are_open_to_sidecar_certificates_only(sidecar):
    # Under mutual TLS the store tells peer sidecars (certificate name "collectived") from
    # clients by their verified certificate.
    key = "collectived/groups/tls-probe/failed"
    with pytest.raises(collectived.PermissionDeniedError) as caught:
        collectived.StoreClient(sidecar.tcp_address, tls=client_tls(tls_certs())).set(key, b"x")
    assert f"store set of key '{key}' refused" in str(caught.value)
    assert "as collectived-client" in str(caught.value)
    peer = collectived.StoreClient(sidecar.tcp_address, tls=client_tls(tls_certs(), "sidecar"))
    peer.set(key, b"x")
    assert peer.get(key) == b"x"
    assert peer.delete_key(key)
