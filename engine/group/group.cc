#include "engine/group/group.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "engine/op_traits.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long live peers get to answer a roll call after a connection broke. Live sidecars answer
// in milliseconds; the one that died never does, and the failure is reported this much later.
constexpr milliseconds kRollCallBudget{750};

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
      recorder_(spec_.flight_recorder_size),
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

int64_t UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

OpRecord Group::BaseRecord(const OpRequest& r, uint64_t sequence_number) const {
  OpRecord record;
  const int n = topology_.group_size;
  record.group = spec_.name;
  record.sequence_number = sequence_number;
  record.kind = r.kind;
  record.group_size = n;
  const std::vector<TensorView>& any = r.inputs.empty() ? r.outputs : r.inputs;
  if (!any.empty()) {
    record.dtype = any[0].dtype;
    record.count = any[0].count;
  }
  record.bytes = AlgorithmBytes(r, n);
  record.bus_factor = BusBandwidthFactor(r.kind, n);
  record.reducing = IsReducing(r.kind);
  record.reduce_op = r.reduce_op;
  record.root = IsRooted(r.kind) ? r.root : -1;
  record.rank_arrival_us.assign(n, -1);
  return record;
}

OpRecord Group::RecordOf(const PendingOp& op, OpRecord::State state, const Status& status) const {
  const OpRequest* request = nullptr;
  for (const auto& r : op.requests) {
    if (r) request = &*r;
  }
  OpRecord record = request ? BaseRecord(*request, op.sequence_number) : OpRecord{};
  record.state = state;
  record.status = status;
  record.duration =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - op.first_arrival);
  const std::vector<int>& local = topology_.local_ranks();
  std::vector<int64_t> arrivals = op.arrival_unix_us;
  if (arrivals.empty()) {
    arrivals.assign(topology_.group_size, -1);
    for (size_t l = 0; l < local.size() && l < op.local_arrival_unix_us.size(); ++l) {
      if (op.requests[l]) arrivals[local[l]] = op.local_arrival_unix_us[l];
    }
  }
  int64_t first = -1, last = -1;
  for (int rank = 0; rank < static_cast<int>(arrivals.size()); ++rank) {
    int64_t t = arrivals[rank];
    if (t < 0) continue;
    if (first < 0 || t < first) first = t;
    if (last < 0 || t >= arrivals[record.last_rank >= 0 ? record.last_rank : rank]) {
      last = t;
      record.last_rank = rank;
    }
  }
  int64_t local_first = -1;
  for (size_t l = 0; l < local.size() && l < op.local_arrival_unix_us.size(); ++l) {
    if (!op.requests[l]) {
      record.missing_ranks.push_back(local[l]);
    } else if (local_first < 0 || op.local_arrival_unix_us[l] < local_first) {
      local_first = op.local_arrival_unix_us[l];
    }
  }
  record.issued = std::chrono::system_clock::time_point(std::chrono::microseconds(local_first));
  if (first >= 0) {
    for (size_t rank = 0; rank < arrivals.size(); ++rank) {
      if (record.rank_arrival_us.size() > rank) {
        record.rank_arrival_us[rank] = arrivals[rank] < 0 ? -1 : arrivals[rank] - first;
      }
    }
    record.skew = std::chrono::microseconds(last - first);
  }
  record.last_rank_is_local = record.last_rank >= 0 && topology_.LocalIndex(record.last_rank) >= 0;
  return record;
}

void Group::Finished(OpRecord record) {
  if (spec_.observer) spec_.observer->OnOpFinished(record);
  recorder_.Add(std::move(record));
}

std::vector<OpRecord> Group::FlightRecords(size_t limit) const {
  std::vector<OpRecord> records = recorder_.Snapshot(limit);
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_record_) {
    OpRecord running = *running_record_;
    running.duration = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now() - running.issued);
    records.push_back(std::move(running));
  }
  for (const auto& [seq, op] : pending_)
    records.push_back(RecordOf(op, OpRecord::State::kWaitingForPeers, Status::Ok()));
  return records;
}

