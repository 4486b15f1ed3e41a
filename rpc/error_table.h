// The error kinds on the wire, in one table: for each kind of engine/vocabulary/status.h, the gRPC
// status code a failed call carries and the names the clients give it; and, for a status that comes
// without the kind's trailer (a channel failure, a proxy), which kind each code is read as.
//
// The daemon maps through it (rpc/grpc_status.cc); error_table_export writes it for the
// Python client (collectived/error_table.py) and the Go client (collectived/error_table.go),
// and the ctest error_table_files_are_current fails when a committed file has drifted.
// Header-only and free of gRPC headers, so that the exporter links the engine only: codes are
// gRPC's numbers (grpc_status.cc checks them against grpc::StatusCode).
#pragma once

#include <cstddef>
#include <iterator>
#include <string_view>

#include "engine/vocabulary/status.h"

namespace collectived {

// A gRPC status code: its number, and its names in Python (grpc.StatusCode.X) and Go (codes.X).
struct WireCode {
  int number;
  std::string_view python;  // "INVALID_ARGUMENT"
  std::string_view go;      // "InvalidArgument"
};

inline constexpr WireCode kCodeCancelled{1, "CANCELLED", "Canceled"};
inline constexpr WireCode kCodeInvalidArgument{3, "INVALID_ARGUMENT", "InvalidArgument"};
inline constexpr WireCode kCodeDeadlineExceeded{4, "DEADLINE_EXCEEDED", "DeadlineExceeded"};
inline constexpr WireCode kCodeNotFound{5, "NOT_FOUND", "NotFound"};
inline constexpr WireCode kCodePermissionDenied{7, "PERMISSION_DENIED", "PermissionDenied"};
inline constexpr WireCode kCodeResourceExhausted{8, "RESOURCE_EXHAUSTED", "ResourceExhausted"};
inline constexpr WireCode kCodeFailedPrecondition{9, "FAILED_PRECONDITION", "FailedPrecondition"};
inline constexpr WireCode kCodeAborted{10, "ABORTED", "Aborted"};
inline constexpr WireCode kCodeOutOfRange{11, "OUT_OF_RANGE", "OutOfRange"};
inline constexpr WireCode kCodeInternal{13, "INTERNAL", "Internal"};
inline constexpr WireCode kCodeUnavailable{14, "UNAVAILABLE", "Unavailable"};
inline constexpr WireCode kCodeUnauthenticated{16, "UNAUTHENTICATED", "Unauthenticated"};

struct ErrorKindRow {
  ErrorKind kind;
  WireCode code;                  // what a failed call of this kind carries
  std::string_view camel;         // "PeerLost": Go's KindPeerLost and ErrPeerLost
  std::string_view python_class;  // "PeerLostError" (a CollectivedError)
  std::string_view python_bases;  // Python built-ins it also derives from ("" for none)
  std::string_view doc;           // one line: what it means and what a client does about it
};

// Every kind but kOk, in ErrorKind order.
inline constexpr ErrorKindRow kErrorKindRows[] = {
    {ErrorKind::kInvalidArgument, kCodeInvalidArgument, "InvalidArgument", "InvalidArgumentError",
     "ValueError", "the request is wrong (a bad dtype/op pair, group, range): do not retry"},
    {ErrorKind::kTimeout, kCodeDeadlineExceeded, "Timeout", "TimeoutError", "builtins.TimeoutError",
     "the op or wait passed its deadline"},
    {ErrorKind::kPeerLost, kCodeUnavailable, "PeerLost", "PeerLostError", "",
     "a rank or sidecar of the group went away"},
    {ErrorKind::kAborted, kCodeAborted, "Aborted", "AbortedError", "",
     "the group was aborted, by an operator or because the sidecar stops"},
    {ErrorKind::kDesync, kCodeFailedPrecondition, "Desync", "DesyncError", "",
     "ranks issued different ops at one sequence number"},
    {ErrorKind::kUnavailable, kCodeUnavailable, "Unavailable", "UnavailableError", "",
     "the sidecar, a peer or the store cannot be reached (yet)"},
    {ErrorKind::kInternal, kCodeInternal, "Internal", "InternalError", "",
     "a bug, or a library underneath failed unexpectedly"},
    {ErrorKind::kNotFound, kCodeNotFound, "NotFound", "NotFoundError", "",
     "a named key, group, buffer or op does not exist"},
    {ErrorKind::kResourceExhausted, kCodeResourceExhausted, "ResourceExhausted",
     "ResourceExhaustedError", "",
     "a share or ceiling of the sidecar was reached: ask less or later"},
    {ErrorKind::kPermissionDenied, kCodePermissionDenied, "PermissionDenied",
     "PermissionDeniedError", "",
     "the caller may not do this (a wrong job token, another connection's session, no admin)"},
    {ErrorKind::kUnauthenticated, kCodeUnauthenticated, "Unauthenticated", "UnauthenticatedError",
     "", "the caller presented no credential, or one that is not valid"},
};

// How a status without the kind's trailer is read; any other code is kInternal.
struct CodeFallback {
  WireCode code;
  ErrorKind kind;
};

inline constexpr CodeFallback kCodeFallbacks[] = {
    {kCodeInvalidArgument, ErrorKind::kInvalidArgument},
    {kCodeOutOfRange, ErrorKind::kInvalidArgument},
    {kCodeDeadlineExceeded, ErrorKind::kTimeout},
    {kCodeUnavailable, ErrorKind::kUnavailable},
    {kCodeAborted, ErrorKind::kAborted},
    {kCodeCancelled, ErrorKind::kAborted},
    {kCodeNotFound, ErrorKind::kNotFound},
    {kCodeFailedPrecondition, ErrorKind::kDesync},
    {kCodeResourceExhausted, ErrorKind::kResourceExhausted},
    {kCodePermissionDenied, ErrorKind::kPermissionDenied},
    {kCodeUnauthenticated, ErrorKind::kUnauthenticated},
};

constexpr bool RowsFollowErrorKinds() {
  if (std::size(kErrorKindRows) != static_cast<size_t>(kLastErrorKind)) return false;
  for (size_t i = 0; i < std::size(kErrorKindRows); ++i)
    if (kErrorKindRows[i].kind != static_cast<ErrorKind>(i + 1)) return false;
  return true;
}
static_assert(RowsFollowErrorKinds(), "one row per error kind but kOk, in ErrorKind order");

// The row of `kind`; nullptr for kOk.
constexpr const ErrorKindRow* ErrorKindRowOf(ErrorKind kind) {
  for (const ErrorKindRow& row : kErrorKindRows)
    if (row.kind == kind) return &row;
  return nullptr;
}

}  // namespace collectived
