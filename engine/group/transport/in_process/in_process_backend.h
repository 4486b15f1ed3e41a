// InProcessBackend: the data backend of an InProcessFabric session (tests): host memory, every
// collective built from the session's mailboxes on the calling thread. Reductions combine the
// nodes' contributions in node order (((c0 op c1) op c2) ...), so every node computes the same
// bits. With one node the collectives return at once (AllGatherV and AllToAllV copy their own
// part), as GlooBackend does.
//
// Thread-safety: as DataBackend.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "engine/group/transport/host_memory_backend.h"
#include "engine/group/transport/in_process/in_process_fabric.h"

namespace collectived {

class InProcessBackend final : public HostMemoryBackend {
 public:
  // Point-to-point transfers go through `link` too.
  explicit InProcessBackend(std::shared_ptr<InProcessLink> link);

  int node_rank() const override { return link_->node(); }
  int node_count() const override { return link_->node_count(); }

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

  void Abort() override;

 private:
  // Receives every other node's contribution (this node's is `data`) and leaves in `data` the
  // combination in node order: ((c0 op c1) op c2) ...
  Status ReceiveAndCombine(void* data, size_t count, DType dtype, const ReduceOp& op, uint32_t tag,
                           Ms timeout, std::string_view what);

  const std::shared_ptr<InProcessLink> link_;
  std::vector<std::byte> contributions_;  // executor thread only
};

}  // namespace collectived
