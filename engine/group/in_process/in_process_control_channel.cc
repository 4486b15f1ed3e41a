#include "engine/group/in_process/in_process_control_channel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/group/dissemination.h"

namespace collectived {
namespace {

// The stream of control messages from node `from` to node `to` in one round: ranks far below
// any real rank and PointToPoint's envelope streams.
P2PKey ControlKey(int from, int to, uint32_t tag, int round) {
  return P2PKey{-1'000'000 - from, -1'000'000 - to,
                static_cast<int64_t>(tag) | (static_cast<int64_t>(round) << 32)};
}

}  // namespace

// One allgather in progress, in dissemination rounds (engine/group/dissemination.h) as over
// sockets; its transfers complete on the fabric's worker.
struct InProcessControlChannel::Exchange {
  std::mutex mutex;
  uint32_t tag = 0;
  std::byte* out = nullptr;
  std::vector<size_t> sizes;
  std::vector<size_t> offsets;
  int held = 1;   // parts held: this node's and the next ones' (mod node count)
  int round = 0;  // the round whose parts are awaited
  std::vector<std::vector<std::byte>> outgoing;  // each round's parts, until sent
  std::vector<std::byte> incoming;               // the current round's parts
  int transfers = 0;                             // started, not finished
  Status status;                                 // the first failure
  Done done;
};

InProcessControlChannel::InProcessControlChannel(std::shared_ptr<InProcessLink> link)
    : link_(std::move(link)) {}

void InProcessControlChannel::KeepFirstFailure(const Status& status, Status* first) const {
  if (status.ok() || !first->ok()) return;
  // The fabric's Internal is a size mismatch between a send and its receive: a peer sent
  // another message than the one this exchange expects.
  *first = status.kind() == ErrorKind::kInternal
               ? Status::Internal("control message mismatch in group '" + link_->group() +
                                  "': " + status.message())
               : status;
}

void InProcessControlChannel::StartAllGather(const void* in, void* out,
                                             std::vector<size_t> bytes_per_node, uint32_t tag,
                                             Done done) {
  if (Status refused = CheckControlTag(tag); !refused.ok()) {
    done(refused);
    return;
  }
  const int nodes = node_count();
  const int me = node_rank();
  auto exchange = std::make_shared<Exchange>();
  exchange->tag = tag;
  exchange->out = static_cast<std::byte*>(out);
  exchange->sizes = std::move(bytes_per_node);
  exchange->offsets.assign(nodes, 0);
  for (int node = 1; node < nodes; ++node)
    exchange->offsets[node] = exchange->offsets[node - 1] + exchange->sizes[node - 1];
  if (exchange->sizes[me] > 0 && exchange->out + exchange->offsets[me] != in)
    std::memmove(exchange->out + exchange->offsets[me], in, exchange->sizes[me]);
  if (nodes == 1) {
    done(Status::Ok());
    return;
  }
  exchange->done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = exchange;
  }
  // A slow sidecar (DelayNode) starts its part late, as a sidecar busy elsewhere would.
  link_->AfterDelay([this, exchange] { StartRound(exchange); });
}

void InProcessControlChannel::StartRound(const std::shared_ptr<Exchange>& exchange) {
  const int nodes = node_count();
  const int me = node_rank();
  std::byte* outgoing;
  size_t outgoing_bytes = 0;
  std::byte* incoming;
  size_t incoming_bytes = 0;
  DisseminationRound round;
  int round_index;
  {
    std::lock_guard<std::mutex> lock(exchange->mutex);
    round_index = exchange->round;
    round = RoundOf(me, nodes, round_index);
    std::vector<std::byte> parts;
    for (int i = 0; i < round.parts; ++i) {
      const int node = (me + i) % nodes;
      const std::byte* part = exchange->out + exchange->offsets[node];
      parts.insert(parts.end(), part, part + exchange->sizes[node]);
    }
    for (int i = 0; i < round.parts; ++i)
      incoming_bytes += exchange->sizes[(round.from + i) % nodes];
    exchange->outgoing.push_back(std::move(parts));
    outgoing = exchange->outgoing.back().data();
    outgoing_bytes = exchange->outgoing.back().size();
    exchange->incoming.assign(incoming_bytes, std::byte{0});
    incoming = exchange->incoming.data();
    exchange->transfers += 2;
  }
  // The round is in the key: a part of another round can never be taken for this one.
  const uint32_t tag = exchange->tag;
  link_->StartSend(outgoing, outgoing_bytes, round.to, ControlKey(me, round.to, tag, round_index),
                   [this, exchange](const Status& status) { Finished(exchange, status, false); });
  link_->StartRecv(incoming, incoming_bytes, round.from,
                   ControlKey(round.from, me, tag, round_index),
                   [this, exchange](const Status& status) { Finished(exchange, status, true); });
}

