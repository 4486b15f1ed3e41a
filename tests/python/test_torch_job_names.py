"""Groups of the torch backend are named after their job, so that metrics, logs and
`collectivectl describe` tie them to it; ``pg-<hex>`` only when nothing names the job."""
import os
import re
import subprocess

from conftest import collectivectl
from torch_helpers import PYTHON, python_path

WORKER = r"""
import datetime, os, sys
import torch.distributed as dist
import collectived.torch  # registers the backend
dist.init_process_group("collectived", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0,
                        world_size=1, timeout=datetime.timedelta(seconds=60))
second = dist.new_group([0])
print("@@GROUPS", dist.group.WORLD._name if hasattr(dist.group.WORLD, "_name") else "")
import collectived
client = collectived.Client(os.environ["COLLECTIVED_ADDRESS"])
print("@@NAMES", " ".join(sorted(g.name for g in client.list_groups())))
client.close()
dist.destroy_process_group()
"""


def test_the_group_name_is_made_of_the_job_and_its_index():
    from collectived.torch_names import group_name as group_name_for
    assert re.fullmatch(r"train-llm_7\.b-pg3-[0-9a-f]{8}", group_name_for("train llm_7.b", 3))
    assert re.fullmatch(r"pg-[0-9a-f]{16}", group_name_for("", 0))
    assert re.fullmatch(r"pg-[0-9a-f]{16}", group_name_for("///", 0))
    assert len(group_name_for("x" * 500, 12)) == 64 + len("-pg12-") + 8


def names_seen(sidecar, env_job):
    from conftest import free_port
    env = dict(os.environ, PYTHONPATH=python_path(), COLLECTIVED_ADDRESS=sidecar.unix_address)
    env.pop("COLLECTIVED_JOB_NAME", None)
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.update(env_job)
    out = subprocess.run([PYTHON, "-c", WORKER, str(free_port())], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("@@NAMES"))
    return line.split()[1:]


def test_groups_carry_the_job_name_from_the_environment(sidecar):
    names = names_seen(sidecar, {"COLLECTIVED_JOB_NAME": "resnet-sweep-4"})
    assert any(re.fullmatch(r"resnet-sweep-4-pg0-[0-9a-f]{8}", n) for n in names), names
    assert any(re.fullmatch(r"resnet-sweep-4-pg1-[0-9a-f]{8}", n) for n in names), names
    # torchrun's run id names the job when nothing else does; its default "none" does not.
    names = names_seen(sidecar, {"TORCHELASTIC_RUN_ID": "run42"})
    assert any(n.startswith("run42-pg0-") for n in names), names
    names = names_seen(sidecar, {"TORCHELASTIC_RUN_ID": "none"})
    assert names and all(re.fullmatch(r"pg-[0-9a-f]{16}", n) for n in names), names
