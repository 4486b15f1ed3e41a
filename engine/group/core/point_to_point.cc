#include "engine/group/core/point_to_point.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/vocabulary/timeouts.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// The stream of envelopes from sidecar node `from` to node `to`: negative ranks, so it never
// meets the stream of a real (source, destination, tag).
P2PKey EnvelopeKey(int from, int to) {
  return P2PKey{-1 - from, -1 - to, 0};
}

// The mailbox key of a remote transfer's deadline (no mailbox: it never is in one).
constexpr std::pair<int, int64_t> kRemoteKey{-1, 0};

// Whether a pending op of `source` (a rank or kAnySource) takes a message from `sender`.
bool Takes(int source, int sender) {
  return source == kAnySource || source == sender;
}

}  // namespace

PointToPoint::PointToPoint(std::string group, const GroupTopology& topology, DataBackend& backend,
                           std::shared_ptr<MessageTransport> envelopes, OpAccounting& accounting,
                           Runtime& runtime, ActivityCount& activities,
                           TransportError transport_error)
    : group_(std::move(group)),
      topology_(topology),
      backend_(backend),
      envelopes_(std::move(envelopes)),
      accounting_(accounting),
      runtime_(runtime),
      queue_announced_(backend.capabilities().asynchronous),
      activities_(activities),
      transport_error_(std::move(transport_error)),
      timer_(runtime_.timers(), activities_, [this] { OnTimer(); }) {}

PointToPoint::~PointToPoint() = default;

std::shared_ptr<Work> PointToPoint::Submit(int group_rank, OpRequest request,
                                           milliseconds timeout) {
  const bool is_send = request.kind == OpKind::kSend;
  auto work = std::make_shared<Work>(OpInfo{group_, std::string(OpKindName(request.kind)), 0},
                                     timeout, runtime_.clock());
  const std::string peer =
      request.peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(request.peer);
  const std::string where = work->info().op + " (rank " + std::to_string(group_rank) + " " +
                            (is_send ? "to " : "from ") + peer + ", tag " +
                            std::to_string(request.tag) + ") on group '" + group_ + "'";
  OpRecord record = accounting_.Base(request, 0);
  record.issued = accounting_.WallNow();
  record.known_arrivals_us = {{group_rank, 0}};
  work->AddCallback([this, record = std::move(record)](const Status& status) mutable {
    record.state = status.ok() ? OpRecord::State::kCompleted : OpRecord::State::kFailed;
    record.status = status;
    record.duration = std::chrono::duration_cast<std::chrono::microseconds>(accounting_.WallNow() -
                                                                            record.issued);
    accounting_.Finish(std::move(record));
  });
  std::vector<int> receive_from;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    StartEnvelopeReceiversLocked(receive_from);
  }
  for (int node : receive_from) ReceiveEnvelope(node);
  if (is_send) {
    SubmitSend(group_rank, request.inputs[0], work, where, request.tag, request.peer);
  } else {
    SubmitRecv(group_rank, request.outputs[0], work, where, request.tag, request.peer);
  }
  return work;
}

PointToPoint::Deadlines::iterator PointToPoint::AddDeadlineLocked(
    const Key& key, const std::shared_ptr<Work>& work) {
  auto deadline = deadlines_.emplace(work->deadline(), std::make_pair(key, work));
  ArmTimerLocked();
  return deadline;
}

void PointToPoint::ArmTimerLocked() {
  if (!failure_.ok() || deadlines_.empty()) return;
  timer_.Arm(deadlines_.begin()->first);
}

DataBackend::Done PointToPoint::Counted(DataBackend::Done done) {
  activities_.Enter();
  return [this, done = std::move(done)](const Status& status) {
    done(status);
    activities_.Exit();
  };
}

void PointToPoint::Post(std::function<void()> task) {
  activities_.Enter();
  runtime_.executor().Post([this, task = std::move(task)] {
    task();
    activities_.Exit();
  });
}

void PointToPoint::StartTransfer(bool is_send, void* data, size_t bytes, int node,
                                 const P2PKey& key, DataBackend::Done done) {
  if (is_send) {
    backend_.StartSend(data, bytes, node, key, Counted(std::move(done)));
  } else {
    backend_.StartRecv(data, bytes, node, key, Counted(std::move(done)));
  }
}

void PointToPoint::StartEnvelopeTransfer(bool is_send, void* data, int node, const P2PKey& key,
                                         DataBackend::Done done) {
  if (!envelopes_) {
    done(Status::Internal("an announcement of a send on a group with one sidecar"));
    return;
  }
  if (is_send) {
    envelopes_->StartSend(data, sizeof(Envelope), node, key, Counted(std::move(done)));
  } else {
    envelopes_->StartRecv(data, sizeof(Envelope), node, key, Counted(std::move(done)));
  }
}

