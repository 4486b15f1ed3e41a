#include "engine/group/group.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Status Annotate(const Status& status, const std::string& where) {
  if (status.ok()) return status;
  if (status.message().find(where) != std::string::npos) return status;
  return Status(status.kind(), where + ": " + status.message());
}

std::shared_ptr<Work> FailedWork(OpInfo info, const Status& status) {
  auto work = std::make_shared<Work>(std::move(info), milliseconds(0));
  work->Complete(status);
  return work;
}

bool IsAllToAllFamily(OpKind kind) {
  return kind == OpKind::kAllToAll || kind == OpKind::kAllToAllSingle;
}

}  // namespace

Group::Group(GroupSpec spec, GroupTopology topology, std::unique_ptr<NodeComm> comm, Hooks hooks)
    : spec_(std::move(spec)),
      topology_(std::move(topology)),
      comm_(std::move(comm)),
      hooks_(std::move(hooks)),
      issued_(topology_.local_ranks().size(), 0) {
  executor_ = std::thread([this] { ExecutorLoop(); });
}

void Group::Stop() {
  Fail(Status::Aborted("group '" + spec_.name + "' was destroyed"), /*from_peer=*/true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

bool Group::Finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!executor_done_) return false;
  for (const PeerThread& t : peer_threads_) {
    if (!t.done->load()) return false;
  }
  return true;
}

Group::~Group() {
  Stop();
  executor_.join();
  std::vector<PeerThread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(peer_threads_);
  }
  for (PeerThread& t : threads) t.thread.join();
}

Status Group::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

uint64_t Group::SequenceNumber(int group_rank) const {
  int local = topology_.LocalIndex(group_rank);
  std::lock_guard<std::mutex> lock(mutex_);
  return local < 0 ? 0 : issued_[local];
}

uint64_t Group::SequenceNumber() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return issued_.empty() ? 0 : *std::max_element(issued_.begin(), issued_.end());
}

std::string Group::Describe(const PendingOp& op) const {
  const OpRequest* request = nullptr;
  for (const auto& r : op.requests) {
    if (r) request = &*r;
  }
  std::string name = request ? std::string(OpKindName(request->kind)) : "op";
  return name + " (seq " + std::to_string(op.sequence_number) + ") on group '" + spec_.name + "'";
}

std::shared_ptr<Work> Group::Submit(int group_rank, OpRequest request) {
  const int local = topology_.LocalIndex(group_rank);
  OpInfo info{spec_.name, std::string(OpKindName(request.kind)), 0};
  if (group_rank < 0 || group_rank >= topology_.group_size) {
    return FailedWork(info, Status::InvalidArgument(
                                "rank " + std::to_string(group_rank) + " is not part of group '" +
                                spec_.name + "' (size " + std::to_string(topology_.group_size) + ")"));
  }
  if (local < 0) {
    return FailedWork(info, Status::InvalidArgument("rank " + std::to_string(group_rank) +
                                                    " of group '" + spec_.name +
                                                    "' is not hosted by this sidecar"));
  }
  Status valid = ValidateRequest(request, spec_.name, group_rank, topology_.group_size);
  if (!valid.ok()) return FailedWork(info, valid);
  if (IsPointToPoint(request.kind)) return SubmitPointToPoint(group_rank, std::move(request));

  const milliseconds timeout = request.timeout.count() > 0 ? request.timeout : spec_.timeout;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return FailedWork(info, Annotate(failure_, std::string(info.op) + " on group '" + spec_.name + "'"));
    info.sequence_number = ++issued_[local];
    work = std::make_shared<Work>(info, timeout);
    PendingOp& op = pending_[info.sequence_number];
    if (op.arrived == 0) {
      const size_t count = topology_.local_ranks().size();
      op.sequence_number = info.sequence_number;
      op.requests.resize(count);
      op.works.resize(count);
      op.arrivals.resize(count);
      op.first_arrival = Clock::now();
      op.timeout = timeout;
    }
    op.requests[local] = std::move(request);
    op.works[local] = work;
    op.arrivals[local] = Clock::now();
    ++op.arrived;
  }
  changed_.notify_all();
  return work;
}

