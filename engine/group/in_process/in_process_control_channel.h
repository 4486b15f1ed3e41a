// InProcessControlChannel: a group's control channel over an InProcessFabric session (tests).
//
// Thread-safety: as ControlChannel.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "engine/group/control_channel.h"
#include "engine/group/in_process/in_process_fabric.h"

namespace collectived {

class InProcessControlChannel final : public ControlChannel {
 public:
  explicit InProcessControlChannel(std::shared_ptr<InProcessLink> link);

  int node_rank() const override { return link_->node(); }
  int node_count() const override { return link_->node_count(); }

  // As ControlChannel::StartAllGather, in dissemination rounds over the link's point-to-point
  // transfers (after this node's injected delay, InProcessFabric::DelayNode); Internal for a tag
  // without OpTags::kControlBit.
  void StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node, uint32_t tag,
                      Done done) override;
  // As ControlChannel::StartAllReduce, up and down the binomial tree of dissemination.h.
  void StartAllReduce(const void* in, void* out, size_t bytes, Combine combine, uint32_t tag,
                      Done done) override;
  std::vector<int> AwaitedNodes() const override;
  // Closes this node's connections: its data backend's and point-to-point transfers' too (one
  // link, as the sidecar's mesh carries both).
  void Close() override;

 private:
  struct Exchange;
  struct Reduction;

  // Starts the exchange's current round: this node's parts out, the next ones' in.
  void StartRound(const std::shared_ptr<Exchange>& exchange);
  // A transfer of the current round finished; the last receive moves on to the next round.
  void Finished(const std::shared_ptr<Exchange>& exchange, const Status& status, bool received);
  // A reduction's transfer finished: the children's parts are combined once all came, the total
  // goes down once it came.
  void ReductionStep(const std::shared_ptr<Reduction>& reduction, const Status& status);
  void SendDown(const std::shared_ptr<Reduction>& reduction);
  // `*first` becomes `status` if it is the exchange's first failure.
  void KeepFirstFailure(const Status& status, Status* first) const;

  const std::shared_ptr<InProcessLink> link_;
  mutable std::mutex mutex_;
  std::shared_ptr<Exchange> current_;    // guarded by mutex_; the exchange in progress
  std::shared_ptr<Reduction> reducing_;  // guarded by mutex_; the reduction in progress
};

}  // namespace collectived
