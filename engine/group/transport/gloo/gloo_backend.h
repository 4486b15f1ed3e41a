// GlooBackend: the data backend for host memory, over a Gloo context among the group's sidecars
// built with the option-style API only (mixing in Gloo's old algorithm classes slows a context
// down 100x). With one node there is no context and every collective is a no-op.
//
// The context's pairs are connected on first use (GlooPairs): before each Gloo call the backend
// connects the peers that call's algorithm exchanges data with (gloo_algorithm_peers.h), so a
// group that only allreduces holds its two ring connections. A first-use connection that fails
// fails the call with Unavailable naming the peer.
//
// Gloo's collectives block the calling thread until every sidecar made the same call: each runs
// inside an Executor::Blocking scope, so the pool lends a thread meanwhile. Point-to-point
// transfers do not go through Gloo (its TCP transport reports a transfer's completion only to a
// thread blocked waiting for it): they travel on the group's MessageTransport (SocketMesh),
// whose completions are callbacks.
//
// Thread-safety: as DataBackend.
#pragma once

#include <memory>
#include <vector>

#include "engine/group/transport/gloo/gloo_pairs.h"
#include "engine/group/transport/host_memory_backend.h"

namespace collectived {

class GlooBackend final : public HostMemoryBackend {
 public:
  // `context` and `transfers` may be null when the group lives on one node (node_count == 1).
  GlooBackend(std::shared_ptr<GlooPairs> context, int node_rank, int node_count,
              std::shared_ptr<MessageTransport> transfers);

  int node_rank() const override { return node_rank_; }
  int node_count() const override { return node_count_; }

  Status AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op, uint32_t tag,
                   Ms timeout) override;
  Status Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout) override;
  Status Reduce(void* data, size_t count, DType dtype, const ReduceOp& op, int root_node,
                uint32_t tag, Ms timeout) override;
  Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                    uint32_t tag, Ms timeout) override;
  Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                   const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) override;
  Status Barrier(uint32_t tag, Ms timeout) override;

  // Closes the context's pairs (GlooPairs::Close): blocked calls and first-use connections
  // fail with PeerLost, and so does every later call.
  void Abort() override;

  // The peers this node is connected with over Gloo now (0 with one node).
  int connected_peers() const { return context_ ? context_->connected_peers() : 0; }

 private:
  const std::shared_ptr<GlooPairs> context_;
  const int node_rank_;
  const int node_count_;
};

}  // namespace collectived
