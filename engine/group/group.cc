#include "engine/group/group.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "engine/group/algorithms.h"
#include "engine/group/job_token.h"
#include "engine/op_traits.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long live peers get to answer a roll call after a connection broke. Live sidecars answer
// in milliseconds; the one that died never does, and the failure is reported this much later.
constexpr milliseconds kRollCallBudget{750};

std::shared_ptr<Work> FailedWork(OpInfo info, const Status& status) {
  auto work = std::make_shared<Work>(std::move(info), milliseconds(0));
  work->Complete(status);
  return work;
}

// Ops whose per-pair block sizes differ from rank to rank, so that the signature cannot carry
// them: every pair is checked instead (gather and scatter have one count, in the signature).
bool HasPerPairCounts(OpKind kind) {
  const OpTraits& traits = TraitsOf(kind);
  return traits.family == OpFamily::kAllToAll && !traits.rooted;
}

}  // namespace

Group::Group(GroupSpec spec, GroupTopology topology, GroupTransport transport, Hooks hooks)
    : spec_(std::move(spec)),
      topology_(std::move(topology)),
      control_(std::move(transport.control)),
      data_(std::move(transport.data)),
      hooks_(std::move(hooks)),
      accounting_(spec_.name, spec_.device, topology_, spec_.observer, spec_.flight_recorder_size),
      point_to_point_(spec_.name, topology_, *data_, accounting_,
                      [this](const Status& error, const std::string& where) {
                        return PeerError(error, where);
                      }),
      issued_(topology_.local_ranks().size(), 0) {
  executor_ = std::thread([this] { ExecutorLoop(); });
}

void Group::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  Fail(Status::Aborted("group '" + spec_.name + "' was destroyed"), /*from_peer=*/true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

bool Group::ThreadsExited() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!executor_done_) return false;
  }
  return point_to_point_.Idle();
}

Group::~Group() {
  Stop();
  executor_.join();
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
  const OpRequest* request = op.AnyRequest();
  std::string name = request ? std::string(OpKindName(request->kind)) : "op";
  return name + " (seq " + std::to_string(op.sequence_number) + ") on group '" + spec_.name + "'";
}

std::vector<OpRecord> Group::FlightRecords(size_t limit) const {
  std::vector<OpRecord> records = accounting_.Finished(limit);
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_) {
    OpRecord running = running_->record;
    running.duration = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now() - running.issued);
    records.push_back(std::move(running));
  }
  for (const auto& [seq, op] : pending_)
    records.push_back(accounting_.Of(op, OpRecord::State::kWaitingForPeers, Status::Ok()));
  return records;
}

std::vector<OpRecord> Group::TakeNewlyStuck(milliseconds threshold) {
  std::vector<OpRecord> stuck;
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_ && now - running_->in_flight.first_arrival > threshold &&
      accounting_.FirstStuckReport(running_->in_flight.sequence_number)) {
    OpRecord record = running_->record;
    record.duration = std::chrono::duration_cast<std::chrono::microseconds>(
        now - running_->in_flight.first_arrival);
    stuck.push_back(std::move(record));
  }
  for (const auto& [seq, op] : pending_) {
    if (now - op.first_arrival > threshold && accounting_.FirstStuckReport(seq)) {
      stuck.push_back(accounting_.Of(op, OpRecord::State::kWaitingForPeers, Status::Ok()));
    }
  }
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
  Status valid =
      ValidateRequest(request, spec_.name, group_rank, topology_.group_size, data_->device_kind());
  if (!valid.ok()) {
    OpRecord record = accounting_.Base(request, 0);
    record.state = OpRecord::State::kFailed;
    record.status = valid;
    record.issued = std::chrono::system_clock::now();
    accounting_.Finish(std::move(record));
    return FailedWork(info, valid);
  }
  const milliseconds timeout =
      request.timeout == kUseGroupTimeout ? spec_.timeout : request.timeout;
  if (IsPointToPoint(request.kind)) {
    return point_to_point_.Submit(group_rank, std::move(request), timeout);
  }

  std::shared_ptr<Work> work;
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!failure_.ok())
      return FailedWork(info, failure_.WithContextOnce(info.op + " on group '" + spec_.name + "'"));
    info.sequence_number = ++issued_[local];
    work = std::make_shared<Work>(info, timeout);
    PendingOp& op = pending_[info.sequence_number];
    if (op.arrived == 0) {
      const size_t count = topology_.local_ranks().size();
      op.sequence_number = info.sequence_number;
      op.requests.resize(count);
      op.works.resize(count);
      op.local_arrival_unix_us.assign(count, -1);
      op.first_arrival = Clock::now();
      op.timeout = timeout;
    }
    op.requests[local] = std::move(request);
    op.works[local] = work;
    op.local_arrival_unix_us[local] = UnixMicros();
    ++op.arrived;
    // Read before RunNext, which takes the op out of pending_.
    const bool first_arrival = op.arrived == 1;
    const bool complete = op.arrived == op.requests.size();
    const Clock::time_point deadline = op.first_arrival + op.timeout;
    // The last local rank of a one-node group on host memory runs the op itself when it is next
    // in line: waking the executor costs more than a small op, and such an op never waits for
    // another node (nothing it does can block this thread on a peer).
    bool ran_here = false;
    if (topology_.node_count() == 1 && data_->device_kind() == DeviceKind::kCpu && complete &&
        info.sequence_number == next_to_run_ && !running_ && !stopping_) {
      RunNext(lock, pending_.find(info.sequence_number));
      ran_here = true;
    }
    // The executor is woken only for what it must do before it would wake anyway: run an op
    // whose local ranks all arrived, or watch a deadline sooner than its own. In a one-node
    // group whose ops the last rank runs, it so sleeps through op after op.
    const bool next_runnable = ran_here ? pending_.count(next_to_run_) > 0 : complete && !running_;
    wake = next_runnable || (first_arrival && deadline < executor_sleeps_until_);
  }
  if (wake) changed_.notify_all();
  return work;
}

