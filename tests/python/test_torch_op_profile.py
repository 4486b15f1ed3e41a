"""bench/torch_op_profile.py on CPU tensors (gloo as the anchor): both ranks run, the per-op lines
come out with figures, with the table of each layer's issue cost, and the profile names the
native session's allreduce among the costliest calls (the script is for a GPU machine; on CPU it
checks that the script works)."""

import re
import subprocess
import sys

from conftest import BUILD_DIR, ROOT, daemon_env
from torch_helpers import python_path


def _profile(size, **env):
    """The script's run on CPU tensors of `size` bytes, 100 ops, with `env` added."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "torch_op_profile.py"),
                          "--build-dir", str(BUILD_DIR), "--device", "cpu", "--bytes", str(size),
                          "--ops", "100", "--top", "40"],
                         cwd=ROOT, env=dict(daemon_env(), PYTHONPATH=python_path(), **env),
                         capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def test_cpu_profile_prints_the_per_op_times_each_layers_cost_and_the_costliest_calls():
    run = _profile(8)
    for line in ("gloo torch op, 8 B on cpu: ", "collectived torch op, 8 B on cpu: "):
        assert re.search(re.escape(line) + r"[0-9.]+ us per op", run.stdout), line
    for layer in ("torch's dist.all_reduce", "the backend's allreduce", "NativeSession.allreduce",
                  "the library's call alone"):
        assert re.search(r"^  " + re.escape(layer) + r" +[0-9.]+$", run.stdout, re.M), layer
    assert "Ordered by: internal time" in run.stdout
    assert "Ordered by: cumulative time" in run.stdout
    # The profiled ops went through the native session's allreduce.
    assert "native_session.py" in run.stdout and "(allreduce)" in run.stdout, run.stdout
