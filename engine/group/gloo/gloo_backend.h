// GlooBackend: the data backend for host memory, over a Gloo context among the group's sidecars
// built with the option-style API only (mixing in Gloo's old algorithm classes slows a context
// down 100x). With one node there is no context and every collective is a no-op.
//
// Point-to-point: Gloo's TCP transport reports a transfer's completion only to a thread blocked
// in waitSend/waitRecv (and a timed-out wait closes every connection of the context), so each
// remote transfer in flight is waited for by a thread of its own, joined by this backend. The
// transfer is posted to Gloo on the calling thread, so transfers of one key started one after
// the other are matched in that order; Abort interrupts every wait at once.
//
// Thread-safety: as DataBackend.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/group/host_memory_backend.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace collectived {

class GlooBackend final : public HostMemoryBackend {
 public:
  // `context` may be null when the group lives on one node (node_count == 1).
  GlooBackend(std::shared_ptr<gloo::Context> context, int node_rank, int node_count);
  // Joins the point-to-point threads (after Abort they end at once).
  ~GlooBackend() override;

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

  void StartSend(const void* data, size_t bytes, int node, P2PKey key, Ms timeout,
                 Done done) override;
  void StartRecv(void* data, size_t bytes, int node, P2PKey key, Ms timeout, Done done) override;
  bool Idle() const override;

  void Abort() override;

 private:
  struct Transfer {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
    std::shared_ptr<gloo::transport::UnboundBuffer> buffer;  // its wait is interrupted by Abort
    bool is_send = false;
  };
  void StartTransfer(bool is_send, void* data, size_t bytes, int node, P2PKey key, Ms timeout,
                     Done done);
  void ReapFinishedTransfers();

  const std::shared_ptr<gloo::Context> context_;
  const int node_rank_;
  const int node_count_;

  mutable std::mutex mutex_;
  std::list<Transfer> transfers_;  // guarded by mutex_
  bool aborted_ = false;           // guarded by mutex_
};

// Gloo's allgatherv among `node_count` nodes over `context` (with one node: copies `in` to
// `out`), errors named after `what`. Shared by GlooBackend and GlooControlChannel.
Status GlooAllGatherV(const std::shared_ptr<gloo::Context>& context, int node_rank, int node_count,
                      const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                      uint32_t tag, std::chrono::milliseconds timeout, std::string_view what);

// The Gloo slot of a point-to-point stream; never collides with Gloo's collectives' slots.
uint64_t GlooP2PSlot(const DataBackend::P2PKey& key);

}  // namespace collectived
