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

std::string ClientIdentity(const grpc::ServerContext& context) {
  const Caller caller = IdentifyCaller(context);
  if (caller.local) {
    std::optional<UnixConnections::Connection> connection =
        UnixConnections::Instance().Find(caller.peer);
    if (!connection || connection->peer.pid == 0) return {};
    return "pid " + std::to_string(connection->peer.pid) + " uid " +
           std::to_string(connection->peer.uid);
  }
  if (caller.tls_verified && !caller.names.empty()) {
    std::string identity = "tcp as";
    for (const std::string& name : caller.names) identity += " " + name;
    return identity;
  }
  // "ipv4:10.0.0.5:51234" and "ipv6:[::1]:51234" lose their port.
  const size_t port = caller.peer.rfind(':');
  const size_t scheme = caller.peer.find(':');
  return "tcp " +
         (port != std::string::npos && port != scheme ? caller.peer.substr(0, port) : caller.peer);
}

}  // namespace collectived
