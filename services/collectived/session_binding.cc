#include "services/collectived/session_binding.h"

#include "rpc/caller.h"

namespace collectived {

std::string SessionBinding(const grpc::ServerContext& context) {
  const Caller caller = IdentifyCaller(context);
  if (caller.local) return std::string(kUnixBinding);
  std::string binding = "tcp " + caller.peer;
  if (caller.tls_verified) {
    binding += " as";
    for (const std::string& name : caller.names) binding += " " + name;
  }
  return binding;
}

}  // namespace collectived
