#include "engine/group/point_to_point.h"

#include <algorithm>
#include <vector>

namespace collectived {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

PointToPoint::PointToPoint(std::string group, const GroupTopology& topology, DataBackend& backend,
                           OpAccounting& accounting, TransportError transport_error)
    : group_(std::move(group)),
      topology_(topology),
      backend_(backend),
      accounting_(accounting),
      transport_error_(std::move(transport_error)) {}

PointToPoint::~PointToPoint() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  timer_wakeup_.notify_all();
  if (timer_.joinable()) timer_.join();
}

std::shared_ptr<Work> PointToPoint::Submit(int group_rank, OpRequest request,
                                           milliseconds timeout) {
  const bool is_send = request.kind == OpKind::kSend;
  auto work =
      std::make_shared<Work>(OpInfo{group_, std::string(OpKindName(request.kind)), 0}, timeout);
  const std::string where = work->info().op + " (rank " + std::to_string(group_rank) + " " +
                            (is_send ? "to" : "from") + " rank " + std::to_string(request.peer) +
                            ", tag " + std::to_string(request.tag) + ") on group '" + group_ + "'";
  OpRecord record = accounting_.Base(request, 0);
  record.issued = std::chrono::system_clock::now();
  record.rank_arrival_us[group_rank] = 0;
  work->AddCallback([this, record = std::move(record)](const Status& status) mutable {
    record.state = status.ok() ? OpRecord::State::kCompleted : OpRecord::State::kFailed;
    record.status = status;
    record.duration = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now() - record.issued);
    accounting_.Finish(std::move(record));
  });
  const TensorView tensor = is_send ? request.inputs[0] : request.outputs[0];
  if (topology_.LocalIndex(request.peer) >= 0) {
    return SubmitLocal(is_send, group_rank, tensor, work, where, request.tag, request.peer);
  }
  SubmitRemote(is_send, group_rank, tensor, work, where, request.tag, request.peer, timeout);
  return work;
}

std::shared_ptr<Work> PointToPoint::SubmitLocal(bool is_send, int group_rank,
                                                const TensorView& tensor,
                                                const std::shared_ptr<Work>& work,
                                                const std::string& where, int64_t tag, int peer) {
  const Key key = is_send ? Key{group_rank, peer, tag} : Key{peer, group_rank, tag};
  Entry matched;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) {
      status = failure_.WithContextOnce(where);
    } else {
      Mailbox& box = boxes_[key];
      std::deque<Entry>& opposite = is_send ? box.recvs : box.sends;
      if (!opposite.empty()) {
        matched = std::move(opposite.front());
        opposite.pop_front();
        deadlines_.erase(matched.deadline);
      } else if (status = CheckCapacityLocked(where); status.ok()) {
        auto deadline =
            deadlines_.emplace(Clock::now() + work->timeout(), std::make_pair(key, work));
        (is_send ? box.sends : box.recvs).push_back({tensor, work, where, deadline});
        if (!timer_.joinable()) timer_ = std::thread([this] { TimerLoop(); });
        timer_wakeup_.notify_all();
        return work;
      }
      if (box.sends.empty() && box.recvs.empty()) boxes_.erase(key);
    }
  }
  if (status.ok()) {
    const TensorView& from = is_send ? tensor : matched.tensor;
    const TensorView& to = is_send ? matched.tensor : tensor;
    if (from.bytes() != to.bytes()) {
      status = Status::InvalidArgument(where + ": the send has " + std::to_string(from.bytes()) +
                                       " bytes but the matching recv expects " +
                                       std::to_string(to.bytes()));
    } else {
      backend_.Copy(to.data, from.data, from.bytes());
    }
    matched.work->Complete(status);
  }
  work->Complete(status);
  return work;
}

