"""Fixtures that start real collectived sidecars on loopback for the Python tests.

The secure path is the tested one: sidecars serve their TCP listener with mutual TLS
(certificates from scripts/gen-certs.sh, generated once per test process), and the tests'
clients (Python, collectivectl, worker processes) present the plain client certificate through
$COLLECTIVED_TLS_CA/_CERT/_KEY, set for the whole session.
"""

import atexit
import os
import pathlib
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("COLLECTIVED_BUILD_DIR", ROOT / "build"))
BIN = BUILD_DIR / "bin"


# The daemon's own TLS variables: never inherited by a Sidecar (its flags say what it uses).
DAEMON_SECURITY_ENV = ("COLLECTIVED_TLS_CERT", "COLLECTIVED_TLS_KEY", "COLLECTIVED_TLS_CA",
                       "COLLECTIVED_TLS_PEER_NAME", "COLLECTIVED_TLS_REFRESH_S",
                       "COLLECTIVED_INSECURE_LISTEN")


def gen_certs(directory, ca_name=None):
    """Runs scripts/gen-certs.sh into ``directory``; returns it as a Path."""
    args = ["bash", str(ROOT / "scripts" / "gen-certs.sh"), str(directory)]
    if ca_name:
        args.append(ca_name)
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=60)
    return pathlib.Path(directory)


_certs = None


def tls_certs():
    """The test process's certificates (ca, sidecar, admin, client, rogue-ca, rogue-sidecar)."""
    global _certs
    if _certs is None:
        directory = tempfile.mkdtemp(prefix="cd-certs-")
        atexit.register(shutil.rmtree, directory, True)
        _certs = gen_certs(directory)
    return _certs


def sidecar_tls_args(certs=None, name="sidecar"):
    certs = pathlib.Path(certs or tls_certs())
    return ["--tls-cert", str(certs / f"{name}.crt"), "--tls-key", str(certs / f"{name}.key"),
            "--tls-ca", str(certs / "ca.crt")]


def client_tls_env(certs=None, name="client"):
    """The environment variables that make clients use mutual TLS with ``name``'s certificate."""
    certs = pathlib.Path(certs or tls_certs())
    return {"COLLECTIVED_TLS_CA": str(certs / "ca.crt"),
            "COLLECTIVED_TLS_CERT": str(certs / f"{name}.crt"),
            "COLLECTIVED_TLS_KEY": str(certs / f"{name}.key")}


def daemon_env():
    """os.environ without the daemon's security variables."""
    return {k: v for k, v in os.environ.items() if k not in DAEMON_SECURITY_ENV}


@pytest.fixture(scope="session", autouse=True)
def tls_client_environment():
    """Every client of the tests reaches TCP listeners with mutual TLS (the client certificate)."""
    values = client_tls_env()
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    yield tls_certs()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _ephemeral_ports():
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


# Listening ports come from below the kernel's ephemeral range, where outgoing connections take
# their local ports: between free_port() and a sidecar's bind, a test's many connections would
# otherwise take the port (a sidecar then fails to start with "address in use", again and again
# while the machine churns connections). Another listener may still take one: Sidecar.start moves.
_LISTEN_PORTS = range(10000, max(10001, _ephemeral_ports()[0]))
_port_choice = random.SystemRandom()


