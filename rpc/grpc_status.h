// The one place where the engine's Status becomes a gRPC status (and back, for clients of
// peers). The error kind also travels as trailing metadata "collectived-error-kind".
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

#include "engine/vocabulary/status.h"
#include "engine/vocabulary/utf8.h"  // ValidUtf8, used on every message sent

namespace collectived {

inline constexpr char kErrorKindMetadataKey[] = "collectived-error-kind";

// The code of `kind` in rpc/error_table.h (OK for kOk).
grpc::StatusCode GrpcCodeFor(ErrorKind kind);

// Converts `status`; when `context` is given, also attaches the error kind as trailing metadata.
// The message is made valid UTF-8 and cut to kMaxErrorMessageBytes (BoundedMessage).
grpc::Status ToGrpcStatus(const Status& status, grpc::ServerContextBase* context = nullptr);

// ValidUtf8(message) if it fits in kMaxErrorMessageBytes, else its beginning (cut at a UTF-8
// character boundary) followed by " ... (cut: N bytes in all)", kMaxErrorMessageBytes long at
// most.
std::string BoundedMessage(const std::string& message);

// Converts a gRPC status received by a client into an engine Status, using the kind from the
// trailing metadata of `context` when present, else the code's fallback in rpc/error_table.h.
Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext* context = nullptr);

}  // namespace collectived