void PointToPoint::SubmitRemote(bool is_send, int group_rank, const TensorView& tensor,
                                const std::shared_ptr<Work>& work, const std::string& where,
                                int64_t tag, int peer, milliseconds timeout) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refused = failure_.ok() ? CheckCapacityLocked(where) : failure_.WithContextOnce(where);
    if (refused.ok()) remote_.insert(work);
  }
  if (!refused.ok()) {
    work->Complete(refused);
    return;
  }
  work->MarkStarted();
  const int node = topology_.node_of_rank[peer];
  const DataBackend::P2PKey key{is_send ? group_rank : peer, is_send ? peer : group_rank, tag};
  auto done = [this, work, where](const Status& result) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      remote_.erase(work);
    }
    Status status = result;
    if (!status.ok() && !status.IsInvalidArgument()) status = transport_error_(status, where);
    work->Complete(status.WithContextOnce(where));
  };
  // The tensor's owner keeps its memory alive until the transfer is done.
  if (is_send) {
    backend_.StartSend(tensor.data, tensor.bytes(), node, key, timeout,
                       [done, owner = tensor.owner](const Status& s) { done(s); });
  } else {
    backend_.StartRecv(tensor.data, tensor.bytes(), node, key, timeout,
                       [done, owner = tensor.owner](const Status& s) { done(s); });
  }
}

std::string PointToPoint::OnGroup(const Work& work) const {
  return work.info().op + " on group '" + group_ + "'";
}

Status PointToPoint::CheckCapacityLocked(const std::string& where) const {
  if (deadlines_.size() + remote_.size() < kMaxPending) return Status::Ok();
  return Status::ResourceExhausted(where + ": " + std::to_string(kMaxPending) +
                                 " sends and receives of this group are already pending on this "
                                 "sidecar; wait for some to complete");
}

std::optional<PointToPoint::Entry> PointToPoint::Unqueue(const Key& key,
                                                         const std::shared_ptr<Work>& work) {
  auto box = boxes_.find(key);
  if (box == boxes_.end()) return std::nullopt;
  std::optional<Entry> found;
  for (std::deque<Entry>* queue : {&box->second.sends, &box->second.recvs}) {
    auto it =
        std::find_if(queue->begin(), queue->end(), [&](const Entry& e) { return e.work == work; });
    if (it == queue->end()) continue;
    found = std::move(*it);
    queue->erase(it);
    deadlines_.erase(found->deadline);
    break;
  }
  if (box->second.sends.empty() && box->second.recvs.empty()) boxes_.erase(box);
  return found;
}

void PointToPoint::TimerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (deadlines_.empty()) {
      timer_wakeup_.wait(lock);
      continue;
    }
    auto first = deadlines_.begin();
    // A copy: the entry may be erased while this thread waits.
    const Clock::time_point deadline = first->first;
    if (Clock::now() < deadline) {
      timer_wakeup_.wait_until(lock, deadline);
      continue;
    }
    auto [key, work] = first->second;
    std::optional<Entry> expired = Unqueue(key, work);
    if (!expired) {
      deadlines_.erase(first);  // unreachable: every deadline has its entry
      continue;
    }
    lock.unlock();
    work->Complete(work->TimeoutError(work->timeout()).WithContext(expired->where));
    lock.lock();
  }
}

void PointToPoint::FailAll(const Status& reason) {
  std::vector<Entry> orphans;
  std::vector<std::shared_ptr<Work>> remote;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.ok()) failure_ = reason;
    for (auto& [key, box] : boxes_) {
      for (std::deque<Entry>* queue : {&box.sends, &box.recvs}) {
        for (Entry& e : *queue) orphans.push_back(std::move(e));
      }
    }
    boxes_.clear();
    deadlines_.clear();
    // A transfer blocked in the transport may only end at its own timeout: fail it now.
    remote.assign(remote_.begin(), remote_.end());
    remote_.clear();
  }
  for (Entry& e : orphans) remote.push_back(std::move(e.work));
  for (auto& work : remote) work->Complete(reason.WithContextOnce(OnGroup(*work)));
}

void PointToPoint::FailRank(int group_rank, const Status& reason) {
  std::vector<Entry> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = boxes_.begin(); it != boxes_.end();) {
      const auto& [source, destination, tag] = it->first;
      if (source != group_rank && destination != group_rank) {
        ++it;
        continue;
      }
      for (std::deque<Entry>* queue : {&it->second.sends, &it->second.recvs}) {
        for (Entry& e : *queue) {
          deadlines_.erase(e.deadline);
          doomed.push_back(std::move(e));
        }
      }
      it = boxes_.erase(it);
    }
  }
  for (Entry& e : doomed) e.work->Complete(reason.WithContextOnce(OnGroup(*e.work)));
}

bool PointToPoint::Idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remote_.empty() && deadlines_.empty() && backend_.Idle();
}

}  // namespace collectived