void PointToPoint::FinishRemote(const std::shared_ptr<Work>& work, const std::string& where,
                                Status result, int source) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = remote_.find(work); it != remote_.end()) {
      deadlines_.erase(it->second);
      remote_.erase(it);
    }
  }
  if (!result.ok() && !result.IsInvalidArgument()) {
    // The group decides what a broken transfer means (its hooks may block): on the executor.
    Post([this, work, where, result] {
      work->Complete(transport_error_(result, where).WithContextOnce(where));
    });
    return;
  }
  if (result.ok() && source >= 0) work->SetSourceRank(source);
  work->Complete(result.WithContextOnce(where));
}

void PointToPoint::SubmitSend(int group_rank, const TensorView& tensor,
                              const std::shared_ptr<Work>& work, const std::string& where,
                              int64_t tag, int peer) {
  if (topology_.LocalIndex(peer) < 0) {
    SendRemote(group_rank, tensor, work, where, tag, peer);
    return;
  }
  const Key key{peer, tag};
  std::optional<PendingRecv> matched;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) {
      status = failure_.WithContextOnce(where);
    } else {
      Mailbox& box = boxes_[key];
      auto it = std::find_if(box.recvs.begin(), box.recvs.end(),
                             [&](const PendingRecv& r) { return Takes(r.source, group_rank); });
      if (it != box.recvs.end()) {
        matched = std::move(*it);
        box.recvs.erase(it);
        deadlines_.erase(matched->deadline);
      } else if (status = CheckCapacityLocked(where); status.ok()) {
        box.sends.push_back(
            {group_rank, tensor.bytes(), tensor, work, where, AddDeadlineLocked(key, work)});
        return;
      }
      if (box.sends.empty() && box.recvs.empty()) boxes_.erase(key);
    }
  }
  if (matched) {
    CompleteLocal(PendingSend{group_rank, tensor.bytes(), tensor, work, where, {}},
                  std::move(*matched));
    return;
  }
  work->Complete(status);
}

void PointToPoint::SubmitRecv(int group_rank, const TensorView& tensor,
                              const std::shared_ptr<Work>& work, const std::string& where,
                              int64_t tag, int peer) {
  const Key key{group_rank, tag};
  std::optional<PendingSend> matched;
  Status status;
  Status lost;  // the envelopes of the named source's sidecar stopped
  bool queued = false, start_queue = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto stopped = peer == kAnySource ? envelopes_lost_.end()
                                      : envelopes_lost_.find(topology_.node_of_rank[peer]);
    if (!failure_.ok()) {
      status = failure_.WithContextOnce(where);
    } else if (stopped != envelopes_lost_.end()) {
      lost = stopped->second;
    } else {
      Mailbox& box = boxes_[key];
      auto it = std::find_if(box.sends.begin(), box.sends.end(),
                             [&](const PendingSend& s) { return Takes(peer, s.source); });
      if (it != box.sends.end()) {
        matched = std::move(*it);
        box.sends.erase(it);
        if (matched->work) {
          deadlines_.erase(matched->deadline);
        } else {
          remote_.emplace(work, AddDeadlineLocked(kRemoteKey, work));
          if (queue_announced_) {  // in match order, started here if none waits
            start_queue =
                QueueAnnouncedLocked({std::move(*matched), {peer, tensor, work, where, {}}, key});
            queued = true;
          }
        }
      } else if (status = CheckCapacityLocked(where); status.ok()) {
        box.recvs.push_back({peer, tensor, work, where, AddDeadlineLocked(key, work)});
        return;
      }
      if (box.sends.empty() && box.recvs.empty()) boxes_.erase(key);
    }
  }
  if (!lost.ok()) {
    FinishRemote(work, where, lost, -1);
    return;
  }
  if (queued) {
    if (start_queue) StartQueuedAnnounced();
    return;
  }
  if (!matched) {
    work->Complete(status);
    return;
  }
  PendingRecv recv{peer, tensor, work, where, {}};
  if (matched->work) {
    CompleteLocal(std::move(*matched), std::move(recv));
  } else {
    ReceiveAnnounced(*matched, recv, key);
  }
}

