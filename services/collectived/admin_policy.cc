#include "services/collectived/admin_policy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/group/rendezvous/job_token.h"  // ConstantTimeEquals
#include "engine/vocabulary/logging.h"
#include "rpc/caller.h"

namespace collectived {
namespace {

constexpr char kBearer[] = "Bearer ";

std::string Trim(const std::string& text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// The values of metadata `key` sent by the client.
std::vector<std::string> MetadataValues(const grpc::ServerContext& context, std::string_view key) {
  std::vector<std::string> values;
  const auto& metadata = context.client_metadata();
  auto range = metadata.equal_range(grpc::string_ref(key.data(), key.size()));
  for (auto it = range.first; it != range.second; ++it)
    values.emplace_back(it->second.data(), it->second.size());
  return values;
}

// Whether the call came over a TLS connection (verified client certificate or not). gRPC's
// auth context says "ssl" there and "insecure" for the insecure credentials.
bool OverTls(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (!auth) return false;
  for (const grpc::string_ref& type : auth->FindPropertyValues("transport_security_type")) {
    const std::string_view value(type.data(), type.size());
    if (value == "ssl" || value == "tls") return true;
  }
  return false;
}

std::string AcceptedCredentials(std::string_view method) {
  return std::string(method) +
         " needs an admin credential: the admin token as 'authorization: Bearer ...', an admin "
         "client certificate (--admin-names), or the group's job token as "
         "'collectived-job-token: ...'";
}

bool SameFile(const struct stat& info, const dev_t device, const ino_t inode, const off_t size,
              const timespec& modified) {
  return info.st_dev == device && info.st_ino == inode && info.st_size == size &&
         info.st_mtim.tv_sec == modified.tv_sec && info.st_mtim.tv_nsec == modified.tv_nsec;
}

}  // namespace

StatusOr<std::unique_ptr<AdminPolicy>> AdminPolicy::Create(AdminPolicyOptions options) {
  std::unique_ptr<AdminPolicy> policy(new AdminPolicy(std::move(options)));
  if (!policy->options_.token_file.empty()) {
    std::string why;
    if (policy->CurrentToken(&why).empty()) {
      return Status::InvalidArgument("--admin-token-file " + policy->options_.token_file + ": " +
                                     why);
    }
  }
  return policy;
}

std::string AdminPolicy::CurrentToken(std::string* why) const {
  const std::string& path = options_.token_file;
  std::lock_guard<std::mutex> lock(mutex_);
  if (path.empty()) {
    *why = "this sidecar has no admin token (--admin-token-file)";
    return "";
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    token_.clear();
    file_ = FileState{};
    *why = "the admin token file " + path + " cannot be read: " + std::strerror(errno);
    return "";
  }
  if (file_.size >= 0 && SameFile(info, file_.device, file_.inode, file_.size, file_.modified)) {
    *why = token_why_;
    return token_;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  if (!in) {
    token_.clear();
    file_ = FileState{};
    *why = token_why_ = "the admin token file " + path + " cannot be read";
    return "";
  }
  token_ = Trim(content.str());
  file_ = FileState{info.st_dev, info.st_ino, info.st_size, info.st_mtim};
  token_why_ = token_.empty() ? "the admin token file " + path + " is empty" : "";
  if (read_before_) LogInfo("admin token file changed: re-read", {{"file", path}});
  read_before_ = true;
  *why = token_why_;
  return token_;
}

Status AdminPolicy::AuthorizeRead(const grpc::ServerContext& context,
                                  std::string_view method) const {
  const Caller caller = IdentifyCaller(context);
  if (caller.local || caller.tls_verified || !OverTls(context)) return Status::Ok();
  return Status::Unauthenticated(
      std::string(method) +
      " over TCP with TLS needs a client certificate that this sidecar's CA "
      "verified; none was presented (local clients may read through the "
      "Unix socket)");
}

Status AdminPolicy::AuthorizeChange(const grpc::ServerContext& context, std::string_view method,
                                    const std::string& group, std::string* how) const {
  const Caller caller = IdentifyCaller(context);
  std::vector<std::string> wrong;  // what was presented and refused, without values

  // (a) The admin token.
  for (const std::string& value : MetadataValues(context, kAuthorizationMetadataKey)) {
    if (value.rfind(kBearer, 0) != 0) {
      wrong.push_back("the 'authorization' metadata is not 'Bearer <token>'");
      continue;
    }
    const std::string presented = Trim(value.substr(sizeof(kBearer) - 1));
    std::string why;
    const std::string token = CurrentToken(&why);
    if (token.empty()) {
      wrong.push_back("an admin token was presented but " + why);
    } else if (!presented.empty() && ConstantTimeEquals(presented, token)) {
      if (how) *how = "admin token";
      return Status::Ok();
    } else {
      wrong.push_back("the admin token presented is not this sidecar's");
    }
  }

  // (b) An admin client certificate.
  if (caller.tls_verified) {
    if (const std::string* admin = caller.FindName(options_.admin_names)) {
      if (how) *how = "admin certificate " + *admin;
      return Status::Ok();
    }
    wrong.push_back("the client certificate (" +
                    (caller.names.empty() ? std::string("no name") : caller.names.front()) +
                    ") carries no admin name (--admin-names)");
  }

  // (c) The group's own job token.
  for (const std::string& value : MetadataValues(context, kJobTokenMetadataKey)) {
    const std::string presented = Trim(value);
    if (presented.empty() || !options_.check_group_token) {
      wrong.push_back(presented.empty()
                          ? "the job token presented is empty"
                          : "this sidecar does not accept job tokens for " + std::string(method));
      continue;
    }
    Status checked = options_.check_group_token(group, presented);
    if (checked.ok()) {
      if (how) *how = "job token";
      return Status::Ok();
    }
    if (checked.kind() == ErrorKind::kNotFound) return checked;
    wrong.push_back(checked.message());  // which group, never the token
  }

  if (wrong.empty()) {
    return Status::Unauthenticated(AcceptedCredentials(method) + "; none was presented");
  }
  std::string message = std::string(method) + " refused: ";
  for (size_t i = 0; i < wrong.size(); ++i) message += (i ? "; " : "") + wrong[i];
  return Status::PermissionDenied(message + " (" + AcceptedCredentials(method) + ")");
}

}  // namespace collectived
