// The node-aware collective algorithms. Each combines the requests of this sidecar's local
// ranks in shared memory and moves one contribution per node through the NodeComm; with one
// node nothing crosses the network. One function per op family; the group executor calls them
// once every local rank has issued the op and all ranks agreed on its signature.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "engine/group/node_comm.h"
#include "engine/group/topology.h"
#include "engine/op.h"

namespace collectived {

// Growable scratch memory owned by a group's executor and reused across ops.
class Scratch {
 public:
  std::byte* Get(int which, size_t bytes) {
    auto& buffer = buffers_[which];
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }

 private:
  std::vector<std::byte> buffers_[3];
};

struct OpContext {
  const GroupTopology& topology;
  NodeComm& comm;
  std::vector<OpRequest*> requests;  // one per local rank, in topology.local_ranks() order
  Scratch& scratch;
  uint32_t tag;
  std::chrono::milliseconds timeout;
};

Status RunAllReduce(OpContext& op);  // allreduce, allreduce_coalesced
Status RunBroadcast(OpContext& op);
Status RunReduce(OpContext& op);
Status RunAllGather(OpContext& op);      // allgather, allgather_into_tensor, allgather_coalesced
Status RunReduceScatter(OpContext& op);  // reduce_scatter, reduce_scatter_tensor
Status RunAllToAll(OpContext& op);       // alltoall, alltoall_single, gather, scatter
Status RunBarrier(OpContext& op);

// The (input block -> output block) element counts of an alltoall-family request, as the
// sender sees them: counts[b] = elements this rank sends to rank b (gather: to the root only;
// scatter: from the root only).
std::vector<int64_t> SendCounts(const OpRequest& request, int group_rank, int group_size);
std::vector<int64_t> RecvCounts(const OpRequest& request, int group_rank, int group_size);

}  // namespace collectived
