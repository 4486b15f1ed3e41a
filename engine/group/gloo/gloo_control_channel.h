// GlooControlChannel: the control channel over the group's Gloo context, on the control half of
// the tag space (OpTags::Control), so that an op's agreement never shares tags with its data.
//
// Thread-safety: as ControlChannel.
#pragma once

#include <memory>

#include "engine/group/control_channel.h"

namespace gloo {
class Context;
}

namespace collectived {

class GlooControlChannel final : public ControlChannel {
 public:
  // `context` may be null when the group lives on one node.
  GlooControlChannel(std::shared_ptr<gloo::Context> context, int node_rank, int node_count);

  int node_rank() const override { return node_rank_; }
  int node_count() const override { return node_count_; }
  Status AllGather(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                   uint32_t tag, std::chrono::milliseconds timeout) override;
  void Close() override;

 private:
  const std::shared_ptr<gloo::Context> context_;
  const int node_rank_;
  const int node_count_;
};

}  // namespace collectived
