"""A mixed-language job on two sidecars (loopback): two PyTorch ranks (the "collectived"
torch.distributed backend) on sidecar node0, a Go rank (clients/go) and a C++ rank
(clients/cpp) on sidecar node1, all four in one group, allreducing, broadcasting from every
root and all-gathering, each checking its results exactly (examples/go)."""

import os
import shutil
import subprocess

import pytest

from conftest import BIN, ROOT, BUILD_DIR

GO_EXAMPLE = BIN / "collectived-go-example"
CPP_RANK = BIN / "collectived-cpp-mixed-rank"


def go_binary_or_skip():
    if shutil.which("go") is None:
        print("skipping: Go is not installed (scripts/setup.sh installs golang-go)")
        pytest.skip("Go is not installed (scripts/setup.sh installs golang-go)")
    assert GO_EXAMPLE.exists(), f"Go is installed but {GO_EXAMPLE} was not built"
    return GO_EXAMPLE


def test_four_ranks_python_go_cpp_over_two_sidecars(two_sidecars):
    go_example = go_binary_or_skip()
    node0, node1 = two_sidecars
    store = node0.tcp_address
    env = dict(os.environ, PYTHONPATH=str(BUILD_DIR / "python"))
    procs = []
    for rank in (0, 1):
        procs.append(("torch", rank, subprocess.Popen(
            ["/usr/bin/python3", str(ROOT / "examples/go/torch_rank.py"), str(rank), store],
            env=dict(env, COLLECTIVED_ADDRESS=node0.unix_address),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    procs.append(("go", 2, subprocess.Popen(
        [str(go_example), "-address", node1.unix_address, "-store", store, "-rank", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    procs.append(("cpp", 3, subprocess.Popen(
        [str(CPP_RANK), "--address", node1.unix_address, "--store", store, "--rank", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    outputs = {}
    try:
        for lang, rank, proc in procs:
            out, _ = proc.communicate(timeout=180)
            outputs[(lang, rank)] = (proc.returncode, out)
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report = "\n".join(f"--- {lang} rank {rank} (exit {rc}):\n{out}"
                       for (lang, rank), (rc, out) in outputs.items())
    for (lang, rank), (rc, out) in outputs.items():
        assert rc == 0, report
        assert f"{lang} rank {rank}: allreduce, broadcast x4, all_gather ok" in out, report
