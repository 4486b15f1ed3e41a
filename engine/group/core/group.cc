// Group: construction, submission, the pipeline that starts ops in order, their data phase and
// their conclusion. The agreement, failures and deadlines are in group_*.cc (group_internal.h).
#include "engine/group/core/group.h"

#include <algorithm>
#include <utility>

#include "engine/group/algorithms/algorithms.h"
#include "engine/group/core/group_internal.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/vocabulary/logging.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// Set by Submit while it runs the steps its arrival enabled: the data phase of a one-sidecar group
// may then run on the submitting thread (the last local rank to arrive), which is cheaper than
// waking an executor thread for a small op, and for a device group than the op's whole GPU work
// (its calls only enqueue: with one sidecar there is no network call). One such op per Submit.
thread_local bool may_run_inline = false;

// Submit's scope in which may_run_inline holds (restored when it returns, however it returns).
class MayRunInline {
 public:
  MayRunInline() : saved_(std::exchange(may_run_inline, true)) {}
  ~MayRunInline() { may_run_inline = saved_; }
  MayRunInline(const MayRunInline&) = delete;
  MayRunInline& operator=(const MayRunInline&) = delete;

 private:
  const bool saved_;
};

}  // namespace

int GroupSpec::GroupSize() const {
  return static_cast<int>(group_members.empty() ? members.size() : group_members.size());
}

int GroupSpec::GroupRankOf(int rank) const {
  if (group_members.empty() || rank < 0 || rank >= static_cast<int>(members.size())) return rank;
  return static_cast<int>(
      std::lower_bound(group_members.begin(), group_members.end(), members[rank]) -
      group_members.begin());
}

std::vector<int> GroupSpec::LostGroupRanks() const {
  std::vector<int> lost;
  for (size_t rank = 0; rank < group_members.size(); ++rank) {
    if (!std::binary_search(members.begin(), members.end(), group_members[rank])) {
      lost.push_back(static_cast<int>(rank));
    }
  }
  return lost;
}

std::shared_ptr<Work> FailedWork(OpInfo info, const Status& status, const Clock& clock) {
  auto work = std::make_shared<Work>(std::move(info), milliseconds(0), clock);
  work->Complete(status);
  return work;
}

using group_internal::Announcement;

Group::Group(GroupSpec spec, GroupTopology topology, GroupTransport transport, Hooks hooks,
             Runtime& runtime)
    : spec_(std::move(spec)),
      topology_(std::move(topology)),
      control_(std::move(transport.control)),
      data_(std::move(transport.data)),
      capabilities_(data_->capabilities()),
      hooks_(std::move(hooks)),
      runtime_(runtime),
      clock_(runtime.clock()),
      accounting_(spec_.name, spec_.device, topology_, spec_.observer, spec_.flight_recorder_size,
                  clock_),
      point_to_point_(spec_.name, topology_, *data_, std::move(transport.transfers), accounting_,
                      runtime_, activities_,
                      [this](const Status& error, const std::string& where) {
                        return PeerError(error, where);
                      }),
      commits_(spec_.fault_tolerance.mode == FaultToleranceMode::kShrink &&
               topology_.node_count() > 1 &&
               (capabilities_.asynchronous || capabilities_.cpu_accessible)),
      issued_(topology_.local_ranks().size(), spec_.first_sequence_number - 1),
      next_to_start_(spec_.first_sequence_number),
      concluded_through_(spec_.first_sequence_number - 1),
      timer_(runtime_.timers(), activities_, [this] { OnTimer(); }) {
  accounting_.set_epoch(spec_.epoch);
  // Across nodes, each node's announcements are followed by a slot of a fixed size, whatever
  // the op: nodes that disagree about the op (a desync) still exchange the same byte counts.
  const size_t slot_bytes = topology_.node_count() > 1 ? kPiggybackSlotBytes : 0;
  for (const auto& ranks : topology_.ranks_of_node) {
    signature_offsets_.push_back(signature_bytes_);
    signature_bytes_per_node_.push_back(ranks.size() * sizeof(Announcement) + slot_bytes);
    signature_bytes_ += signature_bytes_per_node_.back();
  }
  // Device ops wait on the GPU, where nothing notices that a peer sidecar died (NCCL's socket
  // transport can wait forever): a broken control connection fails them. Host groups have their
  // data transport's own errors.
  if (capabilities_.asynchronous && topology_.node_count() > 1) {
    broken_watch_ = std::make_shared<BrokenWatch>();
    broken_watch_->group = this;
    control_->SetBrokenHandler([watch = broken_watch_](const Status& why) {
      std::lock_guard<std::mutex> lock(watch->mutex);
      if (watch->group != nullptr)
        watch->group->Post([group = watch->group, why] { group->OnPeerConnectionBroken(why); });
    });
  }
}