std::vector<OpRecord> Group::TakeNewlyStuck(std::chrono::milliseconds threshold) {
  std::vector<OpRecord> stuck;
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_ && now - running_->first_arrival > threshold &&
      stuck_reported_.insert(running_->sequence_number).second && running_record_) {
    OpRecord record = *running_record_;
    record.duration =
        std::chrono::duration_cast<std::chrono::microseconds>(now - running_->first_arrival);
    stuck.push_back(std::move(record));
  }
  for (const auto& [seq, op] : pending_) {
    if (now - op.first_arrival > threshold && stuck_reported_.insert(seq).second) {
      stuck.push_back(RecordOf(op, OpRecord::State::kWaitingForPeers, Status::Ok()));
    }
  }
  while (stuck_reported_.size() > 1024) stuck_reported_.erase(stuck_reported_.begin());
  return stuck;
}

std::shared_ptr<Work> Group::Submit(int group_rank, OpRequest request) {
  const int local = topology_.LocalIndex(group_rank);
  OpInfo info{spec_.name, std::string(OpKindName(request.kind)), 0};
  if (group_rank < 0 || group_rank >= topology_.group_size) {
    return FailedWork(info,
                      Status::InvalidArgument("rank " + std::to_string(group_rank) +
                                              " is not part of group '" + spec_.name + "' (size " +
                                              std::to_string(topology_.group_size) + ")"));
  }
  if (local < 0) {
    return FailedWork(info,
                      Status::InvalidArgument("rank " + std::to_string(group_rank) + " of group '" +
                                              spec_.name + "' is not hosted by this sidecar"));
  }
  Status valid = ValidateRequest(request, spec_.name, group_rank, topology_.group_size);
  if (!valid.ok()) {
    OpRecord record = BaseRecord(request, 0);
    record.state = OpRecord::State::kFailed;
    record.status = valid;
    record.issued = std::chrono::system_clock::now();
    Finished(std::move(record));
    return FailedWork(info, valid);
  }
  if (IsPointToPoint(request.kind)) return SubmitPointToPoint(group_rank, std::move(request));

  const milliseconds timeout = request.timeout.count() > 0 ? request.timeout : spec_.timeout;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok())
      return FailedWork(
          info, Annotate(failure_, std::string(info.op) + " on group '" + spec_.name + "'"));
    info.sequence_number = ++issued_[local];
    work = std::make_shared<Work>(info, timeout);
    PendingOp& op = pending_[info.sequence_number];
    if (op.arrived == 0) {
      const size_t count = topology_.local_ranks().size();
      op.sequence_number = info.sequence_number;
      op.requests.resize(count);
      op.works.resize(count);
      op.arrivals.resize(count);
      op.local_arrival_unix_us.assign(count, -1);
      op.first_arrival = Clock::now();
      op.timeout = timeout;
    }
    op.requests[local] = std::move(request);
    op.works[local] = work;
    op.arrivals[local] = Clock::now();
    op.local_arrival_unix_us[local] = UnixMicros();
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
    orphans.insert(orphans.end(), remote_p2p_.begin(), remote_p2p_.end());
    remote_p2p_.clear();
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
    work->Complete(Annotate(reason, info.sequence_number > 0
                                        ? info.Describe()
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
        Finished(RecordOf(op, OpRecord::State::kFailed, reason));
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
    running_ = InFlightOp{op.sequence_number,
                          std::string(OpKindName(op.requests[0]->kind)),
                          topology_.local_ranks(),
                          {},
                          op.first_arrival};
    running_works_ = op.works;
    running_record_ = RecordOf(op, OpRecord::State::kRunning, Status::Ok());
    lock.unlock();

    for (auto& work : op.works) work->MarkStarted();
    Status status = Execute(op);

    lock.lock();
    running_.reset();
    running_record_.reset();
    running_works_.clear();
    ++next_to_run_;
    if (!status.ok() && !failure_.ok()) status = failure_;
    lock.unlock();
    status = Annotate(status, Describe(op));
    for (auto& work : op.works) work->Complete(status);
    Finished(
        RecordOf(op, status.ok() ? OpRecord::State::kCompleted : OpRecord::State::kFailed, status));
    lock.lock();
  }
  std::map<uint64_t, PendingOp> doomed;
  doomed.swap(pending_);
  Status reason =
      failure_.ok() ? Status::Aborted("group '" + spec_.name + "' was destroyed") : failure_;
  executor_done_ = true;
  lock.unlock();
  for (auto& [seq, op] : doomed) {
    for (auto& work : op.works) {
      if (work) work->Complete(Annotate(reason, Describe(op)));
    }
    Finished(RecordOf(op, OpRecord::State::kFailed, reason));
  }
}

