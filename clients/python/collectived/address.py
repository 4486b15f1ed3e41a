"""How a client finds its sidecar (same rules as the C++ client and collectivectl)."""

import os

from collectived import environment

DEFAULT_SOCKET_PATH = "/run/collectived/collectived.sock"
ADDRESS_ENV = "COLLECTIVED_ADDRESS"
# On nodes that run one sidecar per GPU, one setting serves every trainer of the node:
# COLLECTIVED_ADDRESS=unix:///run/collectived/gpu{local_rank}.sock ($LOCAL_RANK, torchrun's).
LOCAL_RANK_PLACEHOLDER = "{local_rank}"


def _with_local_rank(address):
    local_rank = os.environ.get("LOCAL_RANK", "")
    if local_rank.isdigit() and len(local_rank) <= 9:
        return address.replace(LOCAL_RANK_PLACEHOLDER, local_rank)
    return address


def resolve_address(address=None):
    """Returns ``address`` if given, else $COLLECTIVED_ADDRESS, else the default socket, with
    ``{local_rank}`` replaced by $LOCAL_RANK (left for to_grpc_target to refuse when unset)."""
    if address:
        return _with_local_rank(address)
    from_env = environment.get(ADDRESS_ENV)
    if from_env:
        return _with_local_rank(from_env)
    return "unix://" + DEFAULT_SOCKET_PATH


def to_grpc_target(address):
    """Converts ``unix:///path``, ``unix:/path`` or ``host:port`` into a gRPC target.

    Raises ValueError for anything else.
    """
    if not address:
        raise ValueError("empty sidecar address")
    if LOCAL_RANK_PLACEHOLDER in address:
        raise ValueError(
            f"sidecar address {address!r} names {LOCAL_RANK_PLACEHOLDER} but $LOCAL_RANK is not "
            "set to a number (one sidecar per GPU: set LOCAL_RANK, as torchrun does)")
    if address.startswith("unix://"):
        path = address[len("unix://"):]
    elif address.startswith("unix:"):
        path = address[len("unix:"):]
    else:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(
                f"sidecar address {address!r} is neither unix:///path nor host:port")
        return address
    if not path.startswith("/"):
        raise ValueError(f"sidecar address {address!r} needs an absolute socket path")
    return "unix:" + path