void InProcessControlChannel::Finished(const std::shared_ptr<Exchange>& exchange,
                                       const Status& status, bool received) {
  const int nodes = node_count();
  bool next_round = false;
  Done done;
  Status result;
  {
    std::lock_guard<std::mutex> lock(exchange->mutex);
    --exchange->transfers;
    KeepFirstFailure(status, &exchange->status);
    if (received && status.ok() && exchange->status.ok()) {
      const DisseminationRound round = RoundOf(node_rank(), nodes, exchange->round);
      const std::byte* from = exchange->incoming.data();
      for (int i = 0; i < round.parts; ++i) {
        const int node = (round.from + i) % nodes;
        if (exchange->sizes[node] > 0)
          std::memcpy(exchange->out + exchange->offsets[node], from, exchange->sizes[node]);
        from += exchange->sizes[node];
      }
      exchange->held += round.parts;
      ++exchange->round;
      next_round = exchange->held < nodes;
    }
    // Done once nothing is in flight and either every part is here or something failed.
    if (!next_round && exchange->transfers == 0 &&
        (exchange->held == nodes || !exchange->status.ok()) && exchange->done) {
      done = std::move(exchange->done);
      result = exchange->status;
    }
  }
  if (next_round) {
    StartRound(exchange);
    return;
  }
  if (!done) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_ == exchange) current_.reset();
  }
  done(result);
}

// One allreduce of summaries in progress, up and down the tree.
struct InProcessControlChannel::Reduction {
  std::mutex mutex;
  uint32_t tag = 0;
  std::byte* acc = nullptr;
  size_t bytes = 0;
  Combine combine;
  std::vector<int> children;
  std::vector<std::vector<std::byte>> parts;  // by child
  size_t heard = 0;                           // children's parts received
  bool sent_up = false;
  bool total = false;
  std::vector<std::byte> from_root;
  int transfers = 0;  // started, not finished
  Status status;
  Done done;
};

void InProcessControlChannel::StartAllReduce(const void* in, void* out, size_t bytes,
                                             Combine combine, uint32_t tag, Done done) {
  if (Status refused = CheckControlTag(tag); !refused.ok()) {
    done(refused);
    return;
  }
  auto reduction = std::make_shared<Reduction>();
  reduction->tag = tag;
  reduction->acc = static_cast<std::byte*>(out);
  reduction->bytes = bytes;
  reduction->combine = std::move(combine);
  reduction->children = TreeChildren(node_rank(), node_count());
  reduction->parts.assign(reduction->children.size(), std::vector<std::byte>(bytes));
  reduction->from_root.assign(bytes, std::byte{0});
  if (bytes > 0 && reduction->acc != in) std::memmove(reduction->acc, in, bytes);
  if (node_count() == 1) {
    done(Status::Ok());
    return;
  }
  reduction->done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reducing_ = reduction;
  }
  link_->AfterDelay([this, reduction] {
    {
      std::lock_guard<std::mutex> lock(reduction->mutex);
      reduction->transfers += static_cast<int>(reduction->children.size()) + 1;  // + this step
    }
    for (size_t i = 0; i < reduction->children.size(); ++i) {
      const int child = reduction->children[i];
      link_->StartRecv(reduction->parts[i].data(), reduction->bytes, child,
                       ControlKey(child, node_rank(), reduction->tag, 0),
                       [this, reduction](const Status& status) {
                         {
                           std::lock_guard<std::mutex> lock(reduction->mutex);
                           if (status.ok()) ++reduction->heard;
                         }
                         ReductionStep(reduction, status);
                       });
    }
    ReductionStep(reduction, Status::Ok());
  });
}

