#include "engine/vocabulary/status.h"

#include <cstdio>
#include <cstdlib>

namespace collectived {

std::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk:
      return "ok";
    case ErrorKind::kInvalidArgument:
      return "invalid_argument";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kPeerLost:
      return "peer_lost";
    case ErrorKind::kAborted:
      return "aborted";
    case ErrorKind::kDesync:
      return "desync";
    case ErrorKind::kUnavailable:
      return "unavailable";
    case ErrorKind::kInternal:
      return "internal";
    case ErrorKind::kNotFound:
      return "not_found";
    case ErrorKind::kResourceExhausted:
      return "resource_exhausted";
    case ErrorKind::kPermissionDenied:
      return "permission_denied";
    case ErrorKind::kUnauthenticated:
      return "unauthenticated";
  }
  return "unknown";
}

Status::Status(ErrorKind kind, std::string_view message) {
  if (kind != ErrorKind::kOk) {
    state_ = std::make_shared<const State>(State{kind, std::string(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(ErrorKindName(kind())) + ": " + message();
}

namespace internal {
void DieOnBadAccess(const Status& status) {
  std::fprintf(stderr, "collectived: bug: value of a failed StatusOr read: %s\n",
               status.ToString().c_str());
  std::abort();
}
}  // namespace internal

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  return Status(kind(), std::string(prefix) + ": " + message());
}

Status Status::WithContextOnce(std::string_view prefix) const {
  if (ok() || message().find(prefix) != std::string::npos) return *this;
  return WithContext(prefix);
}

}  // namespace collectived
