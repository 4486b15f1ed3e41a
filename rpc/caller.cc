#include "rpc/caller.h"

#include <algorithm>

namespace collectived {
namespace {

void AppendProperty(const grpc::AuthContext& auth, const char* name,
                    std::vector<std::string>* out) {
  for (const grpc::string_ref& value : auth.FindPropertyValues(name)) {
    std::string text(value.data(), value.size());
    if (!text.empty() && std::find(out->begin(), out->end(), text) == out->end()) {
      out->push_back(std::move(text));
    }
  }
}

}  // namespace

Caller IdentifyCaller(const grpc::ServerContextBase& context) {
  Caller caller;
  caller.peer = context.peer();
  // "fd:<n>": a connection collectived accepted on its Unix socket and handed to gRPC.
  caller.local = caller.peer.rfind("unix:", 0) == 0 || caller.peer.rfind("fd:", 0) == 0;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (!caller.local && auth && auth->IsPeerAuthenticated()) {
    // gRPC's TLS server sets the peer identity only after verifying the chain against the CA.
    caller.tls_verified = true;
    AppendProperty(*auth, "x509_subject_alternative_name", &caller.names);
    AppendProperty(*auth, "x509_common_name", &caller.names);
  }
  return caller;
}

const std::string* Caller::FindName(const std::vector<std::string>& allowed) const {
  for (const std::string& name : names) {
    if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) return &name;
  }
  return nullptr;
}

std::string Caller::Describe() const {
  if (local) return "unix socket";
  std::string address = peer;
  if (address.rfind("ipv4:", 0) == 0 || address.rfind("ipv6:", 0) == 0) address = peer.substr(5);
  if (!tls_verified) return "tcp " + address + " (no client certificate)";
  return "tcp " + address + " as " + (names.empty() ? std::string("?") : names.front());
}

}  // namespace collectived