void PointToPoint::CompleteLocal(PendingSend send, PendingRecv recv) {
  const size_t from = send.tensor.bytes(), to = recv.tensor.bytes();
  if (from != to) {
    const std::string sizes = ": the send has " + std::to_string(from) +
                              " bytes but the matching recv expects " + std::to_string(to);
    send.work->Complete(Status::InvalidArgument(send.where + sizes));
    recv.work->Complete(Status::InvalidArgument(recv.where + sizes));
    return;
  }
  // Device memory: the copy waits for both tensors' producers and the works complete once the
  // device ran it (an asynchronous backend's Copy returns when it is enqueued).
  Status copied = backend_.AwaitReady(send.tensor);
  if (copied.ok()) copied = backend_.AwaitReady(recv.tensor);
  if (copied.ok()) copied = backend_.Copy(recv.tensor.data, send.tensor.data, from);
  auto complete = [send, recv](const Status& status) {
    if (status.ok()) recv.work->SetSourceRank(send.source);
    send.work->Complete(status.WithContextOnce(send.where));
    recv.work->Complete(status.WithContextOnce(recv.where));
  };
  if (!copied.ok() || !backend_.capabilities().asynchronous) {
    complete(copied);
    return;
  }
  backend_.WhenComplete(Counted(std::move(complete)));
}

void PointToPoint::ReceiveAnnounced(const PendingSend& send, const PendingRecv& recv,
                                    const Key& key) {
  recv.work->MarkStarted();
  // A send of another size than the recv's is still received (and dropped: into null, or for a
  // host backend into scratch memory), so that the stream of its (source, destination, tag)
  // stays in step with its envelopes; the recv fails.
  Status mismatch;
  std::shared_ptr<std::vector<std::byte>> scratch;
  const bool dropped = send.bytes != recv.tensor.bytes();
  if (dropped) {
    mismatch = Status::InvalidArgument(recv.where + ": the send has " + std::to_string(send.bytes) +
                                       " bytes but the matching recv expects " +
                                       std::to_string(recv.tensor.bytes()));
    if (backend_.capabilities().cpu_accessible) {
      scratch = std::make_shared<std::vector<std::byte>>(send.bytes);
    }
  }
  // The tensor's owner (or the scratch memory) stays alive until the transfer is done.
  void* into =
      dropped ? (scratch ? static_cast<void*>(scratch->data()) : nullptr) : recv.tensor.data;
  // The bytes land after the tensor's owner is done with it (a device backend unstages them
  // after its stream); a failure here is the transfer's.
  if (!dropped) {
    if (Status ready = backend_.AwaitReady(recv.tensor); !ready.ok() && mismatch.ok())
      mismatch = ready;
  }
  StartTransfer(false, into, send.bytes, topology_.node_of_rank[send.source],
                P2PKey{send.source, key.first, key.second},
                [this, work = recv.work, where = recv.where, source = send.source, mismatch,
                 owner = recv.tensor.owner, scratch](const Status& result) {
                  FinishRemote(work, where, result.ok() ? mismatch : result, source);
                });
}

void PointToPoint::SendRemote(int group_rank, const TensorView& tensor,
                              const std::shared_ptr<Work>& work, const std::string& where,
                              int64_t tag, int peer) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refused = failure_.ok() ? CheckCapacityLocked(where) : failure_.WithContextOnce(where);
    if (refused.ok()) remote_.emplace(work, AddDeadlineLocked(kRemoteKey, work));
  }
  if (!refused.ok()) {
    work->Complete(refused);
    return;
  }
  work->MarkStarted();
  const int node = topology_.node_of_rank[peer];
  auto envelope = std::make_shared<EnvelopeBytes>();
  const Envelope announced{group_rank, peer, tag, tensor.bytes()};
  std::memcpy(envelope->data(), &announced, sizeof(announced));
  // Envelope and bytes are posted together, so that the streams of every pair of sidecars carry
  // them in the same order. The envelope's failure needs no report: the bytes travel the same
  // connection and fail too.
  // A device backend stages the bytes after its stream, which waits for their producer here.
  if (Status ready = backend_.AwaitReady(tensor); !ready.ok()) {
    FinishRemote(work, where, ready, -1);
    return;
  }
  std::lock_guard<std::mutex> posting(post_mutex_);
  StartEnvelopeTransfer(true, envelope->data(), node, EnvelopeKey(topology_.my_node, node),
                        [envelope](const Status&) {});
  StartTransfer(true, tensor.data, tensor.bytes(), node, P2PKey{group_rank, peer, tag},
                [this, work, where, owner = tensor.owner](const Status& result) {
                  FinishRemote(work, where, result, -1);
                });
}

