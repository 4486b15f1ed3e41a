#include "engine/group/transport/control_exchange.h"

#include <algorithm>
#include <cstring>

#include "engine/group/transport/dissemination.h"

namespace collectived {

struct ControlExchange::Gather {
  uint32_t tag = 0;
  std::byte* out = nullptr;
  std::vector<size_t> sizes;
  std::vector<size_t> offsets;
  int held = 1;   // the parts held, this node's and the next ones' (mod node count)
  int round = 0;  // the round whose message is awaited
  Done done;
};

struct ControlExchange::Reduction {
  uint32_t tag = 0;
  std::byte* acc = nullptr;
  size_t bytes = 0;
  Combine combine;
  Done done;
  std::vector<int> children;  // TreeChildren
  size_t heard = 0;           // children whose part was combined
  bool sent_up = false;       // the subtree's combination went to the parent
  bool total = false;         // the root's total is in `acc`
};

ControlExchange::ControlExchange(std::string group, int node_rank, int node_count)
    : group_(std::move(group)),
      node_rank_(node_rank),
      node_count_(node_count),
      broken_(static_cast<size_t>(node_count)),
      inbox_(static_cast<size_t>(node_count)) {}

ControlExchange::~ControlExchange() = default;

Status ControlExchange::RefuseExchange(uint32_t tag) const {
  if (Status refused = CheckControlTag(tag); !refused.ok()) return refused;
  if (busy()) return Status::Internal("control exchange started while one is in progress");
  if (closed()) return closed_;
  for (const Status& broken : broken_) {
    if (!broken.ok()) return broken;
  }
  return Status::Ok();
}

void ControlExchange::Post(int to, uint32_t tag, int32_t round, const std::byte* data, size_t bytes,
                           Effects& effects) {
  ControlMessage message{tag, round, std::vector<std::byte>(bytes)};
  if (bytes > 0) std::memcpy(message.bytes.data(), data, bytes);
  effects.posts.emplace_back(to, std::move(message));
}

// ---- the allgather ---------------------------------------------------------------------

void ControlExchange::StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node,
                                     uint32_t tag, Done done, Effects& effects) {
  Status refused = RefuseExchange(tag);
  if (refused.ok() && bytes_per_node.size() != static_cast<size_t>(node_count_)) {
    refused = Status::Internal("control allgather with " + std::to_string(bytes_per_node.size()) +
                               " sizes for " + std::to_string(node_count_) + " nodes");
  }
  if (!refused.ok()) {
    effects.Complete(std::move(done), refused);
    return;
  }
  auto gather = std::make_unique<Gather>();
  gather->tag = tag;
  gather->out = static_cast<std::byte*>(out);
  gather->sizes = std::move(bytes_per_node);
  gather->offsets.assign(static_cast<size_t>(node_count_), 0);
  for (size_t node = 1; node < static_cast<size_t>(node_count_); ++node)
    gather->offsets[node] = gather->offsets[node - 1] + gather->sizes[node - 1];
  gather->done = std::move(done);
  const size_t mine = gather->sizes[node_rank_];
  if (mine > 0 && gather->out + gather->offsets[node_rank_] != in) {
    std::memmove(gather->out + gather->offsets[node_rank_], in, mine);
  }
  gather_ = std::move(gather);
  if (node_count_ > 1) PostRound(effects);
  AdvanceGather(effects);
}

void ControlExchange::PostRound(Effects& effects) {
  const Gather& gather = *gather_;
  const DisseminationRound round = RoundOf(node_rank_, node_count_, gather.round);
  ControlMessage message{gather.tag, gather.round, {}};
  size_t bytes = 0;
  for (int i = 0; i < round.parts; ++i) bytes += gather.sizes[(node_rank_ + i) % node_count_];
  message.bytes.reserve(bytes);
  for (int i = 0; i < round.parts; ++i) {
    const int node = (node_rank_ + i) % node_count_;
    const std::byte* part = gather.out + gather.offsets[node];
    message.bytes.insert(message.bytes.end(), part, part + gather.sizes[node]);
  }
  effects.posts.emplace_back(round.to, std::move(message));
}

