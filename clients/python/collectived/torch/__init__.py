"""PyTorch integration of collectived.

Importing this module registers the torch.distributed backend "collectived", so that an
unmodified program runs with ``dist.init_process_group("collectived", ...)`` (any init method:
env://, tcp://, file://). Every rank talks to its local sidecar, found through
``$COLLECTIVED_ADDRESS`` (default: the sidecar's default Unix socket).

``Store`` is a ``torch.distributed.Store`` backed by a collectived sidecar's store.
"""

from collectived.torch.backend import ProcessGroupCollectived, register
from collectived.torch.store import Store

register()

__all__ = ["ProcessGroupCollectived", "Store", "register"]