void Group::Fail(const Status& reason, bool from_peer, uint64_t peer_completed_through) {
  std::vector<std::shared_ptr<Work>> orphans;
  uint64_t completed_through = 0;
  bool in_use = false;  // not the teardown of an idle group
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return;
    if (from_peer && running_ && running_->in_flight.sequence_number <= peer_completed_through) {
      // The peer finished this op: let it finish here too (or fail on its own, should a transfer
      // it still needs break); the executor applies the failure once it concludes.
      if (!deferred_failure_) deferred_failure_ = reason;
      return;
    }
    failure_ = reason;
    if (running_) orphans = running_->works;
    completed_through = next_to_run_ - 1;
    in_use = !stop_requested_ || running_ || !pending_.empty();
  }
  point_to_point_.FailAll(reason);
  if (!from_peer && hooks_.publish_failure) hooks_.publish_failure(reason, completed_through);
  control_->Close();
  data_->Abort();
  if (in_use) accounting_.BackendAborted(reason.kind());
  changed_.notify_all();
  for (auto& work : orphans) work->Complete(reason.WithContextOnce(work->info().Describe()));
}

std::vector<InFlightOp> Group::InFlight() const {
  std::vector<InFlightOp> result;
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_) result.push_back(running_->in_flight);
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

void Group::Conclude(PendingOp& op, const Status& status) {
  Status annotated = status.WithContextOnce(Describe(op));
  // Recorded before the works complete, so that a rank whose wait returned finds its op in the
  // flight recorder.
  accounting_.Finish(accounting_.Of(
      op, annotated.ok() ? OpRecord::State::kCompleted : OpRecord::State::kFailed, annotated));
  for (auto& work : op.works) {
    if (work) work->Complete(annotated);
  }
}

void Group::RunNext(std::unique_lock<std::mutex>& lock,
                    std::map<uint64_t, PendingOp>::iterator it) {
  PendingOp op = std::move(it->second);
  pending_.erase(it);
  running_ = RunningOp{InFlightOp{op.sequence_number,
                                  std::string(OpKindName(op.requests[0]->kind)),
                                  topology_.local_ranks(),
                                  {},
                                  op.first_arrival},
                       op.works, accounting_.Of(op, OpRecord::State::kRunning, Status::Ok())};
  lock.unlock();

  for (auto& work : op.works) work->MarkStarted();
  Status status = Execute(op);

  lock.lock();
  running_.reset();
  ++next_to_run_;
  if (!status.ok() && !failure_.ok()) status = failure_;
  std::optional<Status> deferred = std::exchange(deferred_failure_, std::nullopt);
  lock.unlock();
  Conclude(op, status);
  if (deferred) Fail(*deferred, /*from_peer=*/true);
  lock.lock();
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
      for (auto& [seq, op] : doomed) Conclude(op, reason);
      lock.lock();
      changed_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      continue;
    }
    auto it = pending_.find(next_to_run_);
    if (it == pending_.end()) {
      WaitForChange(lock, Clock::time_point::max());
      continue;
    }
    PendingOp& waiting = it->second;
    if (waiting.arrived < local_count) {
      auto deadline = waiting.first_arrival + waiting.timeout;
      if (Clock::now() < deadline) {
        WaitForChange(lock, deadline);
        continue;
      }
      std::vector<int> missing;
      for (size_t l = 0; l < local_count; ++l) {
        if (!waiting.requests[l]) missing.push_back(topology_.local_ranks()[l]);
      }
      Status timeout = Status::Timeout("Timeout: " + Describe(waiting) + " Timed out after " +
                                       std::to_string(waiting.timeout.count()) + " ms: ranks " +
                                       FormatRanks(missing) + " never issued it");
      lock.unlock();
      Fail(timeout);
      lock.lock();
      continue;
    }
    RunNext(lock, it);
  }
  std::map<uint64_t, PendingOp> doomed;
  doomed.swap(pending_);
  Status reason =
      failure_.ok() ? Status::Aborted("group '" + spec_.name + "' was destroyed") : failure_;
  executor_done_ = true;
  lock.unlock();
  for (auto& [seq, op] : doomed) Conclude(op, reason);
}

