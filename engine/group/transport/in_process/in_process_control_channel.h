// InProcessControlChannel: a group's control channel over an InProcessFabric session (tests):
// ControlExchange, the protocols a socket mesh runs, carried by the link's control messages.
//
// Thread-safety: as ControlChannel.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/group/transport/control_channel.h"
#include "engine/group/transport/in_process/in_process_fabric.h"

namespace collectived {

class InProcessControlChannel final : public ControlChannel {
 public:
  explicit InProcessControlChannel(std::shared_ptr<InProcessLink> link);
  // Stops the link's deliveries to this channel.
  ~InProcessControlChannel() override;
  InProcessControlChannel(const InProcessControlChannel&) = delete;
  InProcessControlChannel& operator=(const InProcessControlChannel&) = delete;

  int node_rank() const override { return link_->node(); }
  int node_count() const override { return link_->node_count(); }

  // As ControlChannel's, each started after this node's injected delay (InProcessFabric::
  // DelayNode), as a sidecar busy elsewhere would start its part late.
  void StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node, uint32_t tag,
                      Done done) override;
  void StartAllReduce(const void* in, void* out, size_t bytes, Combine combine, uint32_t tag,
                      Done done) override;
  // While a start waits out the delay: every other node (nothing was heard yet).
  std::vector<int> AwaitedNodes() const override;
  // Closes this node's connections: its data backend's and point-to-point transfers' too (one
  // link, as the sidecar's mesh carries both).
  void Close() override;
  void SetBrokenHandler(Done handler) override;

 private:
  struct State;
  // Starts an exchange on `exchange` (with `done`), leaving its effects.
  using Start =
      std::function<void(ControlExchange& exchange, Done done, ControlExchange::Effects& effects)>;

  // Runs `start` once this node's injected delay passed (at once without one).
  void StartAfterDelay(Start start, Done done);

  const std::shared_ptr<InProcessLink> link_;
  const std::shared_ptr<State> state_;  // shared with the link's deliveries and delayed starts
};

}  // namespace collectived
