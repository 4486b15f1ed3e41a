#include "rpc/grpc_status.h"

#include <string>

#include "engine/utf8.h"
#include "rpc/limits.h"

namespace collectived {

grpc::StatusCode GrpcCodeFor(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk:
      return grpc::StatusCode::OK;
    case ErrorKind::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case ErrorKind::kTimeout:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case ErrorKind::kPeerLost:
    case ErrorKind::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case ErrorKind::kAborted:
      return grpc::StatusCode::ABORTED;
    case ErrorKind::kDesync:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case ErrorKind::kInternal:
      return grpc::StatusCode::INTERNAL;
    case ErrorKind::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case ErrorKind::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case ErrorKind::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case ErrorKind::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
  }
  return grpc::StatusCode::UNKNOWN;
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
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return Status::InvalidArgument(status.error_message());
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Status::Timeout("Timeout: " + status.error_message());
    case grpc::StatusCode::UNAVAILABLE:
      return Status::Unavailable(status.error_message());
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
      return Status::Aborted(status.error_message());
    case grpc::StatusCode::NOT_FOUND:
      return Status::NotFound(status.error_message());
    case grpc::StatusCode::FAILED_PRECONDITION:
      return Status::Desync(status.error_message());
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return Status::ResourceExhausted(status.error_message());
    case grpc::StatusCode::PERMISSION_DENIED:
      return Status::PermissionDenied(status.error_message());
    case grpc::StatusCode::UNAUTHENTICATED:
      return Status::Unauthenticated(status.error_message());
    default:
      return Status::Internal(status.error_message());
  }
}

}  // namespace collectived
