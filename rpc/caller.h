// Who is calling the sidecar: the listener a call came through (the node-local Unix socket or
// TCP) and, over mutual TLS, the names in the peer's verified certificate. The policies that
// decide what a caller may do (sidecar peer, admin) live with the services that apply them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

namespace collectived {

struct Caller {
  // Through the Unix socket: a process on this node allowed by the socket's permissions.
  bool local = false;
  // Over TCP with a client certificate that the configured CA verified.
  bool tls_verified = false;
  // The certificate's subject alternative names (DNS, URI, IP) and common name, when verified.
  std::vector<std::string> names;
  // gRPC's transport peer ("unix:", "ipv4:10.0.0.5:51234"): one TCP connection per value.
  std::string peer;

  // The first of the certificate's names that is in `allowed`, or null.
  const std::string* FindName(const std::vector<std::string>& allowed) const;
  // Whether one of the certificate's names is in `allowed`.
  bool HasAnyName(const std::vector<std::string>& allowed) const {
    return FindName(allowed) != nullptr;
  }
  // "unix socket", "tcp 10.0.0.5:51234 (insecure)" or "tcp ... as CN-or-first-SAN": for errors
  // and logs.
  std::string Describe() const;
};

Caller IdentifyCaller(const grpc::ServerContextBase& context);

}  // namespace collectived
