#include "engine/group/transport/in_process/in_process_control_channel.h"

#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace collectived {

struct InProcessControlChannel::State {
  State(std::shared_ptr<InProcessLink> link)
      : link(std::move(link)),
        exchange(this->link->group(), this->link->node(), this->link->node_count()) {}

  // Posts what the exchange left and runs its callbacks, after `lock` is released.
  void Apply(ControlExchange::Effects& effects, std::unique_lock<std::mutex>& lock) {
    for (auto& [node, message] : effects.posts) link->PostControl(node, std::move(message));
    lock.unlock();
    effects.RunCallbacks();
  }

  const std::shared_ptr<InProcessLink> link;
  std::mutex mutex;
  ControlExchange exchange;  // guarded by mutex
  int delayed_starts = 0;    // guarded by mutex: starts waiting out the node's delay
  Done broken_handler;       // guarded by mutex; runs once, not after Close
  bool closing = false;      // guarded by mutex: Close was called
};

InProcessControlChannel::InProcessControlChannel(std::shared_ptr<InProcessLink> link)
    : link_(std::move(link)), state_(std::make_shared<State>(link_)) {
  std::weak_ptr<State> weak = state_;
  link_->SetControlReceiver(InProcessLink::ControlReceiver{
      [weak](int from, ControlMessage message) {
        std::shared_ptr<State> state = weak.lock();
        if (!state) return;
        std::unique_lock<std::mutex> lock(state->mutex);
        ControlExchange::Effects effects;
        state->exchange.Deliver(from, std::move(message), effects);
        state->Apply(effects, lock);
      },
      [weak](int node, const Status& why) {
        std::shared_ptr<State> state = weak.lock();
        if (!state) return;
        std::unique_lock<std::mutex> lock(state->mutex);
        ControlExchange::Effects effects;
        if (node == state->link->node()) {
          state->exchange.Close(why, effects);
        } else {
          state->exchange.Break(node, why, effects);
        }
        if (!state->closing && state->broken_handler) {
          effects.Complete(std::exchange(state->broken_handler, nullptr), why);
        }
        state->Apply(effects, lock);
      }});
}

InProcessControlChannel::~InProcessControlChannel() {
  link_->SetControlReceiver({});
}

void InProcessControlChannel::StartAfterDelay(Start start, Done done) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ++state_->delayed_starts;
  }
  link_->AfterDelay([weak = std::weak_ptr<State>(state_), start = std::move(start),
                     done = std::move(done)]() mutable {
    std::shared_ptr<State> state = weak.lock();
    if (!state) {
      done(Status::PeerLost("the control channel was destroyed before the exchange started"));
      return;
    }
    std::unique_lock<std::mutex> lock(state->mutex);
    --state->delayed_starts;
    ControlExchange::Effects effects;
    start(state->exchange, std::move(done), effects);
    state->Apply(effects, lock);
  });
}

void InProcessControlChannel::StartAllGather(const void* in, void* out,
                                             std::vector<size_t> bytes_per_node, uint32_t tag,
                                             Done done) {
  // `in` is copied before the call returns, as the contract says, though the start may wait.
  std::vector<std::byte> mine;
  const size_t node = static_cast<size_t>(node_rank());
  if (node < bytes_per_node.size() && bytes_per_node[node] > 0) {
    mine.resize(bytes_per_node[node]);
    std::memcpy(mine.data(), in, mine.size());
  }
  StartAfterDelay(
      [mine = std::move(mine), out, sizes = std::move(bytes_per_node), tag](
          ControlExchange& exchange, Done done, ControlExchange::Effects& effects) mutable {
        exchange.StartAllGather(mine.data(), out, std::move(sizes), tag, std::move(done), effects);
      },
      std::move(done));
}

void InProcessControlChannel::StartAllReduce(const void* in, void* out, size_t bytes,
                                             Combine combine, uint32_t tag, Done done) {
  std::vector<std::byte> mine(bytes);
  if (bytes > 0) std::memcpy(mine.data(), in, bytes);
  StartAfterDelay(
      [mine = std::move(mine), out, bytes, combine = std::move(combine), tag](
          ControlExchange& exchange, Done done, ControlExchange::Effects& effects) mutable {
        exchange.StartAllReduce(mine.data(), out, bytes, std::move(combine), tag, std::move(done),
                                effects);
      },
      std::move(done));
}

std::vector<int> InProcessControlChannel::AwaitedNodes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->delayed_starts == 0) return state_->exchange.AwaitedNodes();
  std::vector<int> awaited;
  for (int node = 0; node < node_count(); ++node) {
    if (node != node_rank()) awaited.push_back(node);
  }
  return awaited;
}

void InProcessControlChannel::Close() {
  const std::string reason =
      "sidecar node " + std::to_string(link_->node()) + " closed its connections";
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->closing = true;
    ControlExchange::Effects effects;
    state_->exchange.Close(
        Status::PeerLost("group '" + link_->group() + "': the connections of sidecar node " +
                         std::to_string(link_->node()) + " are closed (" + reason + ")"),
        effects);
    state_->Apply(effects, lock);
  }
  link_->Close(reason);
}

void InProcessControlChannel::SetBrokenHandler(Done handler) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->broken_handler = std::move(handler);
}

}  // namespace collectived
