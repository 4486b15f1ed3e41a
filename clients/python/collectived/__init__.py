"""collectived: collective communication as a service.

The Python client of the collectived sidecar: the rendezvous store (``StoreClient``) and, in
``collectived.torch``, a ``torch.distributed.Store`` backed by it. The sidecar is found through
an explicit address, else ``$COLLECTIVED_ADDRESS``, else the default Unix socket.
"""

from collectived.address import DEFAULT_SOCKET_PATH, resolve_address, to_grpc_target
from collectived.errors import (
    AbortedError,
    CollectivedError,
    DesyncError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PeerLostError,
    TimeoutError,
    UnavailableError,
)
from collectived.store import StoreClient

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "AbortedError",
    "CollectivedError",
    "DesyncError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PeerLostError",
    "StoreClient",
    "TimeoutError",
    "UnavailableError",
    "resolve_address",
    "to_grpc_target",
]
