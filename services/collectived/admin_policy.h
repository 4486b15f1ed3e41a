// AdminPolicy: who may use the Admin service.
//
// Reading (GetInfo, ListGroups, DescribeGroup, GetFlightRecorder) is open to local clients of
// the Unix socket (the socket's permissions decide who those are), to TCP callers with a client
// certificate that TLS verified (any name), and — when the TCP listener has no TLS (insecure
// mode) — to anyone who reaches the listener.
//
// Changing something (AbortGroup, and every mutating call added later: each calls
// AuthorizeChange) needs one of these credentials, on either listener:
//   (a) the admin token, presented as metadata "authorization: Bearer <token>"; the token is the
//       trimmed content of --admin-token-file, re-read whenever the file changes (Kubernetes
//       rotates mounted Secrets in place), so a rotated-out token stops working at once;
//   (b) over TCP, a TLS-verified client certificate carrying one of the --admin-names;
//   (c) the job token of the group the call acts on, presented as metadata
//       "collectived-job-token: <token>", so that a job may abort itself.
// No credential is UNAUTHENTICATED, with a message listing what would be accepted; a wrong one
// is PERMISSION_DENIED, saying which credential was wrong. Secrets are compared in constant
// time and never appear in a message or a log line.
//
// Thread-safety: an AdminPolicy may be used from any thread.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

// Metadata keys of the credentials (gRPC metadata keys are lowercase).
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kJobTokenMetadataKey[] = "collectived-job-token";

// Checks a job token against the live group `group`: Ok when it is the group's, PermissionDenied
// when it is not, NotFound for an unknown group (Sidecar::CheckGroupToken).
using GroupTokenCheck = std::function<Status(const std::string& group, const std::string& token)>;

struct AdminPolicyOptions {
  // The file holding the admin token; empty: no admin token is accepted.
  std::string token_file;
  // Client-certificate names that are admins over TCP with TLS.
  std::vector<std::string> admin_names;
  // Checks job tokens; null: job tokens are not accepted.
  GroupTokenCheck check_group_token;
};

class AdminPolicy {
 public:
  // Reads the token file once, so that a daemon with a missing or empty token file refuses to
  // start. InvalidArgument naming --admin-token-file if it cannot be read or is empty.
  static StatusOr<std::unique_ptr<AdminPolicy>> Create(AdminPolicyOptions options);

  // Whether the caller of `context` may read through Admin `method` (see the header comment).
  // Ok, or Unauthenticated naming what is missing (a TCP caller over TLS without a verified
  // client certificate).
  Status AuthorizeRead(const grpc::ServerContext& context, std::string_view method) const;

  // Whether the caller of `context` may call the mutating Admin `method` on `group`. Returns
  // Ok naming nothing; Unauthenticated when no credential was presented; PermissionDenied when
  // every credential presented was wrong (which one is said, never its value); NotFound for a
  // job token naming an unknown group. `how` (may be null) receives which credential was
  // accepted ("admin token", "admin certificate <name>", "job token"), for the log.
  Status AuthorizeChange(const grpc::ServerContext& context, std::string_view method,
                         const std::string& group, std::string* how) const;

 private:
  explicit AdminPolicy(AdminPolicyOptions options) : options_(std::move(options)) {}

  // The current admin token: the file is re-read when its identity, size or modification time
  // changed since the last read. Empty when there is none (no file configured, or the file is
  // now unreadable or empty: then `why` says so).
  std::string CurrentToken(std::string* why) const;

  const AdminPolicyOptions options_;

  // What the token file held when last read, and how to tell it changed.
  struct FileState {
    dev_t device = 0;
    ino_t inode = 0;
    off_t size = -1;
    timespec modified{};
  };
  mutable std::mutex mutex_;
  mutable FileState file_;            // guarded by mutex_
  mutable std::string token_;         // guarded by mutex_
  mutable std::string token_why_;     // guarded by mutex_: why token_ is empty
  mutable bool read_before_ = false;  // guarded by mutex_
};

}  // namespace collectived