void Group::WaitForChange(std::unique_lock<std::mutex>& lock, Clock::time_point until) {
  executor_sleeps_until_ = until;
  if (until == Clock::time_point::max()) {
    changed_.wait(lock);
  } else {
    changed_.wait_until(lock, until);
  }
  executor_sleeps_until_ = Clock::time_point::min();
}

namespace {

// The algorithm of the op's family (engine/group/algorithms.h).
Status RunAlgorithm(OpContext& context) {
  switch (TraitsOf(context.requests[0]->kind).family) {
    case OpFamily::kAllReduce:
      return RunAllReduce(context);
    case OpFamily::kBroadcast:
      return RunBroadcast(context);
    case OpFamily::kReduce:
      return RunReduce(context);
    case OpFamily::kAllGather:
      return RunAllGather(context);
    case OpFamily::kReduceScatter:
      return RunReduceScatter(context);
    case OpFamily::kAllToAll:
      return RunAllToAll(context);
    case OpFamily::kBarrier:
      return RunBarrier(context);
    case OpFamily::kPointToPoint:
    case OpFamily::kNone:
      break;
  }
  return Status::Internal(std::string(OpKindName(context.requests[0]->kind)) +
                          " reached the collective executor");
}

}  // namespace

Status Group::Execute(PendingOp& op) {
  auto deadline = op.first_arrival + op.timeout;
  milliseconds remaining =
      std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  const OpTags tags(op.sequence_number);
  std::vector<std::byte> slots;
  bool piggybacked = false;
  Status agreed = CheckAgreement(op, tags, remaining, &slots, &piggybacked);
  if (agreed.IsTimeout()) {
    // Every local rank issued the op, so the ones that did not are among the other sidecars'
    // ranks; the exchange cannot tell which of them.
    std::vector<int> remote;
    for (int rank = 0; rank < topology_.group_size; ++rank) {
      if (topology_.LocalIndex(rank) < 0) remote.push_back(rank);
    }
    agreed = Status::Timeout(
        Describe(op) + " Timed out after " + std::to_string(op.timeout.count()) +
        " ms waiting for ranks " + FormatRanks(remote) +
        " of the other sidecars (one or more never issued it): " + agreed.message());
  }
  if (!agreed.ok()) {
    return agreed.kind() == ErrorKind::kDesync || agreed.IsInvalidArgument()
               ? agreed
               : PeerError(agreed, Describe(op));
  }

  OpContext context{topology_, *data_, {}, tags, remaining};
  for (auto& request : op.requests) context.requests.push_back(&*request);
  for (const OpRequest* request : context.requests) {
    for (const auto* tensors : {&request->inputs, &request->outputs}) {
      for (const TensorView& tensor : *tensors) {
        if (!tensor.ready) continue;
        if (Status ready = data_->AwaitReady(tensor); !ready.ok()) {
          if (!ready.IsInvalidArgument()) accounting_.BackendError(ready.kind());
          return PeerError(ready, Describe(op));
        }
      }
    }
  }
  // A small allreduce needs no second round: the exchange carried every node's contribution.
  Status status = piggybacked ? FinishSmallAllReduce(context, slots.data() + kPiggybackHeaderBytes,
                                                     kPiggybackSlotBytes)
                              : RunAlgorithm(context);
  if (status.ok()) NotifyEnqueued(context);
  if (status.ok()) status = data_->Flush(remaining);
  if (status.ok() || status.IsInvalidArgument()) return status;
  accounting_.BackendError(status.kind());
  return PeerError(status, Describe(op));
}

void Group::NotifyEnqueued(const OpContext& context) {
  bool wanted = false;
  for (const OpRequest* request : context.requests) wanted = wanted || request->on_enqueued;
  if (!wanted) return;
  StatusOr<std::string> event = data_->RecordCompletionEvent();
  // Without an event the trainers wait for the op's completion, as for host memory.
  if (!event.ok() || event->empty()) return;
  for (const OpRequest* request : context.requests) {
    if (request->on_enqueued) request->on_enqueued(*event);
  }
}