Group::~Group() {
  if (broken_watch_) {
    std::lock_guard<std::mutex> lock(broken_watch_->mutex);
    broken_watch_->group = nullptr;
  }
  Stop();
  activities_.Wait();
}

void Group::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_requested_) return;
    stop_requested_ = true;
  }
  Fail(Status::Aborted("group '" + spec_.name + "' was destroyed"), /*from_peer=*/true);
  activities_.Close(hooks_.on_quiescent);
}

bool Group::Quiescent() const {
  return activities_.Idle();
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

// ---- what an operator sees ---------------------------------------------------------------

std::vector<OpRecord> Group::FlightRecords(size_t limit) const {
  std::vector<OpRecord> records = accounting_.Finished(limit);
  std::vector<OpRecord> in_flight;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight = InFlightRecordsLocked(/*in_flows_only=*/false);
  }
  records.insert(records.end(), std::make_move_iterator(in_flight.begin()),
                 std::make_move_iterator(in_flight.end()));
  return records;
}

std::vector<OpRecord> Group::InFlightRecordsLocked(bool in_flows_only) const {
  std::vector<OpRecord> records;
  for (const auto& started : started_) {
    if (in_flows_only && started->outcome) continue;
    OpRecord running = started->running.record;
    running.duration = std::chrono::duration_cast<std::chrono::microseconds>(accounting_.WallNow() -
                                                                             running.issued);
    records.push_back(std::move(running));
  }
  if (in_flows_only) return records;
  for (const auto& [seq, op] : pending_)
    records.push_back(accounting_.Of(op, OpRecord::State::kWaitingForPeers, Status::Ok()));
  return records;
}

std::vector<InFlightOp> Group::InFlight() const {
  std::vector<InFlightOp> result;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& started : started_) result.push_back(started->running.in_flight);
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

// ---- submission --------------------------------------------------------------------------

std::shared_ptr<Work> Group::Submit(int group_rank, OpRequest request,
                                    std::shared_ptr<Work> carried) {
  const int local = topology_.LocalIndex(group_rank);
  OpInfo info{spec_.name, std::string(OpKindName(request.kind)), 0};
  // A refused op's word is set too (see Conclude).
  auto refuse = [&](const Status& why) {
    if (request.stream_signal) StoreSignal(*request.stream_signal);
    if (carried) {
      carried->Complete(why);
      return carried;
    }
    return FailedWork(info, why, clock_);
  };
  if (group_rank < 0 || group_rank >= topology_.group_size) {
    return refuse(Status::InvalidArgument("rank " + std::to_string(group_rank) +
                                          " is not part of group '" + spec_.name + "' (size " +
                                          std::to_string(topology_.group_size) + ")"));
  }
  if (local < 0) {
    return refuse(Status::InvalidArgument("rank " + std::to_string(group_rank) + " of group '" +
                                          spec_.name + "' is not hosted by this sidecar"));
  }
  Status valid =
      ValidateRequest(request, spec_.name, group_rank, topology_.group_size, data_->device_kind());
  if (!valid.ok()) {
    OpRecord record = accounting_.Base(request, 0);
    record.state = OpRecord::State::kFailed;
    record.status = valid;
    record.issued = accounting_.WallNow();
    accounting_.Finish(std::move(record));
    return refuse(valid);
  }
  const milliseconds timeout =
      request.timeout == kUseGroupTimeout ? spec_.timeout : request.timeout;
  if (IsPointToPoint(request.kind)) {
    return point_to_point_.Submit(group_rank, std::move(request), timeout);
  }

  std::shared_ptr<Work> work;
  std::vector<Step> steps;
  const MayRunInline inline_scope;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) {
      return refuse(failure_.WithContextOnce(info.op + " on group '" + spec_.name + "'"));
    }
    info.sequence_number = ++issued_[local];
    work = carried ? std::move(carried) : std::make_shared<Work>(info, timeout, clock_);
    work->SetEpochStamp({info.sequence_number, spec_.epoch, spec_.first_sequence_number});
    PendingOp& op = pending_[info.sequence_number];
    if (op.arrived == 0) {
      const size_t count = topology_.local_ranks().size();
      op.sequence_number = info.sequence_number;
      op.requests.resize(count);
      op.works.resize(count);
      op.local_arrival_unix_us.assign(count, -1);
      op.first_arrival = clock_.Now();
      op.timeout = timeout;
    }
    op.requests[local] = std::move(request);
    op.works[local] = work;
    op.local_arrival_unix_us[local] = clock_.UnixMicros();
    ++op.arrived;
    PumpLocked(steps);
  }
  RunSteps(steps);
  return work;
}

