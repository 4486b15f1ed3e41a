#include "engine/group/group.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <utility>

#include "engine/group/algorithms.h"
#include "engine/group/job_token.h"
#include "engine/logging.h"
#include "engine/op_traits.h"
#include "engine/random_id.h"

namespace collectived {
namespace {

// SplitMix64's finalizer: a bijection of 64 bits that mixes every bit into every other.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A Combine of the control channel over values of type T, which its buffers hold as bytes (not
// necessarily aligned): `merge(acc, later)` folds `later` into `acc`.
template <typename T, typename Merge>
ControlChannel::Combine CombineAs(Merge merge) {
  return [merge = std::move(merge)](std::byte* acc_bytes, const std::byte* later_bytes) {
    T acc, later;
    std::memcpy(&acc, acc_bytes, sizeof(T));
    std::memcpy(&later, later_bytes, sizeof(T));
    merge(acc, later);
    std::memcpy(acc_bytes, &acc, sizeof(T));
  };
}

// A digest under `key` of "rank `from` sends `count` elements to rank `to`".
uint64_t PairDigest(uint64_t key, int from, int to, int64_t count) {
  const uint64_t pair =
      (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 32) | static_cast<uint32_t>(to);
  return Mix(Mix(key ^ Mix(pair)) ^ static_cast<uint64_t>(count));
}

using std::chrono::milliseconds;

// How long live peers get to answer a roll call after a connection broke. Live sidecars answer
// in milliseconds; the one that died never does, and the failure is reported this much later.
constexpr milliseconds kRollCallBudget{750};

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

std::shared_ptr<Work> FailedWork(OpInfo info, const Status& status, const Clock& clock) {
  auto work = std::make_shared<Work>(std::move(info), milliseconds(0), clock);
  work->Complete(status);
  return work;
}

// Adds to `words` the stream signal of `request` (a rank's), if it has one: a failed or refused
// op's word is set before its work completes, as a concluded op's is (see Group::Conclude).
void CollectSignal(const std::optional<OpRequest>& request, std::vector<StreamSignal>& words) {
  if (request && request->stream_signal) words.push_back(*request->stream_signal);
}

void StoreSignals(const std::vector<StreamSignal>& words) {
  for (const StreamSignal& word : words) StoreSignal(word);
}

// Ops whose per-pair block sizes differ from rank to rank, so that the signature cannot carry
// them: every pair is checked instead (gather and scatter have one count, in the signature).
bool HasPerPairCounts(OpKind kind) {
  const OpTraits& traits = TraitsOf(kind);
  return traits.family == OpFamily::kAllToAll && !traits.rooted;
}

// Each rank's signature travels with its arrival time (for skew and straggler metrics).
struct Announcement {
  OpSignature signature;
  int64_t arrival_unix_us;
};

// What a large group's sidecars combine for an op instead of gathering every announcement: one
// fixed size whatever the number of ranks. Combined in node order (ControlChannel's allreduce).
struct AgreementSummary {
  OpSignature signature;  // the first rank's, in node order
  int32_t disagree = 0;   // some rank issued another op than `signature`
  int32_t filled = 1;     // every node packed its part of a small allreduce into `payload`
  int64_t first_arrival_unix_us = INT64_MAX;
  int64_t last_arrival_unix_us = -1;
  int32_t first_rank = -1;
  int32_t last_rank = -1;
  std::byte payload[kPiggybackPayloadBytes] = {};
};
static_assert(std::is_trivially_copyable_v<AgreementSummary>);

}  // namespace

struct Group::StartedOp {
  PendingOp op;
  RunningOp running;  // what InFlight, the flight recorder and the watchdog show
  Phase phase = Phase::kAgreeing;
  Clock::TimePoint deadline;
  std::optional<Status> outcome;  // set once it ended; it concludes once every earlier op did
  // The agreement's buffers: this node's announcements (and piggyback slot), everyone's.
  std::vector<std::byte> mine;
  std::vector<std::byte> all;
  std::vector<int64_t> rows;    // alltoall: this node's ranks' send and receive counts
  std::vector<int64_t> matrix;  // alltoall: every rank's
  // alltoall in a large group: the digests' key (this node's draw, then every node's combined),
  // the digests of what this node's ranks send and expect, then the sums of every node's (both
  // reduced in place).
  uint64_t counts_key = 0;
  std::array<uint64_t, 2> count_digests{};
  std::vector<std::byte> slots;
  CompletionEvent completion_event;  // recorded after its work (NotifyEnqueued), if any
  bool piggybacked = false;
  int piggybacked_payloads = 0;  // the slots' payloads to combine: one per node, or one summary
  AgreementSummary summary;      // summary agreements: this node's, then everyone's
  AgreementSummary combined;
};

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
      issued_(topology_.local_ranks().size(), 0),
      timer_(runtime_.timers(), activities_, [this] { OnTimer(); }) {
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

void Group::OnPeerConnectionBroken(const Status& why) {
  bool in_flight;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight = failure_.ok() && !started_.empty();
  }
  if (!in_flight) return;
  LogWarning("a peer sidecar's connection broke while ops were on the device: failing them",
             {{"group", spec_.name}, {"why", why.message()}});
  (void)PeerError(why, "group '" + spec_.name + "'");
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

std::shared_ptr<Work> Group::Submit(int group_rank, OpRequest request) {
  const int local = topology_.LocalIndex(group_rank);
  OpInfo info{spec_.name, std::string(OpKindName(request.kind)), 0};
  // A refused op's word is set too (see Conclude).
  auto refuse = [&](const Status& why) {
    if (request.stream_signal) StoreSignal(*request.stream_signal);
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
    work = std::make_shared<Work>(info, timeout, clock_);
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
  return capabilities_.asynchronous ? std::max<size_t>(1, spec_.max_ops_in_flight) : 1;
}

void Group::PumpLocked(std::vector<Step>& steps) {
  if (!failure_.ok()) return;
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

// ---- agreement ---------------------------------------------------------------------------

void Group::StartAgreement(StartedOp& started) {
  if (topology_.node_count() >= spec_.summary_agreement_from_nodes) {
    StartSummaryAgreement(started);
    return;
  }
  StartFullAgreement(started);
}

void Group::StartSummaryAgreement(StartedOp& started) {
  PendingOp& op = started.op;
  const std::vector<int>& local = topology_.local_ranks();
  AgreementSummary& mine = started.summary;
  mine = AgreementSummary{};
  for (size_t l = 0; l < op.requests.size(); ++l) {
    const OpSignature signature = MakeSignature(*op.requests[l], op.sequence_number);
    if (l == 0) mine.signature = signature;
    if (!(signature == mine.signature)) mine.disagree = 1;
    const int64_t arrival = op.local_arrival_unix_us[l];
    if (arrival < mine.first_arrival_unix_us) {
      mine.first_arrival_unix_us = arrival;
      mine.first_rank = local[l];
    }
    if (arrival >= mine.last_arrival_unix_us) {
      mine.last_arrival_unix_us = arrival;
      mine.last_rank = local[l];
    }
  }
  std::vector<const OpRequest*> requests;
  for (const auto& request : op.requests) requests.push_back(&*request);
  mine.filled = mine.disagree == 0 && capabilities_.cpu_accessible &&
                PackSmallAllReduce(*data_, requests, mine.payload, kPiggybackPayloadBytes);
  // The payloads combine as the op does: its reduction, type and count (only where every rank
  // issued the same op, which the signatures say).
  const OpRequest& first = *op.requests[0];
  const ReduceOp reduce_op = first.reduce_op;
  const DType dtype = first.inputs.empty() ? DType::kUnspecified : first.inputs[0].dtype;
  const size_t count = first.inputs.empty() ? 0 : first.inputs[0].count;
  DataBackend* backend = data_.get();
  auto combine = CombineAs<AgreementSummary>(
      [backend, reduce_op, dtype, count](AgreementSummary& acc, const AgreementSummary& later) {
        acc.disagree = acc.disagree | later.disagree | !(acc.signature == later.signature);
        acc.filled =
            acc.filled && later.filled && !acc.disagree &&
            backend->Combine(reduce_op, dtype, acc.payload, acc.payload, later.payload, count).ok();
        if (later.first_arrival_unix_us < acc.first_arrival_unix_us) {
          acc.first_arrival_unix_us = later.first_arrival_unix_us;
          acc.first_rank = later.first_rank;
        }
        if (later.last_arrival_unix_us >= acc.last_arrival_unix_us) {
          acc.last_arrival_unix_us = later.last_arrival_unix_us;
          acc.last_rank = later.last_rank;
        }
      });
  control_->StartAllReduce(&started.summary, &started.combined, sizeof(AgreementSummary),
                           std::move(combine),
                           OpTags(op.sequence_number).Control<OpTags::kSummary>(),
                           [this, &started](const Status& status) { OnSummary(started, status); });
}

void Group::OnSummary(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  const AgreementSummary& all = started.combined;
  if (all.disagree) {
    // Some rank issued another op: every node learnt it alike, and the full exchange names who.
    StartFullAgreement(started);
    return;
  }
  PendingOp& op = started.op;
  // Known here: this node's ranks, the first and the last to arrive anywhere.
  op.arrival_unix_us.clear();
  const std::vector<int>& local = topology_.local_ranks();
  for (size_t l = 0; l < local.size(); ++l) {
    op.arrival_unix_us.emplace_back(local[l], op.local_arrival_unix_us[l]);
  }
  for (auto [rank, us] : {std::pair<int, int64_t>{all.first_rank, all.first_arrival_unix_us},
                          std::pair<int, int64_t>{all.last_rank, all.last_arrival_unix_us}}) {
    if (rank >= 0 && rank < topology_.group_size) op.arrival_unix_us.emplace_back(rank, us);
  }
  std::sort(op.arrival_unix_us.begin(), op.arrival_unix_us.end());
  op.arrival_unix_us.erase(
      std::unique(op.arrival_unix_us.begin(), op.arrival_unix_us.end(),
                  [](const auto& a, const auto& b) { return a.first == b.first; }),
      op.arrival_unix_us.end());
  if (all.filled) {
    started.slots.assign(kPiggybackSlotBytes, std::byte{0});
    std::memcpy(started.slots.data() + kPiggybackHeaderBytes, all.payload, kPiggybackPayloadBytes);
    started.piggybacked = true;
    started.piggybacked_payloads = 1;
  }
  AfterSignatures(started);
}

void Group::StartFullAgreement(StartedOp& started) {
  PendingOp& op = started.op;
  const std::vector<int>& local = topology_.local_ranks();
  const size_t slot_bytes = topology_.node_count() > 1 ? kPiggybackSlotBytes : 0;
  started.mine.assign(signature_bytes_per_node_[topology_.my_node], std::byte{0});
  for (size_t l = 0; l < op.requests.size(); ++l) {
    const Announcement announcement{MakeSignature(*op.requests[l], op.sequence_number),
                                    op.local_arrival_unix_us[l]};
    std::memcpy(started.mine.data() + l * sizeof(Announcement), &announcement,
                sizeof(Announcement));
  }
  if (slot_bytes > 0 && capabilities_.cpu_accessible) {
    std::byte* slot = started.mine.data() + local.size() * sizeof(Announcement);
    std::vector<const OpRequest*> requests;
    for (const auto& request : op.requests) requests.push_back(&*request);
    if (PackSmallAllReduce(*data_, requests, slot + kPiggybackHeaderBytes,
                           kPiggybackPayloadBytes)) {
      slot[0] = std::byte{1};
    }
  }
  started.all.assign(signature_bytes_, std::byte{0});
  const OpTags tags(op.sequence_number);
  control_->StartAllGather(
      started.mine.data(), started.all.data(), signature_bytes_per_node_,
      tags.Control<OpTags::kSignatures>(),
      [this, &started](const Status& status) { OnSignatures(started, status); });
}

void Group::OnSignatures(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  PendingOp& op = started.op;
  const int n = topology_.group_size;
  const size_t slot_bytes = topology_.node_count() > 1 ? kPiggybackSlotBytes : 0;
  std::vector<OpSignature> by_rank(n);
  std::vector<int64_t> arrivals(n, -1);
  for (int node = 0; node < topology_.node_count(); ++node) {
    const std::vector<int>& ranks = topology_.ranks_of_node[node];
    for (size_t i = 0; i < ranks.size(); ++i) {
      Announcement announcement;
      std::memcpy(&announcement,
                  started.all.data() + signature_offsets_[node] + i * sizeof(Announcement),
                  sizeof(Announcement));
      by_rank[ranks[i]] = announcement.signature;
      arrivals[ranks[i]] = announcement.arrival_unix_us;
    }
  }
  op.arrival_unix_us.clear();
  op.arrival_unix_us.reserve(n);
  for (int rank = 0; rank < n; ++rank) op.arrival_unix_us.emplace_back(rank, arrivals[rank]);
  // Described (a string per rank) only when some rank differs: at thousands of ranks that is
  // the agreement's own cost.
  const bool agreed = std::all_of(by_rank.begin(), by_rank.end(),
                                  [&](const OpSignature& each) { return each == by_rank[0]; });
  std::map<std::string, std::vector<int>> variants;
  for (int rank = 0; !agreed && rank < n; ++rank) {
    variants[DescribeSignature(by_rank[rank])].push_back(rank);
  }
  if (variants.size() > 1) {
    std::string message = "ranks issued different ops for sequence number " +
                          std::to_string(op.sequence_number) + " of group '" + spec_.name + "':";
    for (const auto& [description, ranks] : variants) {
      message += " ranks " + FormatRanks(ranks) + " issued " + description + ";";
    }
    message.pop_back();
    FinishOp(started, Status::Desync(message));
    return;
  }
  if (slot_bytes > 0) {
    // The same op everywhere, so every node decided alike; still, use the slots only if each
    // one was filled.
    started.slots.resize(static_cast<size_t>(topology_.node_count()) * kPiggybackSlotBytes);
    bool all_filled = true;
    for (int node = 0; node < topology_.node_count(); ++node) {
      const std::byte* slot = started.all.data() + signature_offsets_[node] +
                              signature_bytes_per_node_[node] - slot_bytes;
      all_filled = all_filled && slot[0] == std::byte{1};
      std::memcpy(started.slots.data() + node * kPiggybackSlotBytes, slot, kPiggybackSlotBytes);
    }
    started.piggybacked = all_filled;
    started.piggybacked_payloads = topology_.node_count();
  }
  AfterSignatures(started);
}

void Group::AfterSignatures(StartedOp& started) {
  PendingOp& op = started.op;
  const int n = topology_.group_size;
  if (!HasPerPairCounts(op.requests[0]->kind)) {
    Agreed(started);
    return;
  }
  // Every pair must agree on its block: what a sends to b is what b expects from a.
  if (n > spec_.split_digest_above_ranks) {
    // The digests are keyed by a value no rank knows when it gives its splits: every node draws
    // one, and the key is all of them combined (XOR).
    (void)FromHex(RandomHex(sizeof(started.counts_key)), &started.counts_key,
                  sizeof(started.counts_key));
    control_->StartAllReduce(
        &started.counts_key, &started.counts_key, sizeof(started.counts_key),
        CombineAs<uint64_t>([](uint64_t& acc, const uint64_t& later) { acc ^= later; }),
        OpTags(op.sequence_number).Control<OpTags::kCountsKey>(),
        [this, &started](const Status& status) { OnCountsKey(started, status); });
    return;
  }
  const std::vector<int>& local = topology_.local_ranks();
  started.rows.clear();
  for (size_t l = 0; l < local.size(); ++l) {
    auto send = SendCounts(*op.requests[l], local[l], n);
    auto recv = RecvCounts(*op.requests[l], local[l], n);
    started.rows.insert(started.rows.end(), send.begin(), send.end());
    started.rows.insert(started.rows.end(), recv.begin(), recv.end());
  }
  started.matrix.assign(static_cast<size_t>(n) * 2 * n, 0);
  std::vector<size_t> bytes_per_node;
  for (const auto& ranks : topology_.ranks_of_node)
    bytes_per_node.push_back(ranks.size() * 2 * n * sizeof(int64_t));
  control_->StartAllGather(started.rows.data(), started.matrix.data(), std::move(bytes_per_node),
                           OpTags(op.sequence_number).Control<OpTags::kAllToAllCounts>(),
                           [this, &started](const Status& status) { OnCounts(started, status); });
}

void Group::OnCountsKey(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  // Summed over every pair, once by the sender's node and once by the receiver's: the sums
  // differ when some pair disagrees (but for a 2^-64 chance: the digest is no MAC, but its key
  // was drawn after every rank gave its splits).
  const PendingOp& op = started.op;
  const int n = topology_.group_size;
  const std::vector<int>& local = topology_.local_ranks();
  const uint64_t key = started.counts_key;
  started.count_digests = {0, 0};
  for (size_t l = 0; l < local.size(); ++l) {
    const std::vector<int64_t> send = SendCounts(*op.requests[l], local[l], n);
    const std::vector<int64_t> recv = RecvCounts(*op.requests[l], local[l], n);
    for (int other = 0; other < n; ++other) {
      started.count_digests[0] += PairDigest(key, local[l], other, send[other]);
      started.count_digests[1] += PairDigest(key, other, local[l], recv[other]);
    }
  }
  using Digests = std::array<uint64_t, 2>;
  control_->StartAllReduce(
      &started.count_digests, &started.count_digests, sizeof(started.count_digests),
      CombineAs<Digests>([](Digests& acc, const Digests& later) {
        acc[0] += later[0];
        acc[1] += later[1];
      }),
      OpTags(op.sequence_number).Control<OpTags::kAllToAllCounts>(),
      [this, &started](const Status& status) { OnCountDigests(started, status); });
}

void Group::OnCountDigests(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  if (started.count_digests[0] != started.count_digests[1]) {
    const PendingOp& op = started.op;
    FinishOp(started,
             Status::Desync(std::string(OpKindName(op.requests[0]->kind)) + " (seq " +
                            std::to_string(op.sequence_number) + ") on group '" + spec_.name +
                            "': the ranks' split sizes disagree: what some rank sends to another "
                            "is not what that rank expects from it (the pair is named in groups "
                            "of at most " +
                            std::to_string(spec_.split_digest_above_ranks) +
                            " ranks, whose sidecars gather every rank's split sizes)"));
    return;
  }
  Agreed(started);
}

void Group::OnCounts(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  const PendingOp& op = started.op;
  const int n = topology_.group_size;
  auto row = [&](int rank) {
    return started.matrix.data() + static_cast<size_t>(topology_.node_major_position[rank]) * 2 * n;
  };
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      const int64_t sends = row(a)[b];
      const int64_t expects = row(b)[n + a];
      if (sends != expects) {
        FinishOp(started,
                 Status::Desync(std::string(OpKindName(op.requests[0]->kind)) + " (seq " +
                                std::to_string(op.sequence_number) + ") on group '" + spec_.name +
                                "': rank " + std::to_string(a) + " sends " + std::to_string(sends) +
                                " elements to rank " + std::to_string(b) + " but rank " +
                                std::to_string(b) + " expects " + std::to_string(expects) +
                                " from rank " + std::to_string(a)));
        return;
      }
    }
  }
  Agreed(started);
}

void Group::AgreementFailed(StartedOp& started, const Status& status) {
  // The group's failure (a timeout closed the channel, a peer failed) or a broken connection:
  // what to report is the group's decision, which may ask the store (on the executor).
  runtime_.executor().Post(
      [this, &started, status] { FinishOp(started, PeerError(status, Describe(started.op))); });
}

void Group::Agreed(StartedOp& started) {
  if (started.piggybacked) {
    // The exchange carried every node's contribution: the op is done here, on this thread.
    started.op.data_started = clock_.Now();
    std::vector<OpRequest*> requests;
    for (auto& request : started.op.requests) requests.push_back(&*request);
    OpContext context{topology_,       *data_,
                      requests,        OpTags(started.op.sequence_number),
                      milliseconds(1), &runtime_.executor()};
    FinishOp(started, FinishSmallAllReduce(context, started.slots.data() + kPiggybackHeaderBytes,
                                           kPiggybackSlotBytes, started.piggybacked_payloads));
    return;
  }
  std::vector<Step> steps;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.phase = Phase::kAgreed;
    PumpLocked(steps);
  }
  RunSteps(steps);
  activities_.Exit();  // the agreement's; the data phase counts on its own
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
    FinishOp(started, status);
    return;
  }
  runtime_.executor().Post([this, &started, status] {
    accounting_.BackendError(status.kind());
    FinishOp(started, PeerError(status, Describe(started.op)));
  });
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
  Status status = RunAlgorithm(context);
  if (status.ok()) started.completion_event = NotifyEnqueued(op, context);
  if (status.ok() || status.IsInvalidArgument()) return status;
  accounting_.BackendError(status.kind());
  return PeerError(status, Describe(op));
}

