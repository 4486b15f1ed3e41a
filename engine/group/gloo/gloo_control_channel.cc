#include "engine/group/gloo/gloo_control_channel.h"

#include <gloo/allgatherv.h>
#include <gloo/context.h>

#include <cstring>

#include "engine/group/gloo/gloo_errors.h"
#include "engine/group/op_tags.h"

namespace collectived {

GlooControlChannel::GlooControlChannel(std::shared_ptr<gloo::Context> context, int node_rank,
                                       int node_count)
    : context_(std::move(context)), node_rank_(node_rank), node_count_(node_count) {}

Status GlooControlChannel::AllGather(const void* in, void* out,
                                     const std::vector<size_t>& bytes_per_node, uint32_t tag,
                                     std::chrono::milliseconds timeout) {
  if ((tag & OpTags::kControlBit) == 0) {
    return Status::Internal("control message sent with a data tag " + std::to_string(tag));
  }
  if (node_count_ == 1) {
    if (in != out && bytes_per_node[0] > 0) std::memmove(out, in, bytes_per_node[0]);
    return Status::Ok();
  }
  return GlooCall("agreeing on the op among sidecars", [&] {
    gloo::AllgathervOptions options(context_);
    options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)),
                     bytes_per_node[node_rank_]);
    options.setOutput(static_cast<uint8_t*>(out), bytes_per_node);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::allgatherv(options);
  });
}

void GlooControlChannel::Close() {
  if (context_) context_->closeConnections();
}

}  // namespace collectived
