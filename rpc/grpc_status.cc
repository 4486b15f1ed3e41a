#include "rpc/grpc_status.h"

#include <string>

#include "engine/vocabulary/utf8.h"
#include "rpc/error_table.h"
#include "rpc/limits.h"

namespace collectived {

namespace {

constexpr bool CodesAreGrpcs() {
  for (const ErrorKindRow& row : kErrorKindRows)
    if (row.code.number < 0 || row.code.number > grpc::StatusCode::UNAUTHENTICATED) return false;
  return kCodeCancelled.number == grpc::StatusCode::CANCELLED &&
         kCodeInvalidArgument.number == grpc::StatusCode::INVALID_ARGUMENT &&
         kCodeDeadlineExceeded.number == grpc::StatusCode::DEADLINE_EXCEEDED &&
         kCodeNotFound.number == grpc::StatusCode::NOT_FOUND &&
         kCodePermissionDenied.number == grpc::StatusCode::PERMISSION_DENIED &&
         kCodeResourceExhausted.number == grpc::StatusCode::RESOURCE_EXHAUSTED &&
         kCodeFailedPrecondition.number == grpc::StatusCode::FAILED_PRECONDITION &&
         kCodeAborted.number == grpc::StatusCode::ABORTED &&
         kCodeOutOfRange.number == grpc::StatusCode::OUT_OF_RANGE &&
         kCodeInternal.number == grpc::StatusCode::INTERNAL &&
         kCodeUnavailable.number == grpc::StatusCode::UNAVAILABLE &&
         kCodeUnauthenticated.number == grpc::StatusCode::UNAUTHENTICATED;
}
static_assert(CodesAreGrpcs(), "rpc/error_table.h's code numbers are gRPC's");

}  // namespace

grpc::StatusCode GrpcCodeFor(ErrorKind kind) {
  if (kind == ErrorKind::kOk) return grpc::StatusCode::OK;
  const ErrorKindRow* row = ErrorKindRowOf(kind);
  return row ? static_cast<grpc::StatusCode>(row->code.number) : grpc::StatusCode::UNKNOWN;
}

grpc::Status ToGrpcStatus(const Status& status, grpc::ServerContextBase* context) {
  if (status.ok()) return grpc::Status::OK;
  if (context != nullptr) {
    context->AddTrailingMetadata(kErrorKindMetadataKey, std::string(ErrorKindName(status.kind())));
  }
  return grpc::Status(GrpcCodeFor(status.kind()), BoundedMessage(status.message()));
}

std::string BoundedMessage(const std::string& raw) {
  const std::string message = ValidUtf8(raw);
  if (message.size() <= kMaxErrorMessageBytes) return message;
  const std::string tail = " ... (cut: " + std::to_string(message.size()) + " bytes in all)";
  size_t keep = kMaxErrorMessageBytes - tail.size();
  // Cut at a UTF-8 character boundary.
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  return message.substr(0, keep) + tail;
}

Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext* context) {
  if (status.ok()) return Status::Ok();
  if (context != nullptr) {
    const auto& trailers = context->GetServerTrailingMetadata();
    auto it = trailers.find(kErrorKindMetadataKey);
    if (it != trailers.end()) {
      std::string_view name(it->second.data(), it->second.size());
      for (int k = 1; k <= static_cast<int>(kLastErrorKind); ++k) {
        if (ErrorKindName(static_cast<ErrorKind>(k)) == name) {
          return Status(static_cast<ErrorKind>(k), status.error_message());
        }
      }
    }
  }
  for (const CodeFallback& fallback : kCodeFallbacks) {
    if (fallback.code.number != status.error_code()) continue;
    // c10d's timeouts say "Timeout"; a bare DEADLINE_EXCEEDED does not.
    if (fallback.kind == ErrorKind::kTimeout)
      return Status::Timeout("Timeout: " + status.error_message());
    return Status(fallback.kind, status.error_message());
  }
  return Status::Internal(status.error_message());
}

}  // namespace collectived
