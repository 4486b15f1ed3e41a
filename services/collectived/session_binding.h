// The connection a session is bound to, as the services describe it to the engine: Attach
// records the binding of its stream (Sidecar::OpenSession) and every session-scoped call
// presents its own (SessionRef::binding), so that a session is usable only from the connection
// that attached it. The engine compares bindings for equality and never interprets them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace collectived {

// Over TCP: "tcp <peer>" (gRPC's peer string, "ipv4:10.0.0.5:51234": one value per TCP
// connection), followed by " as <name>..." with the names of the client certificate when TLS
// verified one. On the Unix socket: "unix fd:<n>#<generation> pid <p> uid <u>", the connection
// that collectived accepted itself (UnixConnections): one value per connection too, so a second
// local process that learns a session's id cannot use it.
// kUnixBinding stands for a Unix connection that was not accepted through UnixListener (none
// in the daemon; gRPC's own Unix listener would name every connection "unix:").
inline constexpr std::string_view kUnixBinding = "unix";

std::string SessionBinding(const grpc::ServerContext& context);

// Who a session attached through `context` is accounted to (Sidecar::OpenSession's client): on
// the Unix socket the process ("pid 42 uid 1000", from SO_PEERCRED), so that a process's sessions
// share one share; over TCP the verified certificate names ("tcp as trainer-3"), else the
// caller's address without its port ("tcp ipv4:10.0.0.5"), so that more connections from one
// host buy it no more. Empty for a Unix connection that was not accepted through UnixListener.
std::string ClientIdentity(const grpc::ServerContext& context);

// Whether `binding` is a connection on the Unix socket (a local process).
inline bool IsUnixBinding(std::string_view binding) {
  return binding == kUnixBinding || binding.substr(0, kUnixBinding.size() + 1) == "unix ";
}

}  // namespace collectived
