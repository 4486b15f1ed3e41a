"""Fixtures that start real collectived sidecars on loopback for the Python tests."""

import os
import pathlib
import secrets
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("COLLECTIVED_BUILD_DIR", ROOT / "build"))
BIN = BUILD_DIR / "bin"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collectivectl(*args, env=None, timeout=30):
    return subprocess.run([str(BIN / "collectivectl"), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


class Sidecar:
    """One collectived process on a private socket and loopback ports."""

    def __init__(self, tmpdir, name="sidecar", extra_args=()):
        self.socket_path = os.path.join(tmpdir, f"{name}.sock")
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = os.path.join(tmpdir, f"{name}.log")
        # Every sidecar of the tests has an admin token (aborting a group needs one).
        self.admin_token = "test-admin-" + secrets.token_hex(16)
        self.admin_token_file = os.path.join(tmpdir, f"{name}.admin-token")
        with open(self.admin_token_file, "w") as token_file:
            token_file.write(self.admin_token + "\n")
        self.args = [str(BIN / "collectived"), "--socket", self.socket_path,
                     "--listen", f"127.0.0.1:{self.port}", "--advertise", "127.0.0.1",
                     "--metrics", f"127.0.0.1:{self.metrics_port}",
                     "--admin-token-file", self.admin_token_file, *extra_args]
        self.process = None

    @property
    def unix_address(self):
        return "unix://" + self.socket_path

    @property
    def tcp_address(self):
        return f"127.0.0.1:{self.port}"

    def start(self, timeout=20):
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"collectived exited with {self.process.returncode}: "
                                   f"{self.log()}")
            if collectivectl("--address", self.unix_address, "--timeout-ms", "500",
                             "health").returncode == 0:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"collectived did not become healthy: {self.log()}")

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self._log.close()

    def log(self):
        try:
            return pathlib.Path(self.log_path).read_text()
        except OSError:
            return ""


@pytest.fixture
def tmpdir_short():
    # Unix socket paths are limited to 108 bytes: keep them short.
    with tempfile.TemporaryDirectory(prefix="cd-") as path:
        yield path


@pytest.fixture
def sidecar(tmpdir_short):
    side = Sidecar(tmpdir_short).start()
    yield side
    assert side.stop() == 0, side.log()


@pytest.fixture
def two_sidecars(tmpdir_short):
    sides = [Sidecar(tmpdir_short, f"node{i}").start() for i in range(2)]
    yield sides
    for side in sides:
        assert side.stop() == 0, side.log()
