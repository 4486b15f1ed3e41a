"""Who a torch process group belongs to: the job's token, which every rank of a job presents
(a rank with another is refused alone), the job's name, which names the group's sidecar
groups in metrics, logs and ``collectivectl describe``, and what the job's groups do when they
lose a rank. torch 1.13 hands a third-party backend no init options, so these calls and the
environment are how they reach the backend."""

import os

from collectived import environment

_job_token = None
_job_name = None


def set_job_token(token):
    """Sets the job token of the groups this process creates from now on (``None``: take it from
    the environment again). Every rank of a job must present the same token; a rank with another
    one is refused (``PermissionDeniedError``). torch 1.13 hands a third-party backend no init
    options, so this call and the environment are how the token reaches the backend."""
    global _job_token
    _job_token = token


def current_job_token():
    """The job token for new groups: set_job_token's, else the content of the file named by
    ``$COLLECTIVED_JOB_TOKEN_FILE`` (a Kubernetes Secret mounted as a file; re-read for every
    group, so a rotated Secret applies to the next group), else ``$COLLECTIVED_JOB_TOKEN``,
    else none. Surrounding whitespace is ignored."""
    if _job_token is not None:
        return _job_token
    path = environment.get("COLLECTIVED_JOB_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as token_file:
                return token_file.read().strip()
        except OSError as error:
            raise RuntimeError(f"collectived: cannot read the job token file named by "
                               f"COLLECTIVED_JOB_TOKEN_FILE ({path}): {error.strerror}") from None
    return environment.get("COLLECTIVED_JOB_TOKEN", "").strip()


def set_job_name(name):
    """Names the groups this process creates from now on after ``name`` (``None``: take it from
    the environment again), so that metrics, logs and ``collectivectl describe`` tie them to the
    job. Only the job's rank 0 names a group; the others learn the name from it."""
    global _job_name
    _job_name = name


def current_job_name():
    """set_job_name's, else ``$COLLECTIVED_JOB_NAME``, else torchrun's ``$TORCHELASTIC_RUN_ID``
    (unless it is torchrun's default "none"), else "" (the groups are then named ``pg-<hex>``)."""
    if _job_name is not None:
        return _job_name
    for value in (environment.get("COLLECTIVED_JOB_NAME", ""),
                  os.environ.get("TORCHELASTIC_RUN_ID", "")):
        value = value.strip()
        if value and value != "none":
            return value
    return ""


def current_fault_tolerance():
    """What the job's groups do when they lose a rank, from the environment, as (mode, minimum):
    ``$COLLECTIVED_FAULT_TOLERANCE`` "fail-fast" (the default: a lost rank fails every op) or
    "shrink" (the group goes on among its live ranks; docs/fault-tolerance.md), and
    ``$COLLECTIVED_FAULT_TOLERANCE_MIN_RANKS`` (default 1), below which a shrinking group fails.
    Every rank of a job must ask for the same."""
    mode = environment.get("COLLECTIVED_FAULT_TOLERANCE", "").strip() or "fail-fast"
    if mode not in ("fail-fast", "shrink"):
        raise ValueError(f"collectived: COLLECTIVED_FAULT_TOLERANCE={mode!r} is not "
                         f"'fail-fast' or 'shrink'")
    minimum = environment.get("COLLECTIVED_FAULT_TOLERANCE_MIN_RANKS", "").strip() or "1"
    try:
        min_ranks = int(minimum)
    except ValueError:
        raise ValueError(f"collectived: COLLECTIVED_FAULT_TOLERANCE_MIN_RANKS={minimum!r} is "
                         f"not a number") from None
    return mode, min_ranks
