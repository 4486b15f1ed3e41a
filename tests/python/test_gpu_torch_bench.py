"""bench/gpu_torch_bench.py's smoke mode (--device cpu --quick): every section's processes,
sidecars and rendezvous run on CPU tensors with gloo as the anchor, and the report ends with one
line per target (their figures mean nothing on CPU; the script is for a GPU machine). The
stream-signal jobs run too, and say that CPU ops took no signal word, and (c)'s pacing at the
sidecar is read from its flight records."""

import re
import subprocess
import sys

from conftest import BUILD_DIR, ROOT, daemon_env
from torch_helpers import python_path


def test_cpu_smoke_prints_every_table_and_target():
    # daemon_env: the session's client TLS variables would otherwise configure the sidecars.
    env = dict(daemon_env(), PYTHONPATH=python_path())
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_torch_bench.py"),
                          "--build-dir", str(BUILD_DIR), "--device", "cpu", "--quick"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "FAILED" not in run.stdout, run.stdout
    for section in ("(a)", "(b)", "(c)", "(d)"):
        assert any(line.startswith(section) for line in run.stdout.splitlines()), section
        targets = [line for line in run.stdout.splitlines()
                   if line.startswith(f"target {section} ")]
        # (c) has a line per wait path: the sidecar's event, a stream-signal word.
        assert len(targets) == (2 if section == "(c)" else 1), run.stdout
        for target in targets:
            assert re.search(r" : (met|not met) \(.+\)$", target), run.stdout
    assert "signal path: not in use (no CUDA collective asked for a word)" in run.stdout
    # (c) at the sidecar: a row per job that ran the burst, from its sidecar's flight records:
    # the last round's ops, the intervals of the stages a CPU group records, none of the CUDA
    # ones.
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("(c) at the sidecar"))
    rows = [line.split() for line in lines[start + 2:] if line.startswith("x")]
    rows = rows[:next((i for i, row in enumerate(rows) if len(row) != 8), len(rows))]
    paths = {(row[0], row[1]) for row in rows}
    assert {("x1", "event"), ("x2", "event"), ("x1", "signal")} <= paths, run.stdout
    for row in rows:
        assert int(row[2]) >= 2, row  # --quick --device cpu: 100 ops a round
        assert all(float(v) > 0 for v in (row[3], row[4], row[7])), row
        assert row[5] == "-" and row[6] == "-", row