Status Group::Execute(PendingOp& op) {
  auto now = Clock::now();
  auto deadline = op.first_arrival + op.timeout;
  milliseconds remaining =
      std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - now));
  const uint32_t tag = static_cast<uint32_t>(op.sequence_number * 64);
  Status agreed = CheckAgreement(op, tag, remaining);
  if (!agreed.ok())
    return agreed.kind() == ErrorKind::kDesync || agreed.IsInvalidArgument()
               ? agreed
               : NetworkError(agreed, op);

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
  return PeerError(status, Describe(op));
}

Status Group::PeerError(const Status& status, const std::string& where) {
  Status reason = status;
  bool from_peer = false;
  if (!status.IsTimeout() && hooks_.lookup_failure) {
    // A broken connection usually means a peer failed first and published why.
    if (std::optional<Status> published = hooks_.lookup_failure()) {
      reason = *published;
      from_peer = true;
    }
  }
  if (!from_peer && reason.kind() == ErrorKind::kPeerLost) reason = NameLostPeers(status);
  reason = Annotate(reason, where);
  Fail(reason, from_peer);
  Status failed = failure();
  return failed.ok() ? reason : Annotate(failed, where);
}

Status Group::NameLostPeers(const Status& broken) {
  std::vector<int> peers;
  std::vector<std::string> peer_ids;
  for (int node = 0; node < topology_.node_count(); ++node) {
    if (node == topology_.my_node) continue;
    peers.push_back(node);
    peer_ids.push_back(topology_.node_ids[node]);
  }
  auto describe = [&](const std::vector<int>& nodes) {
    std::string text;
    for (int node : nodes) text += (text.empty() ? "" : ", ") + topology_.DescribeNode(node);
    return text;
  };
  std::optional<std::vector<int>> silent;
  if (hooks_.roll_call) silent = hooks_.roll_call(peer_ids, kRollCallBudget);
  if (silent && !silent->empty()) {
    std::vector<int> gone;
    for (int index : *silent) gone.push_back(peers[index]);
    const bool others_answered = gone.size() < peers.size();
    // No group name here: every caller annotates with the op and its group.
    return Status::PeerLost("lost " + describe(gone) + ": the connection broke and " +
                            (gone.size() == 1 ? "it" : "they") + " did not answer within " +
                            std::to_string(kRollCallBudget.count()) + " ms" +
                            (others_answered ? " (the other peers did)" : "") + ": " +
                            broken.message());
  }
  return Status::PeerLost("lost the connection to a peer sidecar of group '" + spec_.name +
                          "' (peers: " + describe(peers) + "): " + broken.message());
}

void Group::AbortRank(int group_rank, const Status& reason) {
  const int local = topology_.LocalIndex(group_rank);
  if (local < 0) return;
  std::vector<std::shared_ptr<Work>> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [seq, op] : pending_) {
      if (op.works[local]) doomed.push_back(op.works[local]);
    }
    if (local < static_cast<int>(running_works_.size())) {
      doomed.push_back(running_works_[local]);
    }
    for (auto& [key, box] : mailboxes_) {
      for (auto* queue : {&box.sends, &box.recvs}) {
        for (auto& entry : *queue) {
          if (std::get<0>(key) == group_rank || std::get<1>(key) == group_rank)
            doomed.push_back(entry.second);
        }
      }
    }
  }
  for (auto& work : doomed) {
    const OpInfo& info = work->info();
    work->Complete(Annotate(reason, info.sequence_number > 0
                                        ? info.Describe()
                                        : info.op + " on group '" + spec_.name + "'"));
  }
}

