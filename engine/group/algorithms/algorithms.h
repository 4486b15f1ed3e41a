// The node-aware collective algorithms. Each combines the requests of this sidecar's local
// ranks on their device and moves one contribution per node through the group's DataBackend;
// with one node nothing crosses the network. They touch memory only through the backend
// (Copy, Combine, Scratch, ...), so they run unchanged over any backend. One function per op
// family; the group executor calls them once every local rank has issued the op and all ranks
// agreed on its signature.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "engine/concurrency/executor.h"
#include "engine/group/core/op_tags.h"
#include "engine/group/core/topology.h"
#include "engine/group/transport/data_backend.h"
#include "engine/vocabulary/op.h"

namespace collectived {

struct OpContext {
  const GroupTopology& topology;
  DataBackend& backend;
  std::vector<OpRequest*> requests;  // one per local rank, in topology.local_ranks() order
  OpTags tags;                       // every network call uses tags.Data<step>()
  std::chrono::milliseconds timeout;
  // Where a large local pass may split into tasks (null: all on the calling thread).
  Executor* executor = nullptr;
};

Status RunAllReduce(OpContext& op);  // allreduce, allreduce_coalesced
Status RunBroadcast(OpContext& op);
Status RunReduce(OpContext& op);
Status RunAllGather(OpContext& op);      // allgather, allgather_into_tensor, allgather_coalesced
Status RunReduceScatter(OpContext& op);  // reduce_scatter, reduce_scatter_tensor
Status RunAllToAll(OpContext& op);       // alltoall, alltoall_single, gather, scatter
Status RunBarrier(OpContext& op);

// An allreduce small enough to travel with the signature exchange (Group::CheckAgreement) in
// one network round. PackSmallAllReduce writes this node's combined contribution (PREMUL_SUM's
// scale applied) into `payload` and returns true when the op is a single-tensor allreduce on
// host memory of at most `capacity` bytes; false otherwise. FinishSmallAllReduce combines
// `payload_count` payloads (`stride` bytes apart, in node order, so that every node computes the
// same result: every node's, or one already combined by a summary agreement) into each local
// rank's tensor.
bool PackSmallAllReduce(DataBackend& backend, const std::vector<const OpRequest*>& requests,
                        std::byte* payload, size_t capacity);
Status FinishSmallAllReduce(OpContext& op, const std::byte* payloads, size_t stride,
                            int payload_count);

// The (input block -> output block) element counts of an alltoall-family request, as the
// sender sees them: counts[b] = elements this rank sends to rank b (gather: to the root only;
// scatter: from the root only).
std::vector<int64_t> SendCounts(const OpRequest& request, int group_rank, int group_size);
std::vector<int64_t> RecvCounts(const OpRequest& request, int group_rank, int group_size);

}  // namespace collectived
