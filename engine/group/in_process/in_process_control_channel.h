// InProcessControlChannel: a group's control channel over an InProcessFabric session (tests).
//
// Thread-safety: as ControlChannel.
#pragma once

#include <memory>

#include "engine/group/control_channel.h"
#include "engine/group/in_process/in_process_fabric.h"

namespace collectived {

class InProcessControlChannel final : public ControlChannel {
 public:
  explicit InProcessControlChannel(std::shared_ptr<InProcessLink> link);

  int node_rank() const override { return link_->node(); }
  int node_count() const override { return link_->node_count(); }

  // As ControlChannel::AllGather; Internal for a tag without OpTags::kControlBit.
  Status AllGather(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                   uint32_t tag, std::chrono::milliseconds timeout) override;
  // Closes this node's connections: its data backend's too, as with Gloo (one context).
  void Close() override;

 private:
  const std::shared_ptr<InProcessLink> link_;
};

}  // namespace collectived
