// Opens gRPC channels to a collectived (its Unix socket or TCP listener), with the message size
// limits the daemon uses and, for TCP, the TLS settings given.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "engine/vocabulary/status.h"
#include "rpc/tls.h"

namespace collectived {

// Creates a channel to `address` (see rpc/address.h for the forms accepted). A TCP address uses
// `security` (plaintext when it holds no credentials); a Unix socket is always plaintext. Does
// not connect yet. Returns InvalidArgument for a malformed address.
StatusOr<std::shared_ptr<grpc::Channel>> OpenSidecarChannel(const std::string& address,
                                                            const ChannelSecurity& security = {});

// A client's channel to `address`: TLS per `tls` for a TCP address (plaintext when `tls` names
// no file), always plaintext for a Unix socket. Errors: those of OpenSidecarChannel, and
// ChannelSecurity::Make's (an unreadable TLS file) with context "TLS to <address>".
StatusOr<std::shared_ptr<grpc::Channel>> OpenClientChannel(const std::string& address,
                                                           const TlsClientOptions& tls);

// Whether `address` names a Unix socket (unix:///path or unix:/path) rather than host:port.
bool IsUnixAddress(const std::string& address);

}  // namespace collectived
