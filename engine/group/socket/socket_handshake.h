// ConnectSocketMesh: the TCP connections of a group's sidecars among themselves, one per pair,
// formed through the group's store, which is the trust anchor here as it is for Gloo: each
// sidecar listens on an ephemeral port of its advertised host and publishes the address with a
// random secret. A connecting sidecar presents the listener's secret and gets its own back, so a
// stray or forged connection is refused; it then confirms that it read the answer, and only a
// confirmed connection counts, so a dialler whose answer was lost dials again and is taken.
//
// Each sidecar dials the ones of lower rank and takes calls from those of higher rank, so the
// mesh forms without a cycle of waits. SocketMesh runs the connections once formed.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/status.h"
#include "engine/store/store.h"

namespace collectived {

// Connects this sidecar (node `node_rank` of `node_count`) with every other one of `group`,
// meeting through `store` (scoped to this incarnation of the group), listening on
// `advertise_host`. Blocks until every pair is connected. Returns the non-blocking sockets by
// node (-1 for this node; all -1 with one node), or Unavailable naming the group and the peer
// when `timeout` passes first or a peer cannot be reached.
StatusOr<std::vector<int>> ConnectSocketMesh(const std::string& group,
                                             const std::string& advertise_host, Store& store,
                                             int node_rank, int node_count,
                                             std::chrono::milliseconds timeout);

}  // namespace collectived