void ControlExchange::AdvanceGather(Effects& effects) {
  while (gather_) {
    Gather& gather = *gather_;
    if (gather.held == node_count_) {
      effects.Complete(std::move(gather.done), Status::Ok());
      gather_.reset();
      return;
    }
    const DisseminationRound round = RoundOf(node_rank_, node_count_, gather.round);
    std::deque<ControlMessage>& inbox = inbox_[round.from];
    if (inbox.empty()) return;
    ControlMessage message = std::move(inbox.front());
    inbox.pop_front();
    size_t expected = 0;
    for (int i = 0; i < round.parts; ++i) expected += gather.sizes[(round.from + i) % node_count_];
    if (message.tag != gather.tag || message.round != gather.round ||
        message.bytes.size() != expected) {
      Fail(Mismatch(round.from, gather.tag, expected, "round " + std::to_string(gather.round),
                    message),
           effects);
      return;
    }
    const std::byte* from = message.bytes.data();
    for (int i = 0; i < round.parts; ++i) {
      const int node = (round.from + i) % node_count_;
      if (gather.sizes[node] > 0)
        std::memcpy(gather.out + gather.offsets[node], from, gather.sizes[node]);
      from += gather.sizes[node];
    }
    gather.held += round.parts;
    ++gather.round;
    if (gather.held < node_count_) PostRound(effects);
  }
}

bool ControlExchange::GatherNeeds(int node) const {
  const int rounds = DisseminationRounds(node_count_);
  for (int round = gather_->round; round < rounds; ++round) {
    const DisseminationRound each = RoundOf(node_rank_, node_count_, round);
    // This round's message to `to` is already posted: only later ones still need it.
    if (each.from == node || (round > gather_->round && each.to == node)) return true;
  }
  return false;
}

// ---- the allreduce of summaries --------------------------------------------------------

void ControlExchange::StartAllReduce(const void* in, void* out, size_t bytes, Combine combine,
                                     uint32_t tag, Done done, Effects& effects) {
  if (Status refused = RefuseExchange(tag); !refused.ok()) {
    effects.Complete(std::move(done), refused);
    return;
  }
  auto reduction = std::make_unique<Reduction>();
  reduction->tag = tag;
  reduction->acc = static_cast<std::byte*>(out);
  reduction->bytes = bytes;
  reduction->combine = std::move(combine);
  reduction->done = std::move(done);
  reduction->children = TreeChildren(node_rank_, node_count_);
  if (bytes > 0 && reduction->acc != in) std::memmove(reduction->acc, in, bytes);
  reduction_ = std::move(reduction);
  AdvanceReduction(effects);
}

void ControlExchange::AdvanceReduction(Effects& effects) {
  if (!reduction_) return;
  Reduction& reduction = *reduction_;
  // Takes the next message from `node` if it is there: false when not yet, or on a mismatch
  // (the reduction then failed).
  auto take = [&](int node, int32_t round, ControlMessage* message) {
    std::deque<ControlMessage>& inbox = inbox_[node];
    if (inbox.empty()) return false;
    *message = std::move(inbox.front());
    inbox.pop_front();
    if (message->tag == reduction.tag && message->round == round &&
        message->bytes.size() == reduction.bytes) {
      return true;
    }
    Fail(Mismatch(node, reduction.tag, reduction.bytes,
                  round == kTowardsRoot ? "towards the root" : "from the root", *message),
         effects);
    return false;
  };
  const int parent = TreeParent(node_rank_);
  while (reduction.heard < reduction.children.size()) {
    ControlMessage message;
    if (!take(reduction.children[reduction.heard], kTowardsRoot, &message)) return;
    reduction.combine(reduction.acc, message.bytes.data());
    ++reduction.heard;
  }
  if (!reduction.total && parent < 0) reduction.total = true;
  if (!reduction.total) {
    if (!reduction.sent_up) {  // the subtree's combination, once every child's part came
      reduction.sent_up = true;
      Post(parent, reduction.tag, kTowardsRoot, reduction.acc, reduction.bytes, effects);
    }
    ControlMessage message;
    if (!take(parent, kFromRoot, &message)) return;
    if (reduction.bytes > 0) std::memcpy(reduction.acc, message.bytes.data(), reduction.bytes);
    reduction.total = true;
  }
  for (int child : reduction.children) {
    Post(child, reduction.tag, kFromRoot, reduction.acc, reduction.bytes, effects);
  }
  effects.Complete(std::move(reduction.done), Status::Ok());
  reduction_.reset();
}

