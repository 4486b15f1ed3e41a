"""The Python side of collectived's error model: one exception class per error kind.

The classes and the gRPC codes are generated from rpc/error_table.h (error_table.py). Every
class derives from RuntimeError (what c10d raises); InvalidArgumentError also derives from
ValueError, as c10d raises ValueError for bad arguments, and TimeoutError from the built-in one.
"""

import grpc

from collectived.error_table import (  # noqa: F401 - the public classes live here
    BY_KIND as _BY_KIND, CODE_FALLBACKS, AbortedError, CollectivedError, DesyncError,
    InternalError, InvalidArgumentError, NotFoundError, PeerLostError, PermissionDeniedError,
    ResourceExhaustedError, TimeoutError, UnauthenticatedError, UnavailableError)

ERROR_KIND_METADATA_KEY = "collectived-error-kind"

_BY_CODE = {getattr(grpc.StatusCode, name): cls for name, cls in CODE_FALLBACKS.items()}


def error_class(kind):
    """The class of error kind ``kind`` ("peer_lost", "timeout", ...; engine/vocabulary/status.h's names)."""
    return _BY_KIND.get(kind, CollectivedError)


def error_from_proto(error, what=""):
    """The CollectivedError for an ``Error`` message (kind and message), or None for OK."""
    if error.kind == 0:  # OK: every successful op's completion comes this way
        return None
    from collectived.v1 import common_pb2  # generated next to this package by the build
    name = common_pb2.ErrorKind.Name(error.kind) if error.kind in \
        common_pb2.ErrorKind.values() else "INTERNAL"
    cls = _BY_KIND.get(name.lower(), CollectivedError)
    return cls(f"{what}: {error.message}" if what else error.message)


def from_rpc_error(error, what=""):
    """Converts a grpc.RpcError into the matching CollectivedError (the sidecar's message)."""
    kind = None
    try:
        for key, value in error.trailing_metadata() or ():
            if key == ERROR_KIND_METADATA_KEY:
                kind = value
    except Exception:  # pragma: no cover - a channel-level error has no metadata
        pass
    cls = _BY_KIND.get(kind) or _BY_CODE.get(error.code(), InternalError)
    message = error.details() or str(error.code())
    if cls is TimeoutError and "Timeout" not in message:
        message = "Timeout: " + message
    if what:
        message = f"{what}: {message}"
    return cls(message)