void Group::Fail(const Status& reason, bool from_peer) {
  std::vector<std::shared_ptr<Work>> orphans;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return;
    failure_ = reason;
    orphans = running_works_;
    for (auto& [key, box] : mailboxes_) {
      for (auto& entry : box.sends) orphans.push_back(entry.second);
      for (auto& entry : box.recvs) orphans.push_back(entry.second);
    }
    mailboxes_.clear();
  }
  if (!from_peer && hooks_.publish_failure) hooks_.publish_failure(reason);
  comm_->Close();
  changed_.notify_all();
  for (auto& work : orphans) {
    const OpInfo& info = work->info();
    work->Complete(Annotate(reason, info.sequence_number > 0 ? info.Describe()
                                                             : info.op + " on group '" + spec_.name + "'"));
  }
}

std::vector<InFlightOp> Group::InFlight() const {
  std::vector<InFlightOp> result;
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_) result.push_back(*running_);
  for (const auto& [seq, op] : pending_) {
    InFlightOp entry{seq, "", {}, {}, op.first_arrival};
    for (size_t l = 0; l < op.requests.size(); ++l) {
      int rank = topology_.local_ranks()[l];
      if (op.requests[l]) {
        entry.op = std::string(OpKindName(op.requests[l]->kind));
        entry.arrived_local_ranks.push_back(rank);
      } else {
        entry.missing_local_ranks.push_back(rank);
      }
    }
    result.push_back(entry);
  }
  return result;
}

void Group::ExecutorLoop() {
  const size_t local_count = topology_.local_ranks().size();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (!failure_.ok()) {
      std::map<uint64_t, PendingOp> doomed;
      doomed.swap(pending_);
      Status reason = failure_;
      lock.unlock();
      for (auto& [seq, op] : doomed) {
        for (auto& work : op.works) {
          if (work) work->Complete(Annotate(reason, Describe(op)));
        }
      }
      lock.lock();
      changed_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      continue;
    }
    auto it = pending_.find(next_to_run_);
    if (it == pending_.end()) {
      changed_.wait(lock);
      continue;
    }
    PendingOp& waiting = it->second;
    if (waiting.arrived < local_count) {
      auto deadline = waiting.first_arrival + waiting.timeout;
      if (Clock::now() < deadline) {
        changed_.wait_until(lock, deadline);
        continue;
      }
      std::vector<int> missing;
      for (size_t l = 0; l < local_count; ++l) {
        if (!waiting.requests[l]) missing.push_back(topology_.local_ranks()[l]);
      }
      Status timeout = Status::Timeout("Timeout: " + Describe(waiting) + ": ranks " +
                                       FormatRanks(missing) + " never issued it within " +
                                       std::to_string(waiting.timeout.count()) + " ms");
      lock.unlock();
      Fail(timeout);
      lock.lock();
      continue;
    }
    PendingOp op = std::move(waiting);
    pending_.erase(it);
    running_ = InFlightOp{op.sequence_number, std::string(OpKindName(op.requests[0]->kind)),
                          topology_.local_ranks(), {}, op.first_arrival};
    running_works_ = op.works;
    lock.unlock();

    for (auto& work : op.works) work->MarkStarted();
    Status status = Execute(op);

    lock.lock();
    running_.reset();
    running_works_.clear();
    ++next_to_run_;
    if (!status.ok() && !failure_.ok()) status = failure_;
    lock.unlock();
    status = Annotate(status, Describe(op));
    for (auto& work : op.works) work->Complete(status);
    lock.lock();
  }
  std::map<uint64_t, PendingOp> doomed;
  doomed.swap(pending_);
  Status reason = failure_.ok() ? Status::Aborted("group '" + spec_.name + "' was destroyed") : failure_;
  executor_done_ = true;
  lock.unlock();
  for (auto& [seq, op] : doomed) {
    for (auto& work : op.works) {
      if (work) work->Complete(Annotate(reason, Describe(op)));
    }
  }
}

