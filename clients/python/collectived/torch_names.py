"""How the torch backend names and announces its groups (rpc/torch_names.h is the C++ side, and
tests/data/torch_names.tsv the vectors both are tested against).

- A group's name is ``<job>-pg<index>-<8 hex>``: the job (bytes other than ASCII letters, digits,
  '.', '_' and '-' made '-', at most 64 of them, no leading or trailing '-'), the process
  group's index in its process, and a random part so that a restarted job's groups never meet
  its earlier incarnation's; ``pg-<16 hex>`` without a job.
- Rank 0 of a torch group publishes ``NAME|STORE_ADDRESS`` at BOOTSTRAP_KEY under the group's
  prefix of the store torch handed the backend.
"""

import re
import uuid

BOOTSTRAP_KEY = "collectived/bootstrap"

_NOT_JOB = re.compile(rb"[^A-Za-z0-9._-]")
_GROUP = re.compile(r"(.+)-pg[0-9]+-[0-9A-Fa-f]+")


def job_part(job):
    """``job`` as a group name keeps it; "" when nothing of it is left."""
    return _NOT_JOB.sub(b"-", job.encode("utf-8")[:64]).decode("ascii").strip("-")


def group_name(job, index, random_hex=None):
    """The name of process group ``index`` of ``job``; ``random_hex`` (8 hex digits with a job,
    16 without) is drawn when not given."""
    part = job_part(job)
    if not part:
        return f"pg-{random_hex or uuid.uuid4().hex[:16]}"
    return f"{part}-pg{index}-{random_hex or uuid.uuid4().hex[:8]}"


def job_of_group_name(group):
    """The job of a group named ``<job>-pg<digits>-<hex>``, else ""."""
    match = _GROUP.fullmatch(group)
    return match.group(1) if match else ""


def bootstrap_record(group, store_address):
    """``NAME|STORE_ADDRESS``."""
    return f"{group}|{store_address}"


def parse_bootstrap_record(record):
    """``(group, store_address)`` of a record (bytes or str); ValueError quoting it when it has no
    '|', an empty name or an empty address."""
    text = record.decode("utf-8", "replace") if isinstance(record, bytes) else record
    group, bar, address = text.partition("|")
    if not bar or not group or not address:
        raise ValueError(f"bad torch bootstrap record {text!r} at {BOOTSTRAP_KEY} "
                         "(want NAME|STORE_ADDRESS)")
    return group, address
