// ControlChannel: the small messages a group's sidecars exchange about an op before any data
// moves — each rank's op signature and arrival time (desync detection, straggler attribution)
// and the per-pair block sizes of alltoall ops. It is kept apart from the data backend (its own
// tags, see OpTags, or its own connections) so that a data backend that cannot carry arbitrary
// host bytes (NCCL on device memory) still gets its ops agreed on.
//
// The roll call that names a dead sidecar goes through the group's store, not through here: it
// must work when the connections are already broken.
//
// Thread-safety: AllGather is called by the group's executor only, in the same op order on every
// sidecar; Close may be called from any thread at any time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/group/op_tags.h"
#include "engine/status.h"

namespace collectived {

class ControlChannel {
 public:
  virtual ~ControlChannel() = default;

  virtual int node_rank() const = 0;
  virtual int node_count() const = 0;

  // Node i contributes bytes_per_node[i] bytes (`in` holds this node's); `out` receives them all,
  // concatenated in node order. `tag` is one of OpTags::Control. Blocks until done. Returns
  // PeerLost when a peer's connection broke, Timeout when `timeout` passed first.
  virtual Status AllGather(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                           uint32_t tag, std::chrono::milliseconds timeout) = 0;

  // Closes the channel: blocked and later calls here and on the peers fail promptly.
  virtual void Close() = 0;
};

// What every ControlChannel::AllGather answers a tag from the data half: Internal (a bug).
inline Status CheckControlTag(uint32_t tag) {
  if (OpTags::IsControl(tag)) return Status::Ok();
  return Status::Internal("control message sent with a data tag " + std::to_string(tag));
}

}  // namespace collectived
