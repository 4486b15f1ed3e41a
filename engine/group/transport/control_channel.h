// ControlChannel: the small messages a group's sidecars exchange about an op before any data
// moves — each rank's op signature and arrival time (desync detection, straggler attribution)
// and the per-pair block sizes of alltoall ops. It is kept apart from the data backend (its own
// connections: the group's mesh, whose control frames carry OpTags' control tags) so that a data
// backend that cannot carry arbitrary host bytes (NCCL on device memory) still gets its ops
// agreed on.
//
// Exchanges follow the schedules of dissemination.h: an allgather in ⌈log₂ S⌉ rounds, an
// allreduce of fixed-size summaries up and down a binomial tree, both over the same peers, so a
// sidecar needs connections to those peers only.
//
// An exchange is started, not waited for: the op waiting for its peers holds no thread, and the
// channel calls back when every peer's part arrived. Timeouts are the group's (it closes the
// channel when an op's deadline passes, which ends the exchange).
//
// The roll call that names a dead sidecar goes through the group's store, not through here: it
// must work when the connections are already broken.
//
// Thread-safety: every method may be called from any thread. Exchanges are started one at a time
// (the next once the previous one's `done` ran), in the same op order on every sidecar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/group/core/op_tags.h"
#include "engine/vocabulary/status.h"

namespace collectived {

class ControlChannel {
 public:
  using Done = std::function<void(const Status&)>;

  virtual ~ControlChannel() = default;

  virtual int node_rank() const = 0;
  virtual int node_count() const = 0;

  // Starts an allgather: node i contributes bytes_per_node[i] bytes (`in` holds this node's and
  // is copied before the call returns); `out` receives them all, concatenated in node order, and
  // must stay valid until `done` ran. `tag` is one of OpTags::Control. `done` runs exactly once:
  // with OK once every node's part is in `out`; PeerLost when a peer's connection broke or the
  // channel was closed; Internal when a peer's message is not the one expected. It runs on a
  // thread of the channel, or on this one before the call returns (one node, or already
  // broken); it must not block.
  virtual void StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node,
                              uint32_t tag, Done done) = 0;

  // Merges `later` (the combination of the nodes that follow) into `acc` (of the nodes before):
  // both `bytes` long. Runs on a thread of the channel, possibly under its lock: it must be
  // quick and must not call the channel.
  using Combine = std::function<void(std::byte* acc, const std::byte* later)>;

  // Starts an allreduce of one fixed-size summary per node: `out` receives the combination of
  // every node's `bytes` (this node's from `in`, copied before the call returns), combined in
  // node order. `done` as for StartAllGather. Its cost does not grow with the node count but
  // with its logarithm (a tree), so the agreement of a large group exchanges summaries instead
  // of every rank's announcement.
  virtual void StartAllReduce(const void* in, void* out, size_t bytes, Combine combine,
                              uint32_t tag, Done done) = 0;

  // The nodes whose part of the exchange in progress has not arrived yet (for a timeout's
  // message); empty when none is in progress.
  virtual std::vector<int> AwaitedNodes() const = 0;

  // Closes the channel: the exchange in progress and later ones fail with PeerLost here, and the
  // peers' fail promptly too.
  virtual void Close() = 0;

  // `handler` runs once, with PeerLost, when a connection to a peer breaks before Close (a peer
  // sidecar died or left), even while no exchange waits on it: a group whose ops wait on a
  // device learns this way that a peer is gone. It runs on a thread of the channel and must not
  // block. Channels that cannot tell ignore it.
  virtual void SetBrokenHandler(Done handler) { (void)handler; }
};

// What every ControlChannel answers a tag from the data half: Internal (a bug).
inline Status CheckControlTag(uint32_t tag) {
  if (OpTags::IsControl(tag)) return Status::Ok();
  return Status::Internal("control message sent with a data tag " + std::to_string(tag));
}

}  // namespace collectived
