// How clients find their sidecar: an explicit address, else COLLECTIVED_ADDRESS, else the
// daemon's default Unix socket. Addresses are "unix:///abs/path", "unix:/abs/path" or
// "host:port". On nodes that run one sidecar per GPU, "{local_rank}" in an address stands for
// $LOCAL_RANK (torchrun's), so one setting serves every trainer of the node:
// COLLECTIVED_ADDRESS=unix:///run/collectived/gpu{local_rank}.sock.
#pragma once

#include <string>

#include "engine/vocabulary/status.h"

namespace collectived {

inline constexpr char kDefaultSocketPath[] = "/run/collectived/collectived.sock";
inline constexpr char kAddressEnvironmentVariable[] = "COLLECTIVED_ADDRESS";

inline constexpr char kLocalRankPlaceholder[] = "{local_rank}";

// Returns `explicit_address` if non-empty, else $COLLECTIVED_ADDRESS if set and non-empty,
// else "unix://" + kDefaultSocketPath; "{local_rank}" in it replaced by $LOCAL_RANK when that
// is a decimal number (otherwise left for ToGrpcTarget to refuse).
std::string ResolveSidecarAddress(const std::string& explicit_address = "");

// Converts a collectived address into a gRPC target ("unix:/path" or "host:port").
// Returns InvalidArgument for an empty address, a relative Unix path, a TCP address without a
// port, or a "{local_rank}" that was not replaced (no $LOCAL_RANK).
StatusOr<std::string> ToGrpcTarget(const std::string& address);

}  // namespace collectived