Status Group::CheckAgreement(PendingOp& op, uint32_t tag, milliseconds timeout) {
  const int n = topology_.group_size;
  const std::vector<int>& local = topology_.local_ranks();
  // Each rank's signature travels with its arrival time (for skew and straggler metrics).
  struct Announcement {
    OpSignature signature;
    int64_t arrival_unix_us;
  };
  std::vector<Announcement> mine;
  for (size_t l = 0; l < op.requests.size(); ++l) {
    mine.push_back(
        {MakeSignature(*op.requests[l], op.sequence_number), op.local_arrival_unix_us[l]});
  }
  std::vector<Announcement> all(n);
  std::vector<size_t> bytes_per_node;
  for (const auto& ranks : topology_.ranks_of_node)
    bytes_per_node.push_back(ranks.size() * sizeof(Announcement));
  COLLECTIVED_RETURN_IF_ERROR(
      comm_->AllGatherV(mine.data(), all.data(), bytes_per_node, tag, timeout));
  std::vector<OpSignature> by_rank(n);
  op.arrival_unix_us.assign(n, -1);
  for (int rank = 0; rank < n; ++rank) {
    by_rank[rank] = all[topology_.node_major_position[rank]].signature;
    op.arrival_unix_us[rank] = all[topology_.node_major_position[rank]].arrival_unix_us;
  }

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
  for (const auto& ranks : topology_.ranks_of_node)
    bytes_per_node.push_back(ranks.size() * 2 * n * sizeof(int64_t));
  COLLECTIVED_RETURN_IF_ERROR(
      comm_->AllGatherV(rows.data(), matrix.data(), bytes_per_node, tag + 1, timeout));
  auto row = [&](int rank) {
    return matrix.data() + static_cast<size_t>(topology_.node_major_position[rank]) * 2 * n;
  };
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
  auto work =
      std::make_shared<Work>(OpInfo{spec_.name, std::string(OpKindName(request.kind)), 0}, timeout);
  const std::string where = work->info().op + " (rank " + std::to_string(group_rank) + " " +
                            (is_send ? "to" : "from") + " rank " + std::to_string(request.peer) +
                            ", tag " + std::to_string(request.tag) + ") on group '" + spec_.name +
                            "'";
  TensorView tensor = is_send ? request.inputs[0] : request.outputs[0];
  auto done = std::make_shared<std::atomic<bool>>(false);
  OpRecord record = BaseRecord(request, 0);
  record.issued = std::chrono::system_clock::now();
  record.rank_arrival_us[group_rank] = 0;
  work->AddCallback([this, record, work](const Status& status) mutable {
    record.state = status.ok() ? OpRecord::State::kCompleted : OpRecord::State::kFailed;
    record.status = status;
    record.duration = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now() - record.issued);
    Finished(std::move(record));
  });
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
    peer_threads_.push_back(
        {std::thread([this, work, key, where, done] {
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
  remote_p2p_.insert(work);
  peer_threads_.push_back(
      {std::thread([this, work, tensor, node, slot, is_send, timeout, where, done] {
         work->MarkStarted();
         Status status = is_send ? comm_->Send(tensor.data, tensor.bytes(), node, slot, timeout)
                                 : comm_->Recv(tensor.data, tensor.bytes(), node, slot, timeout);
         {
           std::lock_guard<std::mutex> lock(mutex_);
           remote_p2p_.erase(work);
         }
         if (!status.ok() && !status.IsInvalidArgument()) {
           Status failed = failure();
           status = failed.ok() ? PeerError(status, where) : Annotate(failed, where);
         }
         work->Complete(Annotate(status, where));
         done->store(true);
       }),
       done});
  return work;
}

}  // namespace collectived