CompletionEvent Group::NotifyEnqueued(PendingOp& op, const OpContext& context) {
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.outcome = status.ok() || failure_.ok() ? status : failure_;
    PopEndedLocked(concluded);
    PumpLocked(steps);
    deferred = deferred_failure_.has_value();
  }
  for (auto& [op, result] : concluded) Conclude(op, result);
  if (deferred) MaybeApplyDeferredFailure();
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

// ---- failures ----------------------------------------------------------------------------

void Group::Fail(const Status& reason, bool from_peer, uint64_t peer_completed_through) {
  std::vector<std::shared_ptr<Work>> orphans;
  std::vector<StreamSignal> orphans_words;
  std::map<uint64_t, PendingOp> doomed;
  std::vector<std::pair<PendingOp, Status>> concluded;
  uint64_t completed_through = 0;
  bool in_use = false;  // not the teardown of an idle group
  bool cancelled = false;
  std::vector<OpRecord> in_flight;  // for the post-mortem
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return;
    if (from_peer) {
      for (const auto& started : started_) {
        if (started->op.sequence_number <= peer_completed_through && !started->outcome) {
          // The peer finished this op: let it finish here too (or fail on its own, should a
          // transfer it still needs break); the failure applies once it concludes.
          if (!deferred_failure_) deferred_failure_ = Deferred{reason, peer_completed_through};
          return;
        }
      }
    }
    failure_ = reason;
    completed_through = concluded_through_;
    // In use: an op is running or waiting here, or the group failed for a reason that only an
    // op in flight elsewhere gives (an abort, a timeout, a desync). A group whose rank or peer
    // left between ops (destroyed, shut down, a session that ended) aborts nothing anyone used:
    // counting it made every job's clean exit look like a lost peer.
    in_use = !pending_.empty() || (!stop_requested_ && reason.kind() != ErrorKind::kPeerLost);
    for (const auto& started : started_) {
      if (started->outcome) continue;
      in_use = true;
      orphans.insert(orphans.end(), started->running.works.begin(), started->running.works.end());
      for (const auto& request : started->op.requests) CollectSignal(request, orphans_words);
      // An agreed op waiting for the data slot is in no flow: it ends here.
      if (started->phase == Phase::kAgreed) started->outcome = reason;
    }
    // The ops still in a flow: the others conclude below and are among the finished records.
    if (in_use && hooks_.on_failed) in_flight = InFlightRecordsLocked(/*in_flows_only=*/true);
    PopEndedLocked(concluded);
    doomed.swap(pending_);
    cancelled = timer_.Cancel();
  }
  point_to_point_.FailAll(reason);
  if (!from_peer && hooks_.publish_failure) hooks_.publish_failure(reason, completed_through);
  control_->Close();
  data_->Abort();
  if (in_use) accounting_.BackendAborted(reason.kind());
  StoreSignals(orphans_words);
  for (auto& work : orphans) work->Complete(reason.WithContextOnce(work->info().Describe()));
  // The ops still in a flow conclude as their flows end (closing the channel and aborting the
  // backend ends them); the others conclude here.
  for (auto& [op, result] : concluded) Conclude(op, result);
  for (auto& [seq, op] : doomed) Conclude(op, reason);
  if (in_use && hooks_.on_failed) {
    std::vector<OpRecord> records = accounting_.Finished(0);
    records.insert(records.end(), std::make_move_iterator(in_flight.begin()),
                   std::make_move_iterator(in_flight.end()));
    hooks_.on_failed(*this, reason, std::move(records));
  }
  if (cancelled) activities_.Exit();
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
  std::vector<StreamSignal> words;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [seq, op] : pending_) {
      if (op.works[local]) doomed.push_back(op.works[local]);
      if (local < static_cast<int>(op.requests.size())) CollectSignal(op.requests[local], words);
    }
    for (const auto& started : started_) {
      if (local < static_cast<int>(started->running.works.size()) && !started->outcome) {
        doomed.push_back(started->running.works[local]);
        if (local < static_cast<int>(started->op.requests.size())) {
          CollectSignal(started->op.requests[local], words);
        }
      }
    }
  }
  point_to_point_.FailRank(group_rank, reason);
  StoreSignals(words);
  for (auto& work : doomed) work->Complete(reason.WithContextOnce(work->info().Describe()));
}

