// Status: the single error model of collectived, carried by value from the engine through
// Work objects to the gRPC services (mapped once to status codes) and the clients.
//
// A Status is either OK or carries an ErrorKind and a message. Messages are written for
// people: they name the group, the op and its sequence number, and the rank involved.
//
// Thread-safety: a Status is an immutable value; copies may be used from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace collectived {

// The kinds of failure a caller can act on differently. Keep in sync with
// proto/collectived/v1/common.proto (ErrorKind) and the Python exception mapping.
enum class ErrorKind {
  kOk = 0,
  kInvalidArgument = 1,    // the request is wrong: bad dtype/op pair, unknown group, bad range
  kTimeout = 2,            // a deadline passed before the operation completed
  kPeerLost = 3,           // a rank or sidecar of the group went away
  kAborted = 4,            // the group was aborted (by an operator or by shutdown)
  kDesync = 5,             // ranks issued different ops for the same sequence number
  kUnavailable = 6,        // a dependency (store, peer sidecar) cannot be reached yet
  kInternal = 7,           // a bug or an unexpected failure of a library underneath
  kNotFound = 8,           // a named thing (key, group, buffer) does not exist
  kResourceExhausted = 9,  // a quota or bound of the sidecar was reached (retry later or ask less)
  kPermissionDenied = 10,  // the caller is known but may not do this (wrong job token, no admin)
  kUnauthenticated = 11,   // the caller presented no credential, or one that is not valid
};

// The last kind: kinds are numbered densely from kOk.
inline constexpr ErrorKind kLastErrorKind = ErrorKind::kUnauthenticated;

// Lower-case name of `kind` ("invalid_argument", "timeout", ...), as used in metric labels.
std::string_view ErrorKindName(ErrorKind kind);

class [[nodiscard]] Status {
 public:
  // Creates an OK status.
  Status() = default;

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string_view message) {
    return Status(ErrorKind::kInvalidArgument, message);
  }
  static Status Timeout(std::string_view message) { return Status(ErrorKind::kTimeout, message); }
  static Status PeerLost(std::string_view message) { return Status(ErrorKind::kPeerLost, message); }
  static Status Aborted(std::string_view message) { return Status(ErrorKind::kAborted, message); }
  static Status Desync(std::string_view message) { return Status(ErrorKind::kDesync, message); }
  static Status Unavailable(std::string_view message) {
    return Status(ErrorKind::kUnavailable, message);
  }
  static Status Internal(std::string_view message) { return Status(ErrorKind::kInternal, message); }
  static Status NotFound(std::string_view message) { return Status(ErrorKind::kNotFound, message); }
  static Status ResourceExhausted(std::string_view message) {
    return Status(ErrorKind::kResourceExhausted, message);
  }
  static Status PermissionDenied(std::string_view message) {
    return Status(ErrorKind::kPermissionDenied, message);
  }
  static Status Unauthenticated(std::string_view message) {
    return Status(ErrorKind::kUnauthenticated, message);
  }

  Status(ErrorKind kind, std::string_view message);

  bool ok() const { return state_ == nullptr; }
  ErrorKind kind() const { return state_ ? state_->kind : ErrorKind::kOk; }
  // Empty for OK.
  const std::string& message() const;

  bool IsTimeout() const { return kind() == ErrorKind::kTimeout; }
  bool IsInvalidArgument() const { return kind() == ErrorKind::kInvalidArgument; }
  bool IsNotFound() const { return kind() == ErrorKind::kNotFound; }

  // "OK", or "<kind>: <message>" for logs.
  std::string ToString() const;

  // Returns a status of the same kind whose message is "<prefix>: <message>".
  Status WithContext(std::string_view prefix) const;
  // Like WithContext, unless the message already contains `prefix` (a status annotated on its
  // way through several layers names the op once).
  Status WithContextOnce(std::string_view prefix) const;

 private:
  struct State {
    ErrorKind kind;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null means OK; shared so copies are cheap
};

namespace internal {
[[noreturn]] void DieOnBadAccess(const Status& status);
}  // namespace internal

// Either a value or an error. Reading the value of an error is a bug and aborts the process
// with the error's message (it never yields a made-up value).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok())
      status_ = Status::Internal("StatusOr built from an OK status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return Checked(); }
  const T& value() const& { return const_cast<StatusOr*>(this)->Checked(); }
  T&& value() && { return std::move(Checked()); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &const_cast<StatusOr*>(this)->Checked(); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return const_cast<StatusOr*>(this)->Checked(); }
  T&& operator*() && { return std::move(Checked()); }

 private:
  T& Checked() {
    if (!value_) internal::DieOnBadAccess(status_);
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace collectived

// Returns early from the enclosing function when `expr` yields a non-OK Status.
#define COLLECTIVED_RETURN_IF_ERROR(expr)   \
  do {                                      \
    ::collectived::Status _status = (expr); \
    if (!_status.ok()) return _status;      \
  } while (0)

// Declares `lhs` (e.g. `std::byte* scratch`) from the value of the StatusOr `expr`, returning
// its error from the enclosing function instead when it has one.
#define COLLECTIVED_ASSIGN_OR_RETURN(lhs, expr) \
  COLLECTIVED_ASSIGN_OR_RETURN_IMPL(COLLECTIVED_CONCAT(_status_or_, __LINE__), lhs, expr)
#define COLLECTIVED_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return tmp.status();                     \
  lhs = std::move(*tmp)
#define COLLECTIVED_CONCAT(a, b) COLLECTIVED_CONCAT_IMPL(a, b)
#define COLLECTIVED_CONCAT_IMPL(a, b) a##b