void PointToPoint::StartEnvelopeReceiversLocked(std::vector<int>& nodes) {
  if (receiving_envelopes_ || !failure_.ok() || topology_.node_count() < 2) return;
  receiving_envelopes_ = true;
  for (int node = 0; node < topology_.node_count(); ++node) {
    if (node != topology_.my_node) nodes.push_back(node);
  }
}

void PointToPoint::ReceiveEnvelope(int node) {
  auto bytes = std::make_shared<EnvelopeBytes>();
  // Waits as long as the group lives (holding nothing but this buffer); closing the group's
  // connections (Group::Fail) ends it.
  StartEnvelopeTransfer(
      false, bytes->data(), node, EnvelopeKey(node, topology_.my_node),
      [this, node, bytes](const Status& status) { OnEnvelope(node, *bytes, status); });
}

void PointToPoint::OnEnvelope(int node, const EnvelopeBytes& bytes, const Status& status) {
  const std::string where = "receiving the announcements of sends from " +
                            topology_.DescribeNode(node) + " on group '" + group_ + "'";
  if (!status.ok()) {
    bool awaited = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_.ok()) return;
      envelopes_lost_[node] = status;
      // A peer that left the group normally closes its connections too: only a recv that waits
      // for one of its ranks makes that a failure of the group.
      for (const auto& [key, box] : boxes_) {
        for (const PendingRecv& recv : box.recvs) {
          if (recv.source != kAnySource && topology_.node_of_rank[recv.source] == node)
            awaited = true;
        }
      }
    }
    // The group fails with the reason; the waiting recvs learn it from FailAll.
    if (awaited) ReportLoss(status, where);
    return;
  }
  Envelope envelope;
  std::memcpy(&envelope, bytes.data(), sizeof(envelope));
  const int n = topology_.group_size;
  if (envelope.source < 0 || envelope.source >= n ||
      topology_.node_of_rank[envelope.source] != node || envelope.destination < 0 ||
      envelope.destination >= n || topology_.LocalIndex(envelope.destination) < 0) {
    const Status garbled =
        Status::Internal("an announcement names source rank " + std::to_string(envelope.source) +
                         " and destination rank " + std::to_string(envelope.destination) +
                         ", which do not live there and here");
    ReportLoss(garbled, where);
    return;
  }
  const Key key{envelope.destination, envelope.tag};
  const PendingSend send{envelope.source, static_cast<size_t>(envelope.bytes), {}, nullptr, "", {}};
  std::optional<PendingRecv> matched;
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return;
    Mailbox& box = boxes_[key];
    auto it = std::find_if(box.recvs.begin(), box.recvs.end(),
                           [&](const PendingRecv& r) { return Takes(r.source, send.source); });
    if (it != box.recvs.end()) {
      matched = std::move(*it);
      box.recvs.erase(it);
      deadlines_.erase(matched->deadline);
      matched->deadline = {};
      remote_.emplace(matched->work, AddDeadlineLocked(kRemoteKey, matched->work));
      if (queue_announced_) {  // not on this thread: see QueueAnnouncedLocked
        post = QueueAnnouncedLocked({send, std::move(*matched), key});
        matched.reset();
      }
      if (box.sends.empty() && box.recvs.empty()) boxes_.erase(key);
    } else {
      box.sends.push_back(send);
    }
  }
  if (matched) ReceiveAnnounced(send, *matched, key);
  if (post) Post([this] { StartQueuedAnnounced(); });
  ReceiveEnvelope(node);
}

bool PointToPoint::QueueAnnouncedLocked(Announced announced) {
  announced_.push_back(std::move(announced));
  return !std::exchange(starting_announced_, true);
}

void PointToPoint::StartQueuedAnnounced() {
  while (true) {
    std::optional<Announced> next;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (announced_.empty() || !failure_.ok()) {
        announced_.clear();
        starting_announced_ = false;
        return;
      }
      next = std::move(announced_.front());
      announced_.pop_front();
      // Its deadline passed while it waited (the group fails): its tensor is the trainer's again.
      if (remote_.count(next->recv.work) == 0) continue;
    }
    ReceiveAnnounced(next->send, next->recv, next->key);
  }
}

std::string PointToPoint::OnGroup(const Work& work) const {
  return work.info().op + " on group '" + group_ + "'";
}

Status PointToPoint::CheckCapacityLocked(const std::string& where) const {
  // One deadline per pending op, local or remote (remote_ indexes the latter's).
  if (deadlines_.size() < kMaxPending) return Status::Ok();
  return Status::ResourceExhausted(where + ": " + std::to_string(kMaxPending) +
                                   " sends and receives of this group are already pending on "
                                   "this sidecar; wait for some to complete");
}

