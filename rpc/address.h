// How clients find their sidecar: an explicit address, else COLLECTIVED_ADDRESS, else the
// daemon's default Unix socket. Addresses are "unix:///abs/path", "unix:/abs/path" or
// "host:port".
#pragma once

#include <string>

#include "engine/status.h"

namespace collectived {

inline constexpr char kDefaultSocketPath[] = "/run/collectived/collectived.sock";
inline constexpr char kAddressEnvironmentVariable[] = "COLLECTIVED_ADDRESS";

// Returns `explicit_address` if non-empty, else $COLLECTIVED_ADDRESS if set and non-empty,
// else "unix://" + kDefaultSocketPath.
std::string ResolveSidecarAddress(const std::string& explicit_address = "");

// Converts a collectived address into a gRPC target ("unix:/path" or "host:port").
// Returns InvalidArgument for an empty address, a relative Unix path, or a TCP address
// without a port.
StatusOr<std::string> ToGrpcTarget(const std::string& address);

}  // namespace collectived