// ---- deadlines ---------------------------------------------------------------------------

Clock::TimePoint Group::NextDeadlineLocked() const {
  Clock::TimePoint next = Clock::TimePoint::max();
  // The stuck report of the oldest op not checked yet (ops arrive in sequence order, so the
  // first one after the last checked is the oldest).
  if (spec_.stuck_threshold.count() > 0) {
    const PendingOp* oldest = nullptr;
    for (const auto& started : started_) {
      if (started->op.sequence_number > stuck_checked_through_ && !started->outcome) {
        oldest = &started->op;
        break;
      }
    }
    if (!oldest) {
      auto it = pending_.upper_bound(stuck_checked_through_);
      if (it != pending_.end()) oldest = &it->second;
    }
    if (oldest)
      next = std::min(next, Clock::Saturating(oldest->first_arrival, spec_.stuck_threshold));
  }
  // The next op, while a local rank has not issued it.
  if (auto it = pending_.find(next_to_start_);
      it != pending_.end() && it->second.arrived < topology_.local_ranks().size()) {
    next = std::min(next, Clock::Saturating(it->second.first_arrival, it->second.timeout));
  }
  // Ops waiting for their peers' agreement or for their device work.
  for (const auto& started : started_) {
    if (started->outcome) continue;
    if (started->phase == Phase::kAgreeing || started->phase == Phase::kEnqueued) {
      next = std::min(next, started->deadline);
    }
  }
  return next;
}

