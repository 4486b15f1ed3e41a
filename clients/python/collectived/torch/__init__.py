"""PyTorch integration of collectived.

Importing this module registers the torch.distributed backend "collectived", so that an
unmodified program runs with ``dist.init_process_group("collectived", ...)`` (any init method:
env://, tcp://, file://). Every rank talks to its local sidecar, found through
``$COLLECTIVED_ADDRESS`` (default: the sidecar's default Unix socket).

Groups carry the job's token when one is set: ``$COLLECTIVED_JOB_TOKEN_FILE`` (a file, e.g. a
mounted Secret), ``$COLLECTIVED_JOB_TOKEN``, or ``set_job_token()``; a rank presenting another
token is refused alone.

``Store`` is a ``torch.distributed.Store`` backed by a collectived sidecar's store.
"""

from collectived.torch.backend import ProcessGroupCollectived, register
from collectived.torch.identity import (current_job_name, current_job_token, set_job_name,
                                        set_job_token)
from collectived.torch.store import Store

register()

__all__ = ["ProcessGroupCollectived", "Store", "current_job_name", "current_job_token", "register",
           "set_job_name", "set_job_token"]