std::optional<std::pair<TensorView, std::string>> PointToPoint::Unqueue(
    const Key& key, const std::shared_ptr<Work>& work) {
  auto box = boxes_.find(key);
  if (box == boxes_.end()) return std::nullopt;
  std::optional<std::pair<TensorView, std::string>> found;
  auto& sends = box->second.sends;
  auto& recvs = box->second.recvs;
  if (auto it = std::find_if(sends.begin(), sends.end(),
                             [&](const PendingSend& s) { return s.work == work; });
      it != sends.end()) {
    found.emplace(it->tensor, it->where);
    deadlines_.erase(it->deadline);
    sends.erase(it);
  } else if (auto it = std::find_if(recvs.begin(), recvs.end(),
                                    [&](const PendingRecv& r) { return r.work == work; });
             it != recvs.end()) {
    found.emplace(it->tensor, it->where);
    deadlines_.erase(it->deadline);
    recvs.erase(it);
  }
  if (sends.empty() && recvs.empty()) boxes_.erase(box);
  return found;
}

void PointToPoint::ReportLoss(const Status& status, const std::string& where) {
  Post([this, status, where] { static_cast<void>(transport_error_(status, where)); });
}

void PointToPoint::OnTimer() {
  std::vector<std::pair<std::shared_ptr<Work>, std::string>> expired;
  std::vector<std::shared_ptr<Work>> stalled;  // remote transfers past their deadline
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timer_.Fired();
    const Clock::TimePoint now = runtime_.clock().Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto [key, work] = deadlines_.begin()->second;
      if (key == kRemoteKey) {
        remote_.erase(work);
        deadlines_.erase(deadlines_.begin());
        stalled.push_back(std::move(work));
        continue;
      }
      std::optional<std::pair<TensorView, std::string>> found = Unqueue(key, work);
      if (!found) {
        deadlines_.erase(deadlines_.begin());  // unreachable: every deadline has its entry
        continue;
      }
      expired.emplace_back(std::move(work), std::move(found->second));
    }
    ArmTimerLocked();
  }
  for (auto& [work, where] : expired) {
    work->Complete(work->TimeoutError(work->timeout()).WithContext(where));
  }
  for (auto& work : stalled) {
    // The transfer's stream is out of step from now on: the group fails (and with it the work).
    const std::string where = OnGroup(*work);
    const Status timeout = work->TimeoutError(work->timeout());
    FinishRemote(work, where, timeout, -1);
  }
  activities_.Exit();
}

void PointToPoint::FailAll(const Status& reason) {
  std::vector<std::shared_ptr<Work>> doomed;
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.ok()) failure_ = reason;
    for (auto& [key, box] : boxes_) {
      for (PendingSend& send : box.sends) {
        if (send.work) doomed.push_back(std::move(send.work));
      }
      for (PendingRecv& recv : box.recvs) doomed.push_back(std::move(recv.work));
    }
    boxes_.clear();
    deadlines_.clear();
    // A transfer still in the transport ends when the group's connections close: fail it now.
    for (auto& [work, deadline] : remote_) doomed.push_back(work);
    remote_.clear();
    announced_.clear();  // their works were in remote_; a posted StartQueuedAnnounced ends
    cancelled = timer_.Cancel();
  }
  for (auto& work : doomed) work->Complete(reason.WithContextOnce(OnGroup(*work)));
  if (cancelled) activities_.Exit();
}

void PointToPoint::FailRank(int group_rank, const Status& reason) {
  std::vector<std::shared_ptr<Work>> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = boxes_.begin(); it != boxes_.end();) {
      const bool to_rank = it->first.first == group_rank;
      auto& sends = it->second.sends;
      auto& recvs = it->second.recvs;
      // Its own ops, and local ones waiting for it by name; announced sends to it are dropped.
      for (auto s = sends.begin(); s != sends.end();) {
        if (!to_rank && !(s->work && s->source == group_rank)) {
          ++s;
          continue;
        }
        if (s->work) {
          deadlines_.erase(s->deadline);
          doomed.push_back(std::move(s->work));
        }
        s = sends.erase(s);
      }
      for (auto r = recvs.begin(); r != recvs.end();) {
        if (!to_rank && r->source != group_rank) {
          ++r;
          continue;
        }
        deadlines_.erase(r->deadline);
        doomed.push_back(std::move(r->work));
        r = recvs.erase(r);
      }
      it = sends.empty() && recvs.empty() ? boxes_.erase(it) : std::next(it);
    }
  }
  for (auto& work : doomed) work->Complete(reason.WithContextOnce(OnGroup(*work)));
}

}  // namespace collectived
