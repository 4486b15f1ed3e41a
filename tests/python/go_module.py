"""Builds a Go program the way a user outside this tree would: its own module (`go mod init`),
a requirement on the collectived client module, a vendor tree from Debian's Go packages
(clients/go/vendor-debian.sh) and `go build` in module mode, offline."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

CLIENT_MODULE = "github.com/collectived/collectived/clients/go"


def go_environment(scratch):
    # Nothing may be downloaded: no proxy, no checksum database, no toolchain switch.
    return dict(os.environ, GOPROXY="off", GOSUMDB="off", GOTOOLCHAIN="local", GOENV="off",
                GOFLAGS="", GOPATH=str(scratch / "gopath"), GOCACHE=str(scratch / "gocache"))


def require_go():
    if shutil.which("go") is None:
        print("skipping: Go is not installed (scripts/setup.sh installs golang-go)")
        pytest.skip("Go is not installed (scripts/setup.sh installs golang-go)")


def run(command, cwd, env, timeout=300):
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, command))}:\n{result.stdout}{result.stderr}"
    return result


def build_program(folder, module, main_source, scratch):
    """Writes main.go into a fresh module at `folder` and builds it; returns the binary."""
    folder.mkdir(parents=True)
    (folder / "main.go").write_text(main_source)
    env = go_environment(scratch)
    run(["go", "mod", "init", module], folder, env)
    run(["go", "mod", "edit", f"-require={CLIENT_MODULE}@v0.1.0"], folder, env)
    run([str(ROOT / "clients/go/vendor-debian.sh"), "."], folder, env)
    binary = folder / folder.name
    run(["go", "build", "-o", str(binary), "."], folder, env)
    return binary
