"""Helpers for the tests that run real torch.distributed processes on the collectived backend.

- ``Sidecars``: sidecars started for a whole module (the conftest fixtures are per test), with
  the metrics endpoint off unless asked for.
- ``launch``: one process per rank, rank r attached to sidecar r % len(sidecars) (ranks are
  interleaved across the "nodes"), with env://, tcp:// or file:// rendezvous.
- ``parse_results``: the ``@@RESULT {json}`` lines the worker scripts print.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BUILD_DIR, Sidecar, free_port

HERE = pathlib.Path(__file__).resolve().parent
HELPERS = HERE / "helpers"
PYTHON = sys.executable


def python_path():
    """PYTHONPATH for workers: the parent's PYTHONPATH, then the build's package."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    build_python = str(BUILD_DIR / "python")
    if build_python not in parts:
        parts.append(build_python)
    return os.pathsep.join(parts)


class Sidecars:
    """n sidecars on loopback in a private temporary directory."""

    def __init__(self, n=2, metrics=False):
        self._tmp = tempfile.TemporaryDirectory(prefix="cdt-")
        extra = () if metrics else ("--metrics", "")
        self.sides = []
        try:
            for i in range(n):
                self.sides.append(Sidecar(self._tmp.name, f"node{i}", extra_args=extra).start())
        except BaseException:
            self.stop()
            raise

    def __getitem__(self, i):
        return self.sides[i]

    def __len__(self):
        return len(self.sides)

    @property
    def tmpdir(self):
        return self._tmp.name

    def logs(self):
        return "\n".join(f"--- {s.log_path}\n{s.log()[-4000:]}" for s in self.sides)

    def stop(self):
        codes = []
        for side in self.sides:
            try:
                codes.append(side.stop())
            except Exception as error:  # noqa: BLE001 - reported by the caller
                codes.append(repr(error))
        self._tmp.cleanup()
        return codes


@pytest.fixture(scope="module")
def module_sidecars():
    sides = Sidecars(2)
    yield sides
    logs = sides.logs()
    codes = sides.stop()
    assert codes == [0, 0], f"sidecars exited with {codes}\n{logs}"


def init_method_for(kind, tmpdir):
    """Returns (init_method, extra env) for "env", "tcp" or "file"."""
    if kind == "env":
        return "env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if kind == "tcp":
        return f"tcp://127.0.0.1:{free_port()}", {}
    if kind == "file":
        fd, path = tempfile.mkstemp(prefix="init-", dir=tmpdir)
        os.close(fd)
        os.unlink(path)  # torch's FileStore creates it; a fresh path per rendezvous
        return f"file://{path}", {}
    raise ValueError(kind)


class Ranks:
    """The processes of one job and, once finished, their outputs."""

    def __init__(self, procs, timeout, commands=None):
        self.procs = procs
        self.timeout = timeout
        self.outputs = [None] * len(procs)
        self.returncodes = [None] * len(procs)
        self.commands = commands or []  # (argv, env) of each rank, to start it again
        self.earlier = {}  # rank -> (returncode, output) of a process started again

    def relaunch(self, rank, env=None):
        """Starts rank `rank` again with its command and environment, updated with `env` (a
        replacement), once its process ended; keeps the ended one's exit code and output in
        `earlier`."""
        out, _ = self.procs[rank].communicate()
        self.earlier[rank] = (self.procs[rank].returncode, out)
        argv, proc_env = self.commands[rank]
        proc_env = dict(proc_env, **(env or {}))
        self.procs[rank] = subprocess.Popen(argv, env=proc_env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)

    def wait(self):
        deadline = time.monotonic() + self.timeout
        for rank, proc in enumerate(self.procs):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                out = (out or "") + f"\n[rank {rank} killed after {self.timeout} s]"
            self.outputs[rank] = out
            self.returncodes[rank] = proc.returncode
        return self

    def results(self):
        """{check: [result of rank 0, rank 1, ...]} (None where a rank printed nothing)."""
        table = {}
        for rank, out in enumerate(self.outputs):
            for result in parse_results(out or ""):
                table.setdefault(result["check"], [None] * len(self.outputs))[rank] = result
        return table

    def output_of(self, rank, tail=6000):
        return (self.outputs[rank] or "")[-tail:]


def launch(script, args, world_size, sidecars, init="env", timeout=120, env=None,
           address=lambda side: side.unix_address):
    """Starts `script` once per rank: `python script *args INIT_METHOD RANK WORLD_SIZE`."""
    init_method, extra_env = init_method_for(init, sidecars.tmpdir)
    procs = []
    commands = []
    for rank in range(world_size):
        side = sidecars[rank % len(sidecars)]
        proc_env = dict(os.environ)
        proc_env.update(extra_env)
        proc_env.update(env or {})
        proc_env.update({
            "PYTHONPATH": python_path(),
            "COLLECTIVED_ADDRESS": address(side),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        })
        argv = [PYTHON, str(script), *map(str, args), init_method, str(rank), str(world_size)]
        commands.append((argv, proc_env))
        procs.append(subprocess.Popen(argv, env=proc_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return Ranks(procs, timeout, commands)


def parse_results(output):
    results = []
    for line in output.splitlines():
        if line.startswith("@@RESULT "):
            results.append(json.loads(line[len("@@RESULT "):]))
    return results


def load_helper(name):
    """Imports tests/python/helpers/<name>.py as a module (for its lists of checks)."""
    import importlib.util
    # The helpers import each other as the scripts they are (their folder is first on the path).
    if str(HELPERS) not in sys.path:
        sys.path.append(str(HELPERS))
    spec = importlib.util.spec_from_file_location(f"helpers_{name}", HELPERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_check(ranks, name, sidecars=None):
    """Asserts that every rank reported `name` as passed; explains what went wrong otherwise."""
    per_rank = ranks.results().get(name)
    problems = []
    if per_rank is None:
        problems.append(f"no rank reported check {name!r}")
        per_rank = [None] * len(ranks.outputs)
    for rank, result in enumerate(per_rank):
        if result is None:
            problems.append(f"rank {rank} did not report {name!r} (exit code "
                            f"{ranks.returncodes[rank]}); output tail:\n{ranks.output_of(rank)}")
        elif not result["ok"]:
            problems.extend(result["errors"])
    skipped = {result.get("skipped") for result in per_rank if result is not None}
    if not problems and skipped != {None}:
        # Only a check that every rank found inapplicable (a feature this torch lacks) skips.
        if len(skipped) == 1:
            pytest.skip(skipped.pop())
        problems.append(f"ranks disagree on whether {name!r} applies: {sorted(map(str, skipped))}")
    if problems:
        message = "\n".join(problems)
        if sidecars is not None and any(r is None for r in per_rank):
            message += "\n" + sidecars.logs()
        pytest.fail(message, pytrace=False)