def free_port():
    for _ in range(64):
        port = _port_choice.choice(_LISTEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a range without a free port: any the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collectivectl(*args, env=None, timeout=30):
    return subprocess.run([str(BIN / "collectivectl"), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def unique(prefix="g"):
    """A name no other test uses (groups, keys)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def healthy(side):
    """Whether the sidecar answers its health check on the Unix socket."""
    return collectivectl("--address", side.unix_address, "--timeout-ms", "2000",
                         "health").returncode == 0


def two_rank_group(rank0, rank1):
    """Creates a fresh 2-rank group of the two clients (ranks 0 and 1); returns its name."""
    name = unique()
    joiner = threading.Thread(target=rank1.create_group, args=(name, 1, 2),
                              kwargs={"timeout": 20}, daemon=True)
    joiner.start()
    rank0.create_group(name, 0, 2, timeout=20)
    joiner.join(20)
    return name


class Sidecar:
    """One collectived process on a private socket and loopback ports.

    ``tls``: True (default) serves the TCP listener with mutual TLS using the session's sidecar
    certificate (peers are called with it too); False serves plaintext on loopback; a directory
    uses its sidecar.crt/.key and ca.crt instead.
    """

    def __init__(self, tmpdir, name="sidecar", extra_args=(), tls=True):
        self.socket_path = os.path.join(tmpdir, f"{name}.sock")
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = os.path.join(tmpdir, f"{name}.log")
        self.tls = bool(tls)
        # Without TLS no TCP caller is a peer sidecar unless the sidecar is told to trust them.
        security = (sidecar_tls_args(None if tls is True else tls) if tls
                    else ["--trust-plaintext-peers"])
        # Every sidecar of the tests has an admin token (aborting a group needs one).
        self.admin_token = "test-admin-" + secrets.token_hex(16)
        self.admin_token_file = os.path.join(tmpdir, f"{name}.admin-token")
        with open(self.admin_token_file, "w") as token_file:
            token_file.write(self.admin_token + "\n")
        self.args = [str(BIN / "collectived"), "--socket", self.socket_path,
                     "--listen", f"127.0.0.1:{self.port}", "--advertise", "127.0.0.1",
                     "--metrics", f"127.0.0.1:{self.metrics_port}", *security,
                     "--admin-token-file", self.admin_token_file, *extra_args]
        self.process = None

    @property
    def unix_address(self):
        return "unix://" + self.socket_path

    @property
    def tcp_address(self):
        return f"127.0.0.1:{self.port}"

    def _move_ports(self):
        """New loopback ports in place of ones another process took between free_port() and the
        sidecar's bind (an outgoing connection's ephemeral port can be any free one)."""
        replaced = {}
        for attr in ("port", "metrics_port"):
            old = f"127.0.0.1:{getattr(self, attr)}"
            setattr(self, attr, free_port())
            replaced[old] = f"127.0.0.1:{getattr(self, attr)}"
        self.args = [replaced.get(arg, arg) for arg in self.args]

    def start(self, timeout=20, attempts=5):
        for attempt in range(attempts):
            self._log = open(self.log_path, "w")
            self.process = subprocess.Popen(self.args, stdout=self._log,
                                            stderr=subprocess.STDOUT, env=daemon_env())
            try:
                if self._await_health(timeout, last=attempt == attempts - 1):
                    return self
            except BaseException:
                # A sidecar that failed to start does not outlive the test that started it.
                if self.process.poll() is None:
                    self.process.kill()
                    self.process.wait()
                self._log.close()
                raise
            self._log.close()
            # The sidecar could not listen on a port taken meanwhile: again, elsewhere.
            self._move_ports()
        raise AssertionError("unreachable")

    def _lost_a_port(self):
        """Whether the sidecar exited because one of its loopback ports was taken: gRPC logs
        "Address already in use" and the daemon "cannot listen on"; civetweb's metrics listener
        only "Possible problem binding to port", which the daemon reports as "cannot serve
        metrics"."""
        text = self.log().lower()
        return any(sign in text for sign in ("address already in use", "address in use",
                                             "cannot listen on", "cannot serve metrics"))

    def _await_health(self, timeout, last):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                if not last and self._lost_a_port():
                    return False
                raise RuntimeError(f"collectived exited with {self.process.returncode}: "
                                   f"{self.log()}")
            if collectivectl("--address", self.unix_address, "--timeout-ms", "500",
                             "health").returncode == 0:
                return True
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


def start_all(sidecars):
    """Starts every Sidecar of ``sidecars`` (a list) and returns it; when one fails to start, the
    ones already started are stopped before the error goes on."""
    started = []
    try:
        for side in sidecars:
            started.append(side.start())
    except BaseException:
        for side in started:
            side.stop()
        raise
    return started


@pytest.fixture
def two_sidecars(tmpdir_short):
    sides = start_all([Sidecar(tmpdir_short, f"node{i}") for i in range(2)])
    yield sides
    for side in sides:
        assert side.stop() == 0, side.log()