bool ControlExchange::ReductionNeeds(int node) const {
  if (node == TreeParent(node_rank_)) return true;
  const std::vector<int>& children = reduction_->children;
  return std::find(children.begin(), children.end(), node) != children.end();
}

// ---- what arrives and what breaks ------------------------------------------------------

void ControlExchange::Deliver(int from, ControlMessage message, Effects& effects) {
  if (from < 0 || from >= node_count_ || from == node_rank_ || closed()) return;
  inbox_[from].push_back(std::move(message));
  Advance(effects);
}

void ControlExchange::Advance(Effects& effects) {
  if (gather_) AdvanceGather(effects);
  if (reduction_) AdvanceReduction(effects);
}

void ControlExchange::Break(int node, const Status& why, Effects& effects) {
  if (node < 0 || node >= node_count_ || node == node_rank_ || !broken_[node].ok()) return;
  broken_[node] = why;
  if ((gather_ && GatherNeeds(node)) || (reduction_ && ReductionNeeds(node))) Fail(why, effects);
}

void ControlExchange::Close(const Status& why, Effects& effects) {
  if (closed()) return;
  closed_ = why;
  for (auto& inbox : inbox_) inbox.clear();
  if (busy()) Fail(why, effects);
}

void ControlExchange::Fail(const Status& status, Effects& effects) {
  if (gather_) effects.Complete(std::move(gather_->done), status);
  if (reduction_) effects.Complete(std::move(reduction_->done), status);
  gather_.reset();
  reduction_.reset();
}

Status ControlExchange::Mismatch(int from, uint32_t tag, size_t bytes, const std::string& what,
                                 const ControlMessage& got) const {
  return Status::Internal("control message mismatch in group '" + group_ + "': expected tag " +
                          std::to_string(tag) + " " + what + " (" + std::to_string(bytes) +
                          " bytes) from sidecar node " + std::to_string(from) + ", got tag " +
                          std::to_string(got.tag) + " round " + std::to_string(got.round) + " (" +
                          std::to_string(got.bytes.size()) + " bytes)");
}

std::vector<int> ControlExchange::AwaitedNodes() const {
  std::vector<int> awaited;
  if (reduction_) {
    const Reduction& reduction = *reduction_;
    int subtree_end = node_rank_ + 1;
    for (size_t i = 0; i < reduction.children.size(); ++i) {
      const int child = reduction.children[i];
      subtree_end = std::min(node_count_, 2 * child - node_rank_);  // child heads [child, end)
      for (int node = child; i >= reduction.heard && node < subtree_end; ++node) {
        awaited.push_back(node);
      }
    }
    if (reduction.heard == reduction.children.size()) {
      for (int node = 0; node < node_count_; ++node) {
        if (node < node_rank_ || node >= subtree_end) awaited.push_back(node);
      }
    }
  } else if (gather_) {
    for (int i = gather_->held; i < node_count_; ++i)
      awaited.push_back((node_rank_ + i) % node_count_);
  }
  std::sort(awaited.begin(), awaited.end());
  return awaited;
}

}  // namespace collectived
