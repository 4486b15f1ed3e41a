#include "rpc/grpc_status.h"

#include <string>

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

namespace {

// Length of the well-formed UTF-8 character at the start of `text` (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or 0 if there is none.
size_t Utf8CharLength(std::string_view text) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  auto continuation = [&](size_t i, unsigned char low = 0x80, unsigned char high = 0xBF) {
    return i < text.size() && byte(i) >= low && byte(i) <= high;
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;
    return continuation(1, low, high) && continuation(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;
    return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string ValidUtf8(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8CharLength(text.substr(i));
    if (length > 0) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      const auto byte = static_cast<unsigned char>(text[i++]);
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xF]};
    }
  }
  return out;
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
    default:
      return Status::Internal(status.error_message());
  }
}

}  // namespace collectived