void InProcessControlChannel::ReductionStep(const std::shared_ptr<Reduction>& reduction,
                                            const Status& status) {
  const int me = node_rank();
  const int parent = TreeParent(me);
  bool send_up = false, send_down = false;
  Done done;
  Status result;
  {
    std::lock_guard<std::mutex> lock(reduction->mutex);
    --reduction->transfers;
    KeepFirstFailure(status, &reduction->status);
    if (reduction->status.ok() && !reduction->sent_up &&
        reduction->heard == reduction->children.size()) {
      for (const auto& part : reduction->parts) reduction->combine(reduction->acc, part.data());
      reduction->sent_up = true;
      if (parent < 0) {
        reduction->total = true;
        send_down = true;
      } else {
        send_up = true;
        reduction->transfers += 2;
      }
    }
    if (send_down) reduction->transfers += static_cast<int>(reduction->children.size());
    if (!send_up && !send_down && reduction->transfers == 0 &&
        (reduction->total || !reduction->status.ok()) && reduction->done) {
      done = std::move(reduction->done);
      result = reduction->status;
    }
  }
  const uint32_t tag = reduction->tag;
  if (send_up) {
    link_->StartSend(reduction->acc, reduction->bytes, parent, ControlKey(me, parent, tag, 0),
                     [this, reduction](const Status& status) { ReductionStep(reduction, status); });
    link_->StartRecv(reduction->from_root.data(), reduction->bytes, parent,
                     ControlKey(parent, me, tag, 1), [this, reduction](const Status& status) {
                       bool down = false;
                       {
                         std::lock_guard<std::mutex> lock(reduction->mutex);
                         if (status.ok() && reduction->status.ok()) {
                           if (reduction->bytes > 0) {
                             std::memcpy(reduction->acc, reduction->from_root.data(),
                                         reduction->bytes);
                           }
                           reduction->total = true;
                           down = true;
                           reduction->transfers += static_cast<int>(reduction->children.size());
                         }
                       }
                       if (down) SendDown(reduction);
                       ReductionStep(reduction, status);
                     });
  }
  if (send_down) SendDown(reduction);
  if (!done) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (reducing_ == reduction) reducing_.reset();
  }
  done(result);
}

void InProcessControlChannel::SendDown(const std::shared_ptr<Reduction>& reduction) {
  for (int child : reduction->children) {
    link_->StartSend(reduction->acc, reduction->bytes, child,
                     ControlKey(node_rank(), child, reduction->tag, 1),
                     [this, reduction](const Status& status) { ReductionStep(reduction, status); });
  }
}

std::vector<int> InProcessControlChannel::AwaitedNodes() const {
  std::shared_ptr<Exchange> exchange;
  std::shared_ptr<Reduction> reduction;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exchange = current_;
    reduction = reducing_;
  }
  std::vector<int> awaited;
  if (reduction) {
    // Not tracked per subtree here: every other node until the total came.
    std::lock_guard<std::mutex> lock(reduction->mutex);
    for (int node = 0; !reduction->total && node < node_count(); ++node) {
      if (node != node_rank()) awaited.push_back(node);
    }
    return awaited;
  }
  if (!exchange) return awaited;
  std::lock_guard<std::mutex> lock(exchange->mutex);
  for (int i = exchange->held; i < node_count(); ++i)
    awaited.push_back((node_rank() + i) % node_count());
  std::sort(awaited.begin(), awaited.end());
  return awaited;
}

void InProcessControlChannel::Close() {
  link_->Close("sidecar node " + std::to_string(link_->node()) + " closed its connections");
}

}  // namespace collectived
