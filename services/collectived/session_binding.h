// The connection a session is bound to, as the services describe it to the engine: Attach
// records the binding of its stream (Sidecar::OpenSession) and every session-scoped call
// presents its own (SessionRef::binding), so that a session is usable only from the connection
// that attached it. The engine compares bindings for equality and never interprets them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

namespace collectived {

// "unix" for a caller of the Unix socket; "tcp <peer>" over TCP (gRPC's peer string,
// "ipv4:10.0.0.5:51234": one value per TCP connection), followed by " as <name>..." with the
// names of the client certificate when TLS verified one.
//
// The Unix socket gives no per-connection identity: gRPC reports the peer "unix:" for every
// connection there, so all local callers share one binding. A session attached over the socket
// is thus usable by any local process that knows its id (the socket's permissions decide who
// those are); the id being 128 random bits that are never logged or shown is what protects it
// there.
// The binding of every connection on the Unix socket (gRPC 1.51 tells them apart by nothing).
inline constexpr std::string_view kUnixBinding = "unix";

std::string SessionBinding(const grpc::ServerContext& context);

}  // namespace collectived
