"""The Python side of collectived's error model: one exception class per error kind.

Every class derives from RuntimeError (what c10d raises); InvalidArgumentError also derives
from ValueError, as c10d raises ValueError for bad arguments.
"""

import builtins

import grpc

ERROR_KIND_METADATA_KEY = "collectived-error-kind"


class CollectivedError(RuntimeError):
    """An error reported by a collectived sidecar; ``kind`` is its error kind name."""

    kind = "internal"


class InvalidArgumentError(CollectivedError, ValueError):
    kind = "invalid_argument"


class TimeoutError(CollectivedError, builtins.TimeoutError):  # noqa: A001 - mirrors the kind
    kind = "timeout"


class PeerLostError(CollectivedError):
    kind = "peer_lost"


class AbortedError(CollectivedError):
    kind = "aborted"


class DesyncError(CollectivedError):
    kind = "desync"


class UnavailableError(CollectivedError):
    kind = "unavailable"


class InternalError(CollectivedError):
    kind = "internal"


class NotFoundError(CollectivedError):
    kind = "not_found"


class ResourceExhaustedError(CollectivedError):
    """A quota or bound of the sidecar was reached (per session, per store)."""

    kind = "resource_exhausted"


class PermissionDeniedError(CollectivedError):
    """The caller may not do this: a wrong job token, a session of another connection, an admin
    action without an admin credential."""

    kind = "permission_denied"


class UnauthenticatedError(CollectivedError):
    """The caller presented no credential, or one that is not valid."""

    kind = "unauthenticated"


_BY_KIND = {cls.kind: cls for cls in (InvalidArgumentError, TimeoutError, PeerLostError,
                                      AbortedError, DesyncError, UnavailableError,
                                      InternalError, NotFoundError,
                                      ResourceExhaustedError, PermissionDeniedError,
                                      UnauthenticatedError)}

_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TimeoutError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.CANCELLED: AbortedError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: DesyncError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def error_class(kind):
    """The class of error kind ``kind`` ("peer_lost", "timeout", ...; engine/status.h's names)."""
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