Status Group::Execute(PendingOp& op) {
  auto now = Clock::now();
  auto deadline = op.first_arrival + op.timeout;
  milliseconds remaining = std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - now));
  const uint32_t tag = static_cast<uint32_t>(op.sequence_number * 64);
  Status agreed = CheckAgreement(op, tag, remaining);
  if (!agreed.ok()) return agreed.kind() == ErrorKind::kDesync || agreed.IsInvalidArgument() ? agreed : NetworkError(agreed, op);

  OpContext context{topology_, *comm_, {}, scratch_, tag + 8, remaining};
  for (auto& request : op.requests) context.requests.push_back(&*request);
  Status status;
  switch (op.requests[0]->kind) {
    case OpKind::kAllReduce:
    case OpKind::kAllReduceCoalesced:
      status = RunAllReduce(context);
      break;
    case OpKind::kBroadcast:
      status = RunBroadcast(context);
      break;
    case OpKind::kReduce:
      status = RunReduce(context);
      break;
    case OpKind::kAllGather:
    case OpKind::kAllGatherIntoTensor:
    case OpKind::kAllGatherCoalesced:
      status = RunAllGather(context);
      break;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterTensor:
      status = RunReduceScatter(context);
      break;
    case OpKind::kAllToAll:
    case OpKind::kAllToAllSingle:
    case OpKind::kGather:
    case OpKind::kScatter:
      status = RunAllToAll(context);
      break;
    case OpKind::kBarrier:
      status = RunBarrier(context);
      break;
    default:
      status = Status::Internal("point-to-point op reached the collective executor");
  }
  if (status.ok() || status.IsInvalidArgument()) return status;
  return NetworkError(status, op);
}

Status Group::NetworkError(const Status& status, const PendingOp& op) {
  Status reason = status;
  if (hooks_.lookup_failure) {
    if (std::optional<Status> published = hooks_.lookup_failure()) reason = *published;
  }
  if (reason.kind() == ErrorKind::kPeerLost && reason.message() == status.message()) {
    std::string peers;
    for (int node = 0; node < topology_.node_count(); ++node) {
      if (node == topology_.my_node) continue;
      peers += (peers.empty() ? "" : ", ") + topology_.DescribeNode(node);
    }
    reason = Status::PeerLost("lost the connection to a peer sidecar of group '" + spec_.name +
                              "' (peers: " + peers + "): " + status.message());
  }
  reason = Annotate(reason, Describe(op));
  Fail(reason, /*from_peer=*/reason.message() != Annotate(status, Describe(op)).message());
  return reason;
}

Status Group::CheckAgreement(PendingOp& op, uint32_t tag, milliseconds timeout) {
  const int n = topology_.group_size;
  const std::vector<int>& local = topology_.local_ranks();
  std::vector<OpSignature> mine;
  for (auto& request : op.requests) mine.push_back(MakeSignature(*request, op.sequence_number));
  std::vector<OpSignature> all(n);
  std::vector<size_t> bytes_per_node;
  for (const auto& ranks : topology_.ranks_of_node) bytes_per_node.push_back(ranks.size() * sizeof(OpSignature));
  COLLECTIVED_RETURN_IF_ERROR(comm_->AllGatherV(mine.data(), all.data(), bytes_per_node, tag, timeout));
  std::vector<OpSignature> by_rank(n);
  for (int rank = 0; rank < n; ++rank) by_rank[rank] = all[topology_.node_major_position[rank]];

  std::map<std::string, std::vector<int>> variants;
  for (int rank = 0; rank < n; ++rank) variants[DescribeSignature(by_rank[rank])].push_back(rank);
  if (variants.size() > 1) {
    std::string message = "ranks issued different ops for sequence number " +
                          std::to_string(op.sequence_number) + " of group '" + spec_.name + "':";
    for (const auto& [description, ranks] : variants) {
      message += " ranks " + FormatRanks(ranks) + " issued " + description + ";";
    }
    message.pop_back();
    return Status::Desync(message);
  }
  if (!IsAllToAllFamily(op.requests[0]->kind)) return Status::Ok();

  // Every pair must agree on its block: what a sends to b is what b expects from a.
  std::vector<int64_t> rows;
  for (size_t l = 0; l < local.size(); ++l) {
    auto send = SendCounts(*op.requests[l], local[l], n);
    auto recv = RecvCounts(*op.requests[l], local[l], n);
    rows.insert(rows.end(), send.begin(), send.end());
    rows.insert(rows.end(), recv.begin(), recv.end());
  }
  std::vector<int64_t> matrix(static_cast<size_t>(n) * 2 * n);
  bytes_per_node.clear();
  for (const auto& ranks : topology_.ranks_of_node) bytes_per_node.push_back(ranks.size() * 2 * n * sizeof(int64_t));
  COLLECTIVED_RETURN_IF_ERROR(comm_->AllGatherV(rows.data(), matrix.data(), bytes_per_node, tag + 1, timeout));
  auto row = [&](int rank) { return matrix.data() + static_cast<size_t>(topology_.node_major_position[rank]) * 2 * n; };
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      int64_t sends = row(a)[b];
      int64_t expects = row(b)[n + a];
      if (sends != expects) {
        return Status::Desync(std::string(OpKindName(op.requests[0]->kind)) + " (seq " +
                              std::to_string(op.sequence_number) + ") on group '" + spec_.name +
                              "': rank " + std::to_string(a) + " sends " + std::to_string(sends) +
                              " elements to rank " + std::to_string(b) + " but rank " +
                              std::to_string(b) + " expects " + std::to_string(expects) +
                              " from rank " + std::to_string(a));
      }
    }
  }
  return Status::Ok();
}

