#include "services/collectived/session_binding.h"

#include "rpc/caller.h"
#include "services/collectived/unix_connections.h"

namespace collectived {

std::string SessionBinding(const grpc::ServerContext& context) {
  const Caller caller = IdentifyCaller(context);
  if (caller.local) {
    std::optional<UnixConnections::Connection> connection =
        UnixConnections::Instance().Find(caller.peer);
    if (!connection) return std::string(kUnixBinding);
    return "unix " + caller.peer + "#" + std::to_string(connection->generation) + " pid " +
           std::to_string(connection->peer.pid) + " uid " + std::to_string(connection->peer.uid);
  }
  std::string binding = "tcp " + caller.peer;
  if (caller.tls_verified) {
    binding += " as";
    for (const std::string& name : caller.names) binding += " " + name;
  }
  return binding;
}

}  // namespace collectived