Status Group::PeerError(const Status& status, const std::string& where) {
  // Already failed: that reason stands (no store lookup, no roll call).
  if (Status failed = failure(); !failed.ok()) return failed.WithContextOnce(where);
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
  reason = reason.WithContextOnce(where);
  Fail(reason, from_peer);
  Status failed = failure();
  return failed.ok() ? reason : failed.WithContextOnce(where);
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
    if (running_ && local < static_cast<int>(running_->works.size())) {
      doomed.push_back(running_->works[local]);
    }
  }
  point_to_point_.FailRank(group_rank, reason);
  for (auto& work : doomed) work->Complete(reason.WithContextOnce(work->info().Describe()));
}
Status Group::CheckAgreement(PendingOp& op, const OpTags& tags, milliseconds timeout,
                             std::vector<std::byte>* slots, bool* piggybacked) {
  *piggybacked = false;
  const int n = topology_.group_size;
  const std::vector<int>& local = topology_.local_ranks();
  // Each rank's signature travels with its arrival time (for skew and straggler metrics).
  struct Announcement {
    OpSignature signature;
    int64_t arrival_unix_us;
  };
  // Across nodes, each node's announcements are followed by a slot of a fixed size, whatever
  // the op: nodes that disagree about the op (a desync) still exchange the same byte counts.
  const size_t slot_bytes = topology_.node_count() > 1 ? kPiggybackSlotBytes : 0;
  const size_t my_bytes = local.size() * sizeof(Announcement) + slot_bytes;
  std::vector<std::byte> mine(my_bytes);
  for (size_t l = 0; l < op.requests.size(); ++l) {
    const Announcement announcement{MakeSignature(*op.requests[l], op.sequence_number),
                                    op.local_arrival_unix_us[l]};
    std::memcpy(mine.data() + l * sizeof(Announcement), &announcement, sizeof(Announcement));
  }
  if (slot_bytes > 0) {
    std::byte* slot = mine.data() + local.size() * sizeof(Announcement);
    std::vector<const OpRequest*> requests;
    for (const auto& request : op.requests) requests.push_back(&*request);
    if (PackSmallAllReduce(*data_, requests, slot + kPiggybackHeaderBytes,
                           kPiggybackPayloadBytes)) {
      slot[0] = std::byte{1};
    }
  }
  std::vector<size_t> bytes_per_node;
  std::vector<size_t> node_offset;
  size_t total = 0;
  for (const auto& ranks : topology_.ranks_of_node) {
    node_offset.push_back(total);
    bytes_per_node.push_back(ranks.size() * sizeof(Announcement) + slot_bytes);
    total += bytes_per_node.back();
  }
  std::vector<std::byte> all(total);
  COLLECTIVED_RETURN_IF_ERROR(control_->AllGather(mine.data(), all.data(), bytes_per_node,
                                                  tags.Control<OpTags::kSignatures>(), timeout));
  std::vector<OpSignature> by_rank(n);
  op.arrival_unix_us.assign(n, -1);
  for (int node = 0; node < topology_.node_count(); ++node) {
    const std::vector<int>& ranks = topology_.ranks_of_node[node];
    for (size_t i = 0; i < ranks.size(); ++i) {
      Announcement announcement;
      std::memcpy(&announcement, all.data() + node_offset[node] + i * sizeof(Announcement),
                  sizeof(Announcement));
      by_rank[ranks[i]] = announcement.signature;
      op.arrival_unix_us[ranks[i]] = announcement.arrival_unix_us;
    }
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
  if (slot_bytes > 0) {
    // The same op everywhere, so every node decided alike; still, use the slots only if each
    // one was filled.
    slots->resize(static_cast<size_t>(topology_.node_count()) * kPiggybackSlotBytes);
    bool all_filled = true;
    for (int node = 0; node < topology_.node_count(); ++node) {
      const std::byte* slot = all.data() + node_offset[node] + bytes_per_node[node] - slot_bytes;
      all_filled = all_filled && slot[0] == std::byte{1};
      std::memcpy(slots->data() + node * kPiggybackSlotBytes, slot, kPiggybackSlotBytes);
    }
    *piggybacked = all_filled;
  }
  if (!HasPerPairCounts(op.requests[0]->kind)) return Status::Ok();

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
  COLLECTIVED_RETURN_IF_ERROR(control_->AllGather(rows.data(), matrix.data(), bytes_per_node,
                                                  tags.Control<OpTags::kAllToAllCounts>(),
                                                  timeout));
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

bool Group::AcceptsJobToken(std::string_view token) const {
  return has_job_token() && !token.empty() &&
         JobTokenMatches(token, spec_.job_token_scope, spec_.job_token_commitment);
}

}  // namespace collectived