void Group::ArmTimerLocked() {
  if (!failure_.ok() || failing_) return;
  timer_.Arm(NextDeadlineLocked());
}

void Group::OnTimer() {
  std::vector<OpRecord> stuck;
  std::optional<Status> failure;
  bool abort_backend = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timer_.Fired();
    const Clock::TimePoint now = clock_.Now();
    if (failure_.ok() && !failing_) {
      if (spec_.stuck_threshold.count() > 0) {
        // Each op is reported once: the check moves past it.
        auto report = [&](const PendingOp& op, const auto& record_of) {
          if (now < Clock::Saturating(op.first_arrival, spec_.stuck_threshold)) return false;
          stuck_checked_through_ = op.sequence_number;
          OpRecord late = record_of();
          late.duration =
              std::chrono::duration_cast<std::chrono::microseconds>(now - op.first_arrival);
          stuck.push_back(std::move(late));
          return true;
        };
        bool more = true;
        for (const auto& started : started_) {
          if (!more) break;
          if (started->op.sequence_number <= stuck_checked_through_ || started->outcome) continue;
          more = report(started->op, [&] { return started->running.record; });
        }
        for (auto it = pending_.upper_bound(stuck_checked_through_); more && it != pending_.end();
             ++it) {
          more = report(it->second, [&] {
            return accounting_.Of(it->second, OpRecord::State::kWaitingForPeers, Status::Ok());
          });
        }
      }
      const size_t local_count = topology_.local_ranks().size();
      if (auto it = pending_.find(next_to_start_);
          it != pending_.end() && it->second.arrived < local_count &&
          now >= Clock::Saturating(it->second.first_arrival, it->second.timeout)) {
        const PendingOp& waiting = it->second;
        std::vector<int> missing;
        for (size_t l = 0; l < local_count; ++l) {
          if (!waiting.requests[l]) missing.push_back(topology_.local_ranks()[l]);
        }
        failure = Status::Timeout("Timeout: " + Describe(waiting) + " Timed out after " +
                                  std::to_string(waiting.timeout.count()) + " ms: ranks " +
                                  FormatRanks(missing) + " never issued it");
      }
      for (const auto& started : started_) {
        if (failure || started->outcome || now < started->deadline) continue;
        const PendingOp& op = started->op;
        if (started->phase == Phase::kAgreeing) {
          // Every local rank issued the op, so the ones that did not are among the other
          // sidecars' ranks; the exchange tells which sidecars have not answered.
          std::vector<int> remote;
          for (int rank = 0; rank < topology_.group_size; ++rank) {
            if (topology_.LocalIndex(rank) < 0) remote.push_back(rank);
          }
          std::string silent;
          for (int node : control_->AwaitedNodes()) {
            silent += (silent.empty() ? "" : ", ") + std::to_string(node);
          }
          failure = Status::Timeout("Timeout: " + Describe(op) + " Timed out after " +
                                    std::to_string(op.timeout.count()) + " ms waiting for ranks " +
                                    FormatRanks(remote) +
                                    " of the other sidecars (one or more never issued it): no "
                                    "answer from sidecar nodes [" +
                                    silent + "]");
        } else if (started->phase == Phase::kEnqueued) {
          failure = Status::Timeout("Timeout: " + Describe(op) + " Timed out after " +
                                    std::to_string(op.timeout.count()) +
                                    " ms: its device work did not complete");
          abort_backend = true;
        }
      }
      if (failure) failing_ = true;
      ArmTimerLocked();
    }
  }
  for (const OpRecord& record : stuck) {
    LogWarning(
        "collective stuck",
        {{"group", record.group},
         {"seq", std::to_string(record.sequence_number)},
         {"op", std::string(OpKindName(record.kind))},
         {"state", std::string(OpStateName(record.state))},
         {"age_ms", std::to_string(record.duration.count() / 1000)},
         {"missing_local_ranks", FormatRanks(record.missing_ranks)},
         {"hint", record.missing_ranks.empty()
                      ? "waiting for ranks on other sidecars: run collectivectl describe there"
                      : "these ranks of this sidecar have not issued the op"}});
    if (spec_.observer) spec_.observer->OnOpStuck(record);
  }
  if (failure) {
    if (abort_backend) accounting_.BackendError(ErrorKind::kTimeout);
    // Failing publishes the reason through the store: not on the timer's thread.
    Post([this, reason = *failure] {
      Fail(reason);
      std::lock_guard<std::mutex> lock(mutex_);
      failing_ = false;
    });
  }
  activities_.Exit();  // this timer's
}

bool Group::AcceptsJobToken(std::string_view token) const {
  return has_job_token() && !token.empty() &&
         JobTokenMatches(token, spec_.job_token_scope, spec_.job_token_commitment);
}

}  // namespace collectived
