"""How a client finds its sidecar (same rules as the C++ client and collectivectl)."""

import os

DEFAULT_SOCKET_PATH = "/run/collectived/collectived.sock"
ADDRESS_ENV = "COLLECTIVED_ADDRESS"


def resolve_address(address=None):
    """Returns ``address`` if given, else $COLLECTIVED_ADDRESS, else the default socket."""
    if address:
        return address
    from_env = os.environ.get(ADDRESS_ENV)
    if from_env:
        return from_env
    return "unix://" + DEFAULT_SOCKET_PATH


def to_grpc_target(address):
    """Converts ``unix:///path``, ``unix:/path`` or ``host:port`` into a gRPC target.

    Raises ValueError for anything else.
    """
    if not address:
        raise ValueError("empty sidecar address")
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
