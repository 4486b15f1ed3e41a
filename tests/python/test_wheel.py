"""The Python client is an installable package: the build's wheel installs with pip into a fresh
virtual environment (offline; its dependencies are Debian's), imports and runs collectives on a
real sidecar without any CUDA library loaded (and, where a mount namespace can hide
/usr/local/cuda, with no CUDA library on the machine at all), loads the CUDA half only at first
CUDA use, and declares the torch.backends entry point that registers the backend."""

import os
import shutil
import subprocess
import textwrap

import pytest

from conftest import BUILD_DIR

DIST = BUILD_DIR / "dist"

# Runs in the venv: the installed package, not build/python, does a CPU allreduce through the
# sidecar's submission ring and reports which CUDA/NCCL libraries the process has mapped.
CPU_ONLY = textwrap.dedent('''
    import sys
    import numpy as np
    import collectived, collectived.torch
    from collectived import cuda
    assert "site-packages" in collectived.__file__, collectived.__file__

    def cuda_libraries():
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps
                           if "libcuda" in line or "libnccl" in line})

    client = collectived.Client(sys.argv[1])
    client.create_group("wheel", rank=0, world_size=1)
    x = client.empty((2,), np.float32)
    x[:] = [1.5, 2.5]
    client.allreduce("wheel", x)
    print("allreduce", x.tolist(), "ring" if client.ring_error is None else client.ring_error)
    print("after import and a CPU allreduce:", cuda_libraries())

    # The native core (libcollectived_native.so) links no CUDA library either.
    import ctypes
    import torch
    from collectived import dtypes, native_session
    native = native_session.NativeSession(sys.argv[1])
    native.create_group("wheel-native", 0, 1)
    t = torch.tensor([1.5, 2.5])
    native.allreduce(b"wheel-native", t).wait(30)
    print("native allreduce", t.tolist())
    print("after a native CPU allreduce:", cuda_libraries())
    print("cuda built:", cuda.built())
    print("cuda available:", cuda.available())
    try:
        cuda.export(1, 4, 0, 0)
    except ValueError as error:
        print("cuda export:", error)
    print("after the first CUDA use:", cuda_libraries())
    # A CUDA tensor handed to the native core opens its CUDA half (libcollectived_cuda.so) then.
    tensor = (native_session._Tensor * 1)()
    tensor[0].data, tensor[0].count, tensor[0].cuda_device = 4096, 1, 0
    tensor[0].dtype = dtypes.torch_to_proto(torch.float32)
    op = native_session._Op(type=native_session.OP_KINDS["allreduce"])
    work = native_session.NativeWork(
        native._lib.collectived_native_submit(native._open(), b"wheel-native", ctypes.byref(op),
                                              tensor, 1, tensor, 0),
        native._lib, native._quick, native._orphans, "allreduce", b"wheel-native", None)
    try:
        work.wait(30)
        print("native cuda export: accepted a host pointer")
    except Exception as error:
        print("native cuda export:", error)
    native.close()
    client.close()
''')


