"""The collectived daemon as a process: flags, health, listeners, metrics, clean shutdown."""

import os
import signal
import stat
import subprocess
import urllib.request

from conftest import BIN, Sidecar, collectivectl, free_port


def test_help_lists_every_flag_and_its_environment_variable():
    out = subprocess.run([str(BIN / "collectived"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--socket", "--listen", "--advertise", "--metrics", "--log-level",
                 "COLLECTIVED_SOCKET", "COLLECTIVED_LISTEN", "COLLECTIVED_METRICS"):
        assert flag in out.stdout


def test_bad_flag_is_named_and_exits_2():
    out = subprocess.run([str(BIN / "collectived"), "--listen", "nonsense"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 2
    assert "--listen" in out.stderr and "HOST:PORT" in out.stderr


def test_health_over_unix_socket_tcp_and_environment(sidecar):
    for address in (sidecar.unix_address, sidecar.tcp_address,
                    "unix:" + sidecar.socket_path):
        out = collectivectl("--address", address, "health")
        assert out.returncode == 0, out.stderr
        assert "SERVING" in out.stdout
    env = dict(os.environ, COLLECTIVED_ADDRESS=sidecar.tcp_address)
    out = collectivectl("health", env=env)
    assert out.returncode == 0 and sidecar.tcp_address in out.stdout


def test_info_reports_listeners_and_backends(sidecar):
    out = collectivectl("--address", sidecar.unix_address, "info")
    assert out.returncode == 0, out.stderr
    assert f"advertise:  127.0.0.1:{sidecar.port}" in out.stdout
    assert "gloo:       yes" in out.stdout


def test_socket_has_restrictive_permissions(sidecar):
    mode = stat.S_IMODE(os.stat(sidecar.socket_path).st_mode)
    assert mode == 0o660


def test_metrics_endpoint_serves_build_info(sidecar):
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    assert 'collectived_build_info{' in text and 'version="0.1.0"' in text


def test_sigterm_and_sigint_stop_cleanly_and_remove_the_socket(tmpdir_short):
    for sig in (signal.SIGTERM, signal.SIGINT):
        side = Sidecar(tmpdir_short, f"stop{int(sig)}").start()
        assert os.path.exists(side.socket_path)
        assert side.stop(sig) == 0, side.log()
        assert not os.path.exists(side.socket_path)
        log = side.log()
        assert "collectived listening" in log and "collectived stopped" in log


def test_port_in_use_is_a_clear_start_up_error(sidecar, tmpdir_short):
    clash = Sidecar(tmpdir_short, "clash")
    clash.args[clash.args.index("--listen") + 1] = sidecar.tcp_address
    process = subprocess.run(clash.args, capture_output=True, text=True, timeout=20)
    assert process.returncode == 1
    assert "cannot listen" in process.stderr and sidecar.tcp_address in process.stderr


def test_unreachable_sidecar_fails_fast_with_a_message(tmpdir_short):
    out = collectivectl("--address", f"127.0.0.1:{free_port()}", "--timeout-ms", "1000",
                        "health", timeout=20)
    assert out.returncode != 0
    assert "health check" in out.stderr
    out = collectivectl("--address", "unix://relative/path", "health")
    assert out.returncode != 0 and "absolute" in out.stderr
