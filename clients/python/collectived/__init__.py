"""collectived: collective communication as a service.

The Python client of the collectived sidecar: sessions, shared-memory tensors, groups and every
collective (``Client``), the rendezvous store (``StoreClient``) and, in ``collectived.torch``,
the ``torch.distributed`` backend "collectived" and a ``torch.distributed.Store`` backed by a
sidecar's store. The sidecar is found through
an explicit address, else ``$COLLECTIVED_ADDRESS``, else the default Unix socket; over TCP,
TLS settings come from ``TlsOptions`` or ``$COLLECTIVED_TLS_*`` (``collectived.channel``).
"""

from collectived.address import DEFAULT_SOCKET_PATH, resolve_address, to_grpc_target
from collectived.channel import TlsOptions, open_channel
from collectived.errors import (
    AbortedError,
    CollectivedError,
    DesyncError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    PermissionDeniedError,
    UnauthenticatedError,
    PeerLostError,
    TimeoutError,
    UnavailableError,
)
from collectived.client import Buffer, Client, Work
from collectived.store import StoreClient

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "AbortedError",
    "Buffer",
    "Client",
    "Work",
    "CollectivedError",
    "DesyncError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "PeerLostError",
    "StoreClient",
    "TimeoutError",
    "TlsOptions",
    "UnavailableError",
    "open_channel",
    "resolve_address",
    "to_grpc_target",
]
