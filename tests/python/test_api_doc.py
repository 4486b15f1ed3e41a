"""docs/api.md's examples run: every fenced block whose first line is "# doc-example: NAME"
(Python) or "// doc-example: NAME" (Go) is extracted and run against a real sidecar, so the
guide cannot drift from the API."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import BUILD_DIR, ROOT
from go_module import go_environment, require_go

DOC = ROOT / "docs" / "api.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def examples(language):
    marker = {"python": "# doc-example: ", "go": "// doc-example: ", "sh": "# doc-example: "}[language]
    found = {}
    for lang, body in BLOCK.findall(DOC.read_text()):
        if lang == language and body.startswith(marker):
            found[body.splitlines()[0][len(marker):].split()[0]] = body
    return found


def test_the_guide_has_both_examples():
    assert list(examples("python")) == ["raw_python_client"]
    assert list(examples("go")) == ["raw_go_client"]
    assert list(examples("sh")) == ["go_module_setup"]


@pytest.mark.parametrize("name", sorted(examples("python")))
def test_python_example_runs(name, sidecar, tmp_path):
    script = tmp_path / f"{name}.py"
    script.write_text(examples("python")[name])
    env = dict(os.environ, PYTHONPATH=str(BUILD_DIR / "python"),
               COLLECTIVED_ADDRESS=sidecar.unix_address)
    result = subprocess.run(["/usr/bin/python3", str(script)], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "raw python client ok" in result.stdout


@pytest.mark.parametrize("name", sorted(examples("go")))
def test_go_example_builds_as_the_guide_says_and_runs(name, sidecar, tmp_path):
    require_go()
    folder = tmp_path / name
    folder.mkdir()
    (folder / "main.go").write_text(examples("go")[name])
    env = dict(go_environment(tmp_path), COLLECTIVED=str(ROOT))
    build = subprocess.run(["bash", "-euc", examples("sh")["go_module_setup"]], cwd=folder, env=env,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    result = subprocess.run([str(folder / "raw-client")],
                            env=dict(env, COLLECTIVED_ADDRESS=sidecar.unix_address),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "raw go client ok" in result.stdout