// ---- the pipeline ------------------------------------------------------------------------

size_t Group::Depth() const {
  // A committing group's commit is an exchange of the control channel, which runs one exchange
  // at a time in op order: its ops go one at a time, each committed before the next is agreed.
  if (commits_ || !capabilities_.asynchronous) return 1;
  return std::max<size_t>(1, spec_.max_ops_in_flight);
}

void Group::PumpLocked(std::vector<Step>& steps) {
  if (!failure_.ok() || freezing_) return;
  const size_t local_count = topology_.local_ranks().size();
  const size_t depth = Depth();
  // The next op's agreement: one at a time, in sequence order, while fewer than `depth` ops are
  // started; none past the ops a peer's deferred failure spares.
  bool agreeing = false;
  for (const auto& started : started_) agreeing = agreeing || started->phase == Phase::kAgreeing;
  while (!agreeing && started_.size() < depth) {
    auto it = pending_.find(next_to_start_);
    if (it == pending_.end() || it->second.arrived < local_count) break;
    if (deferred_failure_ && next_to_start_ > deferred_failure_->through) break;
    auto started = std::make_unique<StartedOp>();
    started->op = std::move(it->second);
    pending_.erase(it);
    ++next_to_start_;
    PendingOp& op = started->op;
    started->running =
        RunningOp{InFlightOp{op.sequence_number,
                             std::string(OpKindName(op.requests[0]->kind)),
                             topology_.local_ranks(),
                             {},
                             op.first_arrival},
                  op.works, accounting_.Of(op, OpRecord::State::kRunning, Status::Ok())};
    started->deadline = Clock::Saturating(op.first_arrival, op.timeout);
    for (auto& work : op.works) work->MarkStarted();
    started->phase = Phase::kAgreeing;
    agreeing = true;
    activities_.Enter();  // the agreement, until its callback hands the op on
    steps.push_back(Step{Step::kAgree, started.get()});
    started_.push_back(std::move(started));
  }
  // The next data phase: one at a time, in sequence order.
  if (!data_busy_) {
    for (const auto& started : started_) {
      if (started->outcome) continue;
      if (started->phase == Phase::kAgreeing) break;
      if (started->phase != Phase::kAgreed) continue;
      data_busy_ = true;
      started->phase = Phase::kRunning;
      activities_.Enter();  // the data phase
      const bool here = may_run_inline && topology_.node_count() == 1 &&
                        (capabilities_.cpu_accessible || capabilities_.asynchronous);
      steps.push_back(Step{here ? Step::kRunHere : Step::kRunOnExecutor, started.get()});
      break;
    }
  }
  ArmTimerLocked();
}

void Group::RunSteps(std::vector<Step>& steps) {
  for (const Step& step : steps) {
    switch (step.kind) {
      case Step::kAgree:
        StartAgreement(*step.op);
        break;
      case Step::kRunHere:
        RunData(*step.op, /*inline_run=*/true);
        break;
      case Step::kRunOnExecutor:
        runtime_.executor().Post([this, op = step.op] { RunData(*op, /*inline_run=*/false); });
        break;
    }
  }
}

