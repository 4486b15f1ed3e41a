// SocketControlChannel: a group's control channel over TCP connections of its own, one per pair
// of its sidecars, which the executor reads and writes itself. An op's agreement then costs one
// message each way per pair and no hand-off between threads. Over Gloo's pairs each message also
// waited for the receiver's readiness notice and went through Gloo's I/O thread before it woke
// the executor: on a 2-core machine that was about half of a small op across sidecars.
//
// The connections form through the group's store, which is the trust anchor here as it is for
// Gloo: each sidecar listens on an ephemeral port of its advertised host and publishes the
// address with a random secret. A connecting sidecar presents the listener's secret and gets its
// own back, so a stray or forged connection is refused; it then confirms that it read the answer,
// and only a confirmed connection counts, so a dialler whose answer was lost dials again and is
// taken.
//
// Thread-safety: as ControlChannel (AllGather from the executor only; Close from any thread).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/group/control_channel.h"
#include "engine/status.h"
#include "engine/store/store.h"

namespace collectived {

class SocketControlChannel final : public ControlChannel {
 public:
  // Connects this sidecar (node `node_rank` of `node_count`) with every other one of group
  // `group`, meeting through `store` (scoped to this incarnation of the group). Listens on
  // `advertise_host`. Blocks until every pair is connected, or returns Unavailable (naming the
  // group and the peer) when `timeout` passes first or a peer cannot be reached.
  static StatusOr<std::unique_ptr<SocketControlChannel>> Connect(const std::string& group,
                                                                 const std::string& advertise_host,
                                                                 Store& store, int node_rank,
                                                                 int node_count,
                                                                 std::chrono::milliseconds timeout);
  ~SocketControlChannel() override;

  SocketControlChannel(const SocketControlChannel&) = delete;
  SocketControlChannel& operator=(const SocketControlChannel&) = delete;

  int node_rank() const override { return node_rank_; }
  int node_count() const override { return static_cast<int>(fds_.size()); }
  Status AllGather(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                   uint32_t tag, std::chrono::milliseconds timeout) override;
  void Close() override;

 private:
  SocketControlChannel(std::string group, int node_rank, std::vector<int> fds);

  const std::string group_;
  const int node_rank_;
  const std::vector<int> fds_;  // by node; -1 for this node
  std::atomic<bool> closed_{false};
};

}  // namespace collectived
