#include "engine/group/in_process/in_process_control_channel.h"

#include <string>

namespace collectived {

InProcessControlChannel::InProcessControlChannel(std::shared_ptr<InProcessLink> link)
    : link_(std::move(link)) {}

Status InProcessControlChannel::AllGather(const void* in, void* out,
                                          const std::vector<size_t>& bytes_per_node, uint32_t tag,
                                          std::chrono::milliseconds timeout) {
  COLLECTIVED_RETURN_IF_ERROR(CheckControlTag(tag));
  return link_->AllGatherV(in, out, bytes_per_node, tag, timeout,
                           "agreeing on the op among sidecars");
}

void InProcessControlChannel::Close() {
  link_->Close("sidecar node " + std::to_string(link_->node()) + " closed its connections");
}

}  // namespace collectived