void Group::ReapFinishedPeerThreads() {
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = peer_threads_.begin(); it != peer_threads_.end();) {
      if (it->done->load()) {
        finished.push_back(std::move(it->thread));
        it = peer_threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& thread : finished) thread.join();
}

std::shared_ptr<Work> Group::SubmitPointToPoint(int group_rank, OpRequest request) {
  ReapFinishedPeerThreads();
  const bool is_send = request.kind == OpKind::kSend;
  const milliseconds timeout = request.timeout.count() > 0 ? request.timeout : spec_.timeout;
  auto work = std::make_shared<Work>(OpInfo{spec_.name, std::string(OpKindName(request.kind)), 0}, timeout);
  const std::string where = work->info().op + " (rank " + std::to_string(group_rank) + " " +
                            (is_send ? "to" : "from") + " rank " + std::to_string(request.peer) +
                            ", tag " + std::to_string(request.tag) + ") on group '" + spec_.name + "'";
  TensorView tensor = is_send ? request.inputs[0] : request.outputs[0];
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.ok()) {
    work->Complete(Annotate(failure_, where));
    return work;
  }
  if (topology_.LocalIndex(request.peer) >= 0) {
    auto key = is_send ? std::make_tuple(group_rank, request.peer, request.tag)
                       : std::make_tuple(request.peer, group_rank, request.tag);
    Mailbox& box = mailboxes_[key];
    auto& opposite = is_send ? box.recvs : box.sends;
    if (!opposite.empty()) {
      auto [other, other_work] = opposite.front();
      opposite.pop_front();
      const TensorView& from = is_send ? tensor : other;
      const TensorView& to = is_send ? other : tensor;
      Status status;
      if (from.bytes() != to.bytes()) {
        status = Status::InvalidArgument(where + ": the send has " + std::to_string(from.bytes()) +
                                         " bytes but the matching recv expects " +
                                         std::to_string(to.bytes()));
      } else if (from.bytes() > 0) {
        std::memcpy(to.data, from.data, from.bytes());
      }
      work->Complete(status);
      other_work->Complete(status);
      return work;
    }
    (is_send ? box.sends : box.recvs).emplace_back(tensor, work);
    // Unmatched: fail it when its timeout passes.
    peer_threads_.push_back({std::thread([this, work, key, where, done] {
                               if (!work->future().Wait(work->timeout()).IsTimeout()) {
                                 done->store(true);
                                 return;
                               }
                               {
                                 std::lock_guard<std::mutex> lock(mutex_);
                                 auto box = mailboxes_.find(key);
                                 if (box != mailboxes_.end()) {
                                   for (auto* queue : {&box->second.sends, &box->second.recvs}) {
                                     std::erase_if(*queue, [&](const auto& entry) { return entry.second == work; });
                                   }
                                 }
                               }
                               work->Complete(work->TimeoutError(work->timeout()).WithContext(where));
                               done->store(true);
                             }),
                             done});
    return work;
  }
  const int node = topology_.node_of_rank[request.peer];
  const uint64_t slot = is_send ? P2PSlot(group_rank, request.peer, request.tag)
                                : P2PSlot(request.peer, group_rank, request.tag);
  peer_threads_.push_back({std::thread([this, work, tensor, node, slot, is_send, timeout, where, done] {
                             work->MarkStarted();
                             Status status = is_send ? comm_->Send(tensor.data, tensor.bytes(), node, slot, timeout)
                                                     : comm_->Recv(tensor.data, tensor.bytes(), node, slot, timeout);
                             if (!status.ok()) {
                               Status failed = failure();
                               status = failed.ok() ? status : failed;
                             }
                             work->Complete(Annotate(status, where));
                             done->store(true);
                           }),
                           done});
  return work;
}

}  // namespace collectived