void Group::Post(std::function<void()> task) {
  activities_.Enter();
  runtime_.executor().Post([this, task = std::move(task)] {
    task();
    activities_.Exit();
  });
}

// ---- data phase --------------------------------------------------------------------------

void Group::RunData(StartedOp& started, bool inline_run) {
  if (inline_run) may_run_inline = false;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status = failure_;
  }
  started.op.data_started = clock_.Now();
  const bool launched = status.ok();  // Execute runs, and may put work on the device
  if (launched) status = Execute(started);
  if (!capabilities_.asynchronous || !launched) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      data_busy_ = false;
    }
    if (commits_ && launched && status.ok()) {
      Commit(started);
      return;
    }
    FinishOp(started, status);
    return;
  }
  // Enqueued: the backend reports its completion; the next op may start meanwhile. The call is
  // made while this op still holds the data slot, so that it covers this op's work only. The op
  // may conclude (and its flow's activity end) before this call returns: the rest of it counts
  // as an activity of its own. An op that failed may have part of its work on the stream already
  // (a launch or an NCCL call failed after others): it too concludes once the stream got past
  // that work, so that its tensors stay in use until nothing on the device touches them, with
  // the failure as its outcome whatever the stream says.
  activities_.Enter();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.phase = Phase::kEnqueued;
  }
  if (status.ok()) {
    started.op.enqueued = clock_.Now();
    auto done = [this, &started](const Status& reached) { OnDeviceDone(started, reached); };
    // With at most `depth` ops started, an event recorded again is one whose op concluded.
    const CompletionEvent& event = started.completion_event;
    if (event.native != nullptr && Depth() <= event.recorded_again_at) {
      data_->WhenCompleteAt(event, std::move(done));
    } else {
      data_->WhenComplete(std::move(done));
    }
  } else {
    data_->WhenComplete([this, &started, status](const Status&) {
      runtime_.executor().Post([this, &started, status] { FinishOp(started, status); });
    });
  }
  std::vector<Step> steps;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_busy_ = false;
    PumpLocked(steps);
  }
  RunSteps(steps);
  activities_.Exit();
}

void Group::OnDeviceDone(StartedOp& started, const Status& status) {
  started.op.device_done = clock_.Now();
  if (status.ok()) {
    if (commits_) {
      Commit(started);
    } else {
      FinishOp(started, status);
    }
    return;
  }
  runtime_.executor().Post([this, &started, status] {
    accounting_.BackendError(status.kind());
    FinishOp(started, PeerError(status, Describe(started.op)));
  });
}

