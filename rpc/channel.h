// Opens gRPC channels to a collectived (its Unix socket or TCP listener), with the message size
// limits the daemon uses.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "engine/status.h"

namespace collectived {

// Creates a channel to `address` (see rpc/address.h for the forms accepted). Does not
// connect yet. Returns InvalidArgument for a malformed address.
StatusOr<std::shared_ptr<grpc::Channel>> OpenSidecarChannel(const std::string& address);

}  // namespace collectived
