#include "engine/group/gloo/gloo_control_channel.h"

#include <gloo/context.h>

#include "engine/group/gloo/gloo_backend.h"

namespace collectived {

GlooControlChannel::GlooControlChannel(std::shared_ptr<gloo::Context> context, int node_rank,
                                       int node_count)
    : context_(std::move(context)), node_rank_(node_rank), node_count_(node_count) {}

Status GlooControlChannel::AllGather(const void* in, void* out,
                                     const std::vector<size_t>& bytes_per_node, uint32_t tag,
                                     std::chrono::milliseconds timeout) {
  COLLECTIVED_RETURN_IF_ERROR(CheckControlTag(tag));
  return GlooAllGatherV(context_, node_rank_, node_count_, in, out, bytes_per_node, tag, timeout,
                        "agreeing on the op among sidecars");
}

void GlooControlChannel::Close() {
  if (context_) context_->closeConnections();
}

}  // namespace collectived