namespace {

// The algorithm of the op's family (engine/group/algorithms/algorithms.h).
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

Status Group::Execute(StartedOp& started) {
  PendingOp& op = started.op;
  const milliseconds remaining = std::max(
      milliseconds(1), std::chrono::duration_cast<milliseconds>(started.deadline - clock_.Now()));
  OpContext context{topology_,           *data_, {}, OpTags(op.sequence_number), remaining,
                    &runtime_.executor()};
  for (auto& request : op.requests) context.requests.push_back(&*request);
  for (const OpRequest* request : context.requests) {
    for (const auto* tensors : {&request->inputs, &request->outputs}) {
      for (const TensorView& tensor : *tensors) {
        if (Status ready = data_->AwaitReady(tensor); !ready.ok()) {
          if (!ready.IsInvalidArgument()) accounting_.BackendError(ready.kind());
          return PeerError(ready, Describe(op));
        }
      }
    }
  }
  Status status = commits_ ? KeepOutputs(started) : Status::Ok();
  if (status.ok()) status = RunAlgorithm(context);
  if (status.ok()) started.completion_event = NotifyEnqueued(op, context);
  if (status.ok() || status.IsInvalidArgument()) return status;
  accounting_.BackendError(status.kind());
  return PeerError(status, Describe(op));
}

CompletionEvent Group::NotifyEnqueued(PendingOp& op, const OpContext& context) {
  // A committing group's trainers see its results only once it committed: no stream signal and
  // no completion event, the op's completion is their signal.
  if (commits_) return {};
  if (capabilities_.asynchronous) {
    for (auto& request : op.requests) {
      if (!request || !request->stream_signal) continue;
      Status enqueued = data_->EnqueueSignal(*request->stream_signal);
      if (enqueued.ok()) {
        request->stream_signal->written_on_stream = true;
      } else if (!signal_failure_logged_.exchange(true)) {
        LogWarning(
            "a stream signal could not be written on the device: its ops' words are "
            "set when they conclude (the trainers' streams wait for the completions)",
            {{"group", spec_.name}, {"why", enqueued.message()}});
      }
    }
  }
  bool wanted = false;
  for (const OpRequest* request : context.requests) wanted = wanted || request->on_enqueued;
  if (!wanted) return {};
  StatusOr<CompletionEvent> event = data_->RecordCompletionEvent();
  // Without an event the trainers wait for the op's completion, as for host memory.
  if (!event.ok() || event->handle.empty()) return {};
  for (const OpRequest* request : context.requests) {
    if (request->on_enqueued) request->on_enqueued(event->handle);
  }
  return *std::move(event);
}

// ---- conclusion --------------------------------------------------------------------------

void Group::FinishOp(StartedOp& started, const Status& status) {
  std::vector<std::pair<PendingOp, Status>> concluded;
  std::vector<Step> steps;
  bool deferred;
  bool frozen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    frozen = freezing_.has_value();
    if (frozen && !status.ok() && failure_.ok()) {
      started.held = true;  // its outcome is RetireFrozen's
    } else {
      started.outcome = status.ok() || failure_.ok() ? status : failure_;
    }
    PopEndedLocked(concluded);
    PumpLocked(steps);
    deferred = deferred_failure_.has_value();
  }
  for (auto& [op, result] : concluded) Conclude(op, result);
  if (deferred) MaybeApplyDeferredFailure();
  if (frozen) MaybeReportFrozen();
  if (!concluded.empty()) MaybeFinishRetirement();
  RunSteps(steps);
  activities_.Exit();  // the op's flow ends here
}

void Group::PopEndedLocked(std::vector<std::pair<PendingOp, Status>>& concluded) {
  // In sequence order: an op that ended early waits for the ones before it.
  while (!started_.empty() && started_.front()->outcome) {
    StartedOp& front = *started_.front();
    concluded.emplace_back(std::move(front.op), *front.outcome);
    concluded_through_ = std::max(concluded_through_, concluded.back().first.sequence_number);
    started_.pop_front();
  }
}

void Group::Conclude(PendingOp& op, const Status& status) {
  Status annotated = status.WithContextOnce(Describe(op));
  // Recorded before the works complete, so that a rank whose wait returned finds its op in the
  // flight recorder.
  accounting_.Finish(accounting_.Of(
      op, annotated.ok() ? OpRecord::State::kCompleted : OpRecord::State::kFailed, annotated));
  // Before the works complete: a client that hears of the completion finds its word set. A
  // failed op's word is set too (a stream may never write it): the trainer's stream must not
  // wait on it for ever, and a client whose threads cannot run (a Python trainer whose one
  // thread blocks in a launch behind that very stream, holding the GIL) must not be the only
  // one who can release it. The client sets it as well; the value is the same.
  for (const auto& request : op.requests) {
    if (request && request->stream_signal &&
        (!annotated.ok() || !request->stream_signal->written_on_stream)) {
      StoreSignal(*request->stream_signal);
    }
  }
  for (auto& work : op.works) {
    if (work) work->Complete(annotated);
  }
}

void Group::MaybeApplyDeferredFailure() {
  Status reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!deferred_failure_ || !failure_.ok()) return;
    for (const auto& started : started_) {
      if (started->op.sequence_number <= deferred_failure_->through && !started->outcome) return;
    }
    reason = deferred_failure_->reason;
    deferred_failure_.reset();
  }
  Fail(reason, /*from_peer=*/true);
}

bool Group::AcceptsJobToken(std::string_view token) const {
  return has_job_token() && !token.empty() &&
         JobTokenMatches(token, spec_.job_token_scope, spec_.job_token_commitment);
}

}  // namespace collectived