def wheel():
    wheels = sorted(DIST.glob("collectived-*.whl"))
    if not wheels:
        print("skipping: no wheel in build/dist (the build prints why: "
              "python3-pip, python3-setuptools, python3-wheel)")
        pytest.skip("the build made no wheel (python3-pip/setuptools/wheel missing)")
    return wheels[-1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh virtual environment (Debian's packages visible) with the wheel installed by pip."""
    built = wheel()
    root = tmp_path_factory.mktemp("venv")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(root)],
                   check=True, timeout=120)
    python = root / "bin" / "python"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    installed = subprocess.run([str(python), "-m", "pip", "install", str(built)], env=env,
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def clean_env():
    env = dict(os.environ)
    for name in ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD"):
        env.pop(name, None)
    return env


def test_the_wheel_holds_the_package_its_stubs_and_its_native_libraries():
    import zipfile
    names = zipfile.ZipFile(wheel()).namelist()
    for name in ("collectived/__init__.py", "collectived/torch/backend.py",
                 "collectived/v1/collectives_pb2.py", "collectived/v1/session_pb2_grpc.py",
                 "collectived/libcollectived_ring.so", "collectived/libcollectived_native.so"):
        assert name in names, name
    entry_points = zipfile.ZipFile(wheel()).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[torch.backends]\ncollectived = collectived.torch:register" in entry_points


@pytest.mark.parametrize("library", ["libcollectived_ring.so", "libcollectived_native.so"])
def test_the_cpu_libraries_do_not_link_cuda(library):
    names = [line.split("[")[1].rstrip("]") for line in subprocess.run(
        ["readelf", "-d", str(BUILD_DIR / "python/collectived" / library)],
        capture_output=True, text=True, check=True).stdout.splitlines() if "(NEEDED)" in line]
    assert names and not [n for n in names if "cuda" in n or "nccl" in n], names


def test_installed_wheel_runs_without_loading_cuda(venv, sidecar):
    result = subprocess.run([str(venv), "-c", CPU_ONLY, sidecar.unix_address], env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "allreduce [1.5, 2.5] ring", lines
    assert lines[1] == "after import and a CPU allreduce: []", lines
    assert lines[2:4] == ["native allreduce [1.5, 2.5]", "after a native CPU allreduce: []"], lines
    native_cuda = next(line for line in lines if line.startswith("native cuda export:"))
    assert "accepted" not in native_cuda, native_cuda
    if "cuda built: True" in lines:
        # The CUDA half exists and this machine has the CUDA runtime: loaded at first use only.
        assert any(line.startswith("after the first CUDA use:") and "libcudart" in line
                   for line in lines), lines
    else:
        assert "cuda available: False" in lines, lines


def test_installed_wheel_imports_with_no_cuda_on_the_machine(venv, sidecar):
    """/usr/local/cuda hidden by an empty tmpfs in a private mount namespace: the client imports,
    runs a CPU allreduce, and says plainly that CUDA tensors need the CUDA runtime."""
    if not os.path.isdir("/usr/local/cuda"):
        hide = []  # nothing to hide: the machine has no CUDA at all
    else:
        unshare = shutil.which("unshare")
        probe = subprocess.run([unshare, "-m", "true"], capture_output=True) if unshare else None
        if probe is None or probe.returncode != 0:
            print("skipping: cannot hide /usr/local/cuda (unshare -m is not permitted here); "
                  "test_installed_wheel_runs_without_loading_cuda still checks no CUDA is loaded")
            pytest.skip("unshare -m is not permitted here")
        hide = [unshare, "-m", "sh", "-c",
                'mount -t tmpfs none /usr/local/cuda && exec "$@"', "hide-cuda"]
    result = subprocess.run(hide + [str(venv), "-c", CPU_ONLY, sidecar.unix_address],
                            env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "allreduce [1.5, 2.5] ring", lines
    assert "cuda available: False" in lines, lines
    export = next(line for line in lines if line.startswith("cuda export:"))
    assert ("need the CUDA runtime" in export and "libcudart" in export) or \
        "built without CUDA" in export, export
    assert "after the first CUDA use: []" in lines, lines
    assert lines[3] == "after a native CPU allreduce: []", lines
    native_cuda = next(line for line in lines if line.startswith("native cuda export:"))
    assert ("cannot load" in native_cuda and "libcudart" in native_cuda) or \
        "built without CUDA" in native_cuda, native_cuda


def test_the_entry_point_registers_the_torch_backend(venv):
    """What torch 2.5+ does at the end of `import torch` (torch 1.13 here does not): call every
    "torch.backends" entry point. Before that, the backend is unknown; after, it is registered."""
    script = textwrap.dedent('''
        from importlib.metadata import entry_points
        import torch.distributed as dist
        assert not hasattr(dist.Backend, "COLLECTIVED")
        found = [e for e in entry_points(group="torch.backends") if e.name == "collectived"]
        assert len(found) == 1, found
        found[0].load()()
        print("registered:", dist.Backend.COLLECTIVED)
    ''')
    result = subprocess.run([str(venv), "-c", script], env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "registered: COLLECTIVED"  # torch 1.13 stores the name upper-case
