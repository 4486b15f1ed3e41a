#include "engine/group/in_process/in_process_control_channel.h"

#include <cstring>
#include <string>

namespace collectived {
namespace {

// The stream of control messages from node `from` to node `to`: ranks far below any real rank
// and PointToPoint's envelope streams.
P2PKey ControlKey(int from, int to, uint32_t tag) {
  return P2PKey{-1'000'000 - from, -1'000'000 - to, static_cast<int64_t>(tag)};
}

}  // namespace

// One allgather in progress: its transfers complete on the fabric's worker.
struct InProcessControlChannel::Exchange {
  std::mutex mutex;
  std::vector<std::byte> mine;
  std::vector<bool> arrived;  // by node
  size_t left = 0;            // transfers not finished
  Status status;              // the first failure
  Done done;
};

InProcessControlChannel::InProcessControlChannel(std::shared_ptr<InProcessLink> link)
    : link_(std::move(link)) {}

void InProcessControlChannel::StartAllGather(const void* in, void* out,
                                             std::vector<size_t> bytes_per_node, uint32_t tag,
                                             Done done) {
  if (Status refused = CheckControlTag(tag); !refused.ok()) {
    done(refused);
    return;
  }
  const int nodes = node_count();
  const int me = node_rank();
  std::vector<size_t> offsets(nodes, 0);
  for (int node = 1; node < nodes; ++node)
    offsets[node] = offsets[node - 1] + bytes_per_node[node - 1];
  auto* gathered = static_cast<std::byte*>(out);
  if (bytes_per_node[me] > 0 && gathered + offsets[me] != in)
    std::memmove(gathered + offsets[me], in, bytes_per_node[me]);
  if (nodes == 1) {
    done(Status::Ok());
    return;
  }
  auto exchange = std::make_shared<Exchange>();
  exchange->mine.assign(static_cast<const std::byte*>(in),
                        static_cast<const std::byte*>(in) + bytes_per_node[me]);
  exchange->arrived.assign(nodes, false);
  exchange->arrived[me] = true;
  exchange->left = 2 * static_cast<size_t>(nodes - 1);
  exchange->done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = exchange;
  }
  auto finish = [this, exchange](int node, const Status& status) {
    Done done;
    Status result;
    {
      std::lock_guard<std::mutex> lock(exchange->mutex);
      if (!status.ok() && exchange->status.ok()) {
        exchange->status = status.kind() == ErrorKind::kInternal
                               ? Status::Internal("control message mismatch in group '" +
                                                  link_->group() + "': " + status.message())
                               : status;
      }
      if (node >= 0 && status.ok()) exchange->arrived[node] = true;
      if (--exchange->left > 0) return;
      done = std::move(exchange->done);
      result = exchange->status;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (current_ == exchange) current_.reset();
    }
    done(result);
  };
  // A slow sidecar (DelayNode) starts its part late, as a sidecar busy elsewhere would.
  link_->AfterDelay([this, exchange, finish, gathered, offsets, bytes_per_node, nodes, me, tag] {
    for (int node = 0; node < nodes; ++node) {
      if (node == me) continue;
      link_->StartSend(exchange->mine.data(), exchange->mine.size(), node,
                       ControlKey(me, node, tag),
                       [finish](const Status& status) { finish(-1, status); });
      link_->StartRecv(gathered + offsets[node], bytes_per_node[node], node,
                       ControlKey(node, me, tag),
                       [finish, node](const Status& status) { finish(node, status); });
    }
  });
}

std::vector<int> InProcessControlChannel::AwaitedNodes() const {
  std::shared_ptr<Exchange> exchange;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exchange = current_;
  }
  std::vector<int> awaited;
  if (!exchange) return awaited;
  std::lock_guard<std::mutex> lock(exchange->mutex);
  for (size_t node = 0; node < exchange->arrived.size(); ++node) {
    if (!exchange->arrived[node]) awaited.push_back(static_cast<int>(node));
  }
  return awaited;
}

void InProcessControlChannel::Close() {
  link_->Close("sidecar node " + std::to_string(link_->node()) + " closed its connections");
}

}  // namespace collectived
