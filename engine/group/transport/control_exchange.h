// ControlExchange: the control channel's two protocols, written once for every carrier: the
// dissemination allgather and the allreduce of summaries up and down the binomial tree
// (dissemination.h). The socket mesh (control frames on TCP) and the in-process fabric
// (mailboxes) both run this state machine, so a group test over the fabric runs the agreement
// that ships.
//
// It owns no thread, no lock and no connection. Its carrier calls it under the carrier's lock,
// feeds it what arrives (Deliver), what broke (Break) and its own close (Close), and carries out
// what each call leaves in Effects: the messages to post, in order, and the callbacks to run once
// that lock is released. The carrier must deliver the messages of one peer in the order that peer
// posted them (one connection, one FIFO mailbox); a message that arrives before the exchange that
// takes it waits in its peer's inbox.
//
// Thread-safety: none of its own; the carrier's lock guards every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/group/transport/control_channel.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// One message of an exchange, as a carrier moves it.
struct ControlMessage {
  uint32_t tag = 0;   // the op's control tag (OpTags::Control)
  int32_t round = 0;  // the allgather's round; the tree's direction (ControlExchange::kTowardsRoot)
  std::vector<std::byte> bytes;
};

class ControlExchange {
 public:
  using Done = ControlChannel::Done;
  using Combine = ControlChannel::Combine;

  // The tree's two directions, in ControlMessage::round.
  static constexpr int32_t kTowardsRoot = 0;
  static constexpr int32_t kFromRoot = 1;

  // What a call leaves for its carrier to do.
  struct Effects {
    std::vector<std::pair<int, ControlMessage>> posts;  // (to node, message), in posting order
    std::vector<std::pair<Done, Status>> callbacks;     // to run without the carrier's lock

    void Complete(Done done, Status status) {
      if (done) callbacks.emplace_back(std::move(done), std::move(status));
    }
    // Runs the callbacks (and drops what they hold); the posts are the carrier's.
    void RunCallbacks() {
      for (auto& [done, status] : callbacks) {
        done(status);
        done = nullptr;
      }
      callbacks.clear();
    }
  };

  // `group` names the group in error messages.
  ControlExchange(std::string group, int node_rank, int node_count);
  ~ControlExchange();
  ControlExchange(const ControlExchange&) = delete;
  ControlExchange& operator=(const ControlExchange&) = delete;

  int node_rank() const { return node_rank_; }
  int node_count() const { return node_count_; }

  // ControlChannel::StartAllGather and StartAllReduce. `done` goes to Effects: with Internal for
  // a data tag, a wrong number of sizes or an exchange already in progress; with the carrier's
  // status once it closed or a peer's connection broke; with OK once every part is here (at
  // once with one node); Internal when a peer's message is not the one expected (another tag,
  // round or size: the ranks issued different ops); PeerLost when a peer it needs breaks.
  void StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node, uint32_t tag,
                      Done done, Effects& effects);
  void StartAllReduce(const void* in, void* out, size_t bytes, Combine combine, uint32_t tag,
                      Done done, Effects& effects);

  // A message from node `from` arrived (in that node's posting order).
  void Deliver(int from, ControlMessage message, Effects& effects);
  // The connection to `node` broke with `why` (PeerLost; the first status of a node is kept):
  // the exchange in progress fails if it still needs that node, and every later one is refused.
  void Break(int node, const Status& why, Effects& effects);
  // The carrier closed: the exchange in progress and every later one fail with `why`.
  void Close(const Status& why, Effects& effects);

  bool closed() const { return !closed_.ok(); }
  // Whether an exchange is in progress.
  bool busy() const { return gather_ != nullptr || reduction_ != nullptr; }
  // ControlChannel::AwaitedNodes: the nodes whose part has not reached this node yet, directly
  // or passed on by a peer (towards the root: the subtrees not heard from; from the root: every
  // node outside this one's subtree). Empty when no exchange is in progress.
  std::vector<int> AwaitedNodes() const;

 private:
  struct Gather;
  struct Reduction;

  Status RefuseExchange(uint32_t tag) const;
  void Post(int to, uint32_t tag, int32_t round, const std::byte* data, size_t bytes,
            Effects& effects);
  // Takes what arrived for the exchange in progress, as far as it goes.
  void Advance(Effects& effects);
  void AdvanceGather(Effects& effects);
  void AdvanceReduction(Effects& effects);
  // This node's message of the gather's current round.
  void PostRound(Effects& effects);
  // Whether the exchange in progress still needs `node` (to hear from, or to pass parts to).
  bool GatherNeeds(int node) const;
  bool ReductionNeeds(int node) const;
  // Ends the exchange in progress with `status`.
  void Fail(const Status& status, Effects& effects);
  // Internal: node `from`'s message is not the one expected (`what`: the round or direction).
  Status Mismatch(int from, uint32_t tag, size_t bytes, const std::string& what,
                  const ControlMessage& got) const;

  const std::string group_;
  const int node_rank_;
  const int node_count_;
  Status closed_;                                  // the carrier's close, once closed
  std::vector<Status> broken_;                     // by node: its connection's break
  std::vector<std::deque<ControlMessage>> inbox_;  // by node: arrived, not yet taken
  std::unique_ptr<Gather> gather_;
  std::unique_ptr<Reduction> reduction_;  // never with gather_
};

}  // namespace collectived
