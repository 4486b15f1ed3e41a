// Group: this sidecar's part of one process group. It collects the ops that its local ranks
// issue, gives them sequence numbers and runs them in issue order: every rank, local and remote,
// first agrees on what the op is over the control channel, then the data moves through the
// group's DataBackend (send/recv go through PointToPoint; what happened to each op is recorded
// by OpAccounting). It fails them all — promptly and with the reason — when the group is
// aborted, a rank is lost or a peer sidecar goes away.
//
// A group is a queue, not a thread. Its steps run where the event that enables them happens: an
// op's agreement starts on the thread of its last local rank to arrive and completes on the
// channel's thread; its data phase runs on the sidecar's executor (inline on the arriving thread
// for a one-sidecar group); an asynchronous (device) backend's ops complete through its
// callbacks, with up to spec.max_ops_in_flight of them enqueued at once. Deadlines (op timeouts,
// stuck-op reports) are timers of the runtime's TimerQueue, on its Clock. An op waiting for its
// peers, local or remote, holds no thread.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/deadline_timer.h"
#include "engine/concurrency/runtime.h"
#include "engine/group/core/fault_tolerance.h"
#include "engine/group/core/flight_recorder.h"
#include "engine/group/core/op_accounting.h"
#include "engine/group/core/op_tags.h"
#include "engine/group/core/pending_op.h"
#include "engine/group/core/point_to_point.h"
#include "engine/group/core/topology.h"
#include "engine/group/transport/transport_factory.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/work.h"

namespace collectived {

struct OpContext;

struct GroupSpec {
  std::string name;
  std::vector<int> members;  // sorted global ranks
  DeviceKind device = DeviceKind::kCpu;
  std::chrono::milliseconds timeout = kDefaultGroupTimeout;  // every op's, unless it names one
  std::shared_ptr<OpObserver> observer;                      // may be null
  size_t flight_recorder_size = 256;
  // JobTokenCommitment of the group's job token within `job_token_scope` ("none": no token).
  std::string job_token_commitment = "none";
  std::string job_token_scope;
  // An op in flight longer than this is logged once (with the ranks that have not arrived) and
  // reported to the observer; zero: never.
  std::chrono::milliseconds stuck_threshold{0};
  // Ops of an asynchronous (device) backend enqueued and not yet complete, at most; later ops
  // wait for one to complete. Host backends run one op at a time.
  size_t max_ops_in_flight = 16;
  // Groups of at least this many sidecars agree on each op by combining one fixed-size summary
  // per sidecar up and down a tree (2·⌈log₂ S⌉ hops of a few hundred bytes) instead of gathering
  // every rank's announcement (R of them, to every sidecar). Their flight records then know the
  // arrival of this sidecar's ranks and of the group's first and last rank only.
  int summary_agreement_from_nodes = 64;
  // Groups of more ranks than this check an alltoall's split sizes across ranks through two sums
  // of per-pair digests, combined like a summary (16 bytes per sidecar), instead of gathering
  // every rank's sends and receives (2·R² counts: 4 GiB per op at 16,384 ranks). A disagreement
  // is still a Desync, but without naming the pair.
  int split_digest_above_ranks = 2048;
  // What the group does when it loses a rank (docs/fault-tolerance.md). A shrinking group is a
  // chain of epochs, each one Group among the live ranks: `epoch` is this one's number and
  // `first_sequence_number` its first op's (the one after the previous epoch's cut).
  FaultTolerance fault_tolerance;
  int epoch = 0;
  uint64_t first_sequence_number = 1;
  // Epochs after the first: the group's whole membership (global ranks; `members` are the live
  // ones). Empty in epoch 0.
  std::vector<int> group_members;

  // The group's size, the group rank of `rank` of this epoch, and the group ranks lost so far,
  // in the group's fixed numbering.
  int GroupSize() const;
  int GroupRankOf(int rank) const;
  std::vector<int> LostGroupRanks() const;
};

// A work that failed with `status` before it began (a refused op).
std::shared_ptr<Work> FailedWork(OpInfo info, const Status& status, const Clock& clock);

// Across sidecars, an allreduce of at most kPiggybackPayloadBytes travels with the op's signature
// exchange: one network round instead of two.
inline constexpr size_t kPiggybackSlotBytes = 256;
inline constexpr size_t kPiggybackHeaderBytes = 8;  // byte 0: 1 when the slot carries data
inline constexpr size_t kPiggybackPayloadBytes = kPiggybackSlotBytes - kPiggybackHeaderBytes;

class Group {
 public:
  // Hooks to the world outside the group (the registry wires them to the rendezvous store).
  // Every hook may block (a store call): the group calls them on executor threads or on the
  // caller's thread, never on a channel's or timer's thread.
  struct Hooks {
    // Called once when the group fails for a reason found here (not one learned from a peer),
    // before connections are closed, so peers can learn the reason; `completed_through` is the
    // last sequence number this sidecar completed.
    std::function<void(const Status& reason, uint64_t completed_through)> publish_failure;
    // Looks up a reason published by a peer after a connection to it broke; nullopt if none.
    std::function<std::optional<Status>()> lookup_failure;
    // After a connection broke with no reason published: asks the peer sidecars (by id) to
    // answer, and returns the indices of those that did not within `budget`, or nullopt when
    // it cannot tell (the store is unreachable). Names the sidecar that died.
    std::function<std::optional<std::vector<int>>(const std::vector<std::string>& peer_ids,
                                                  std::chrono::milliseconds budget)>
        roll_call;
    // Called once, after Stop, when nothing works for the group any more (Quiescent), on the
    // thread that finished last. Must not block; may arrange for the group's destruction
    // elsewhere, never destroy it itself.
    std::function<void()> on_quiescent;
    // Called once when the group fails while in use (an op running or waiting here, or a
    // reason only an op in flight elsewhere gives), never for the teardown of an idle group:
    // `records` are its flight records at that moment (finished, then in flight), for the
    // post-mortem. On the failing thread, after the failure is set; must not block for long.
    std::function<void(const Group& group, const Status& reason, std::vector<OpRecord> records)>
        on_failed;
    // A group that commits (commits()) lost peer sidecars: a connection broke and the roll call
    // named `lost_nodes` (this epoch's node indices) as not answering. The group froze instead
    // of failing (Freeze); the registry agrees on the cut with the other survivors and retires
    // the epoch there (RetireFrozen). Called once, on an executor thread; may block. Unset: the
    // group fails as a fail-fast group does.
    std::function<void(const std::vector<int>& lost_nodes, const Status& why)> sidecars_lost;
  };

  // `transport` must be connected for `topology` (TransportFactory::Connect); `runtime` must
  // outlive the group.
  Group(GroupSpec spec, GroupTopology topology, GroupTransport transport, Hooks hooks,
        Runtime& runtime);
  // Stops the group and waits until it is quiescent (GroupRegistry destroys a stopped group only
  // once it is, so this rarely waits).
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return spec_.name; }
  const GroupSpec& spec() const { return spec_; }
  const GroupTopology& topology() const { return topology_; }
  // Whether the group was created with a job token, and whether `token` is it (constant time).
  bool has_job_token() const { return spec_.job_token_commitment != "none"; }
  bool AcceptsJobToken(std::string_view token) const;

  // Submits one local rank's op. Invalid requests fail at once (InvalidArgument) without
  // taking a sequence number; ops on a failed group fail at once with the failure. Otherwise
  // the op completes when it has run on every rank, or fails (Timeout, PeerLost, Desync,
  // Aborted) naming the group, the op and its sequence number.
  // `carried`: the work of an op taken back from the previous epoch (Retire), which this op
  // completes instead of a new one.
  std::shared_ptr<Work> Submit(int group_rank, OpRequest request,
                               std::shared_ptr<Work> carried = nullptr);

  // An op taken back unfinished from a retiring epoch: what each local rank issued (by local
  // index; empty where a rank did not issue it) and the works it completes once it runs again.
  struct TakenBack {
    uint64_t sequence_number = 0;
    std::vector<std::optional<OpRequest>> requests;
    std::vector<std::shared_ptr<Work>> works;
  };
  using RetiredCallback = std::function<void(const Status& failure, std::vector<TakenBack>)>;
  // Ends a shrinking group's epoch at a cut (docs/fault-tolerance.md): the ops up to `through`
  // run as usual; once every one of them concluded, the later ones (which cannot start here or
  // anywhere: a lost rank never issued them) are taken back unfinished and `retired` is called
  // with them, in sequence order, with an OK status, on the thread that concluded last (or this
  // one). If the group fails first, `retired` is called with the failure and nothing (the
  // failure completed every work). A later call may lower `through` (another rank lost before
  // the epoch retired); once `retired` was called, further calls do nothing. The group stays
  // connected until stopped: a peer may still be finishing an op up to the cut.
  void Retire(uint64_t through, RetiredCallback retired);

  // The peer sidecars (node indices) that do not answer a roll call (the group's own, through
  // its store, 750 ms; shared by every sidecar that calls it in this epoch), or nullopt when it
  // cannot tell. May block.
  std::optional<std::vector<int>> SilentPeers();

  // Whether an op's result waits for its commit (docs/fault-tolerance.md, losing a sidecar): in
  // a shrinking group of several sidecars (host or device), an op's data phase first keeps a
  // copy of what it overwrites, and its works complete only once every sidecar finished that
  // data phase (a one-byte combine over the control channel), so that after a sidecar loss the
  // survivors can hand out the ops every one of them finished and run the others again.
  bool commits() const { return commits_; }
  // Called once the group froze: `failure` is OK and `finished_through` the last sequence number
  // whose data phase finished here (committed or not), or the group failed first.
  using FrozenCallback = std::function<void(const Status& failure, uint64_t finished_through)>;
  // Stops a committing group where it is after a sidecar loss: nothing more starts, the
  // connections close (a peer blocked in a transfer with this sidecar notices at once), and
  // once no data phase or commit runs here `frozen` is called, on the thread that ended the
  // last one (or this one). A second call only sets `frozen` if none was. Ops keep coming in
  // (Submit) and wait for RetireFrozen.
  void Freeze(FrozenCallback frozen);
  // After `frozen` was called: the ops up to `cut` (every survivor finished their data phase,
  // so `cut` is at most finished_through) complete with their results; every later op gets back
  // what its data phase overwrote and is taken back unfinished, and `retired` is called with
  // them as Retire does (with the failure, and nothing, if the group failed first).
  void RetireFrozen(uint64_t cut, RetiredCallback retired);

  // Fails every pending and later op with `reason`, publishes it to peers (unless `from_peer`)
  // and closes the connections so blocked peers notice at once. The first reason wins. May block
  // in the hooks (a store call).
  // A peer's failure comes with the last sequence number that peer completed
  // (`peer_completed_through`): ops started here up to that number are let finish first (their
  // peer already did its part: a rank that destroys the group right after its last collective
  // must not fail that collective on the other sidecars); the failure applies once they conclude.
  void Fail(const Status& reason, bool from_peer = false, uint64_t peer_completed_through = 0);

  // Fails the pending ops of `group_rank` (a rank of this sidecar that leaves) with `reason`.
  void AbortRank(int group_rank, const Status& reason);

  // Fails everything with Aborted("destroyed") and stops starting anything. Never blocks.
  void Stop();
  // Whether nothing works for the group any more (after Stop): no step queued or running, no
  // exchange, transfer or completion pending, no timer armed. A transfer blocked in the
  // transport when the group failed ends when the transport gives it back (Abort closes it).
  bool Quiescent() const;

  // OK while healthy; the first failure otherwise.
  Status failure() const;
  // Collectives issued so far by `group_rank` (its sequence number).
  uint64_t SequenceNumber(int group_rank) const;
  // Largest sequence number over the local ranks.
  uint64_t SequenceNumber() const;
  std::vector<InFlightOp> InFlight() const;
  // The flight recorder: the last `limit` finished ops (0 = all kept), oldest first, followed
  // by the ops still in flight.
  std::vector<OpRecord> FlightRecords(size_t limit) const;

 private:
  // The records of the ops started or waiting here, as FlightRecords shows them; with
  // `in_flows_only`, only the started ops that have not concluded. Requires mutex_.
  std::vector<OpRecord> InFlightRecordsLocked(bool in_flows_only) const;
  // An op taken out of pending_ (every local rank arrived, next in order) until it concludes.
  struct StartedOp;
  enum class Phase { kAgreeing, kAgreed, kRunning, kEnqueued };
  // What Pump decided to do once the lock is released.
  struct Step {
    enum Kind { kAgree, kRunHere, kRunOnExecutor } kind;
    StartedOp* op;
  };

  // Starts what can start now: the next op's agreement, the next agreed op's data phase (on the
  // calling thread when Submit allows it, see may_run_inline in group.cc). Requires mutex_;
  // fills `steps` to run after it is released (RunSteps).
  void PumpLocked(std::vector<Step>& steps);
  void RunSteps(std::vector<Step>& steps);

  // Every op's agreement: a full exchange of every rank's announcement, or in a group of at
  // least spec.summary_agreement_from_nodes sidecars a combined summary (a full exchange follows
  // only when the summary finds ranks that disagree, to name them).
  void StartAgreement(StartedOp& op);
  void StartFullAgreement(StartedOp& op);
  void StartSummaryAgreement(StartedOp& op);
  void OnSummary(StartedOp& op, const Status& status);
  void OnSignatures(StartedOp& op, const Status& status);
  // The signatures agree: the per-pair counts of an alltoall are exchanged next, or it is agreed.
  void AfterSignatures(StartedOp& op);
  void OnCounts(StartedOp& op, const Status& status);
  void OnCountsKey(StartedOp& op, const Status& status);
  void OnCountDigests(StartedOp& op, const Status& status);
  // The agreement failed (`status`: its channel's error): reported as the op's failure and the
  // group's, on the executor (the hooks may block).
  void AgreementFailed(StartedOp& op, const Status& status);
  // Every rank agreed: the op may run its data phase.
  void Agreed(StartedOp& op);
  // The op's data phase: on the executor, or inline (one-sidecar host groups).
  void RunData(StartedOp& op, bool inline_run);
  // An asynchronous backend finished (or failed) the op's work.
  void OnDeviceDone(StartedOp& op, const Status& status);
  // The op's flow ended with `status`: it concludes (its works complete, its record is kept)
  // once every earlier op did, and the next steps start. Ends the flow's activity.
  void FinishOp(StartedOp& op, const Status& status);
  // Takes the ops at the front of started_ that ended, in order (requires mutex_).
  void PopEndedLocked(std::vector<std::pair<PendingOp, Status>>& concluded);
  // Applies a peer's deferred failure once no op it spares is left.
  void MaybeApplyDeferredFailure();
  // Takes the ops after the retirement's cut back once every op up to it concluded (Retire).
  void MaybeFinishRetirement();
  // A started op's requests and works, for the next epoch: its works and stream signals go with
  // the copy, and its flow (if any) ends with nothing left to complete (requires mutex_).
  TakenBack TakeBackLocked(StartedOp& started);
  // Takes every op not started yet back into `taken` (after the started ones), which it leaves
  // in sequence order (requires mutex_).
  void TakeBackPendingLocked(std::vector<TakenBack>& taken);
  // Whether the epoch retired: its ops after the cut were taken back (requires mutex_).
  bool RetiredLocked() const { return failure_.ok() && retirement_ && retirement_->done; }

  // Committing groups (group_commits.cc). Before the data phase writes: a copy of every output
  // of the op's local ranks (in place, their inputs), on the device for a device backend.
  Status KeepOutputs(StartedOp& op);
  // Puts back what KeepOutputs kept (nothing when it kept nothing): the op runs again. An error
  // when the device could not copy it back.
  Status RestoreOutputs(StartedOp& op);
  // After the data phase finished here (OK; on a device backend, once the device ran it): the
  // commit exchange, then FinishOp.
  void Commit(StartedOp& op);
  // A transport error in a committing group: when the roll call names lost sidecars, the group
  // freezes and the registry is told (Hooks::sidecars_lost); the status for the op, or nullopt
  // when the error is not a sidecar loss (it fails the group as before).
  std::optional<Status> FreezeOnLostSidecars(const Status& status, const std::string& where);
  // Marks the group frozen (`why`: what its running ops end with) and closes its connections,
  // once (the first call returns true).
  bool BeginFreeze(const Status& why);
  // Calls the freeze's callback once no flow runs here any more.
  void MaybeReportFrozen();

  // Runs a data phase's AwaitReady, algorithm and completion event.
  Status Execute(StartedOp& op);
  // Once the op's work is enqueued: asynchronous backends enqueue its requests' stream
  // signals, and device ops whose requests asked for it (OpRequest::on_enqueued) get the
  // handle of the backend's completion event, which is returned (empty when none was recorded).
  CompletionEvent NotifyEnqueued(PendingOp& op, const OpContext& context);
  // How many ops may be started at once: spec.max_ops_in_flight, 1 for synchronous backends and
  // committing groups.
  size_t Depth() const;

  // Completes every work of `op` with `status` (annotated with the op) and records it.
  void Conclude(PendingOp& op, const Status& status);
  // The reason to report for a transport failure of the op `where`: the group's failure if it
  // already failed, else a reason a peer published, else the error (PeerLost naming the lost
  // sidecars); fails the group with it. May block (the hooks).
  Status PeerError(const Status& status, const std::string& where);
  // The PeerLost reason for a broken connection: names the peer sidecars that no longer
  // answer (a roll call through the store), else lists every peer.
  // `lost`, when given, receives the lost nodes the roll call named (empty when it named none).
  Status NameLostPeers(const Status& broken, std::vector<int>* lost = nullptr);
  std::string Describe(const PendingOp& op) const;

  // Deadlines: one timer for the group, armed for the earliest of them (requires mutex_).
  Clock::TimePoint NextDeadlineLocked() const;
  void ArmTimerLocked();
  void OnTimer();
  // Runs `task` on the executor as an activity of the group.
  void Post(std::function<void()> task);
  // A connection to a peer sidecar broke (ControlChannel::SetBrokenHandler): with ops on the
  // device, nothing else would notice before their deadline.
  void OnPeerConnectionBroken(const Status& why);

  const GroupSpec spec_;
  const GroupTopology topology_;
  const std::shared_ptr<ControlChannel> control_;
  const std::unique_ptr<DataBackend> data_;
  const BackendCapabilities capabilities_;
  std::atomic<bool> signal_failure_logged_{false};  // one warning per group
  const Hooks hooks_;
  Runtime& runtime_;
  Clock& clock_;
  // Every task, callback and timer working for the group (PointToPoint's included).
  ActivityCount activities_;
  // What the control channel's broken-connection handler reaches the group through: cleared
  // (under its mutex) before the group goes away.
  struct BrokenWatch {
    std::mutex mutex;
    Group* group = nullptr;
  };
  std::shared_ptr<BrokenWatch> broken_watch_;
  OpAccounting accounting_;
  PointToPoint point_to_point_;

  mutable std::mutex mutex_;
  Status failure_;  // guarded by mutex_
  // guarded by mutex_: a peer's failure waiting for the ops it spares (up to `through`)
  struct Deferred {
    Status reason;
    uint64_t through = 0;
  };
  std::optional<Deferred> deferred_failure_;
  bool stop_requested_ = false;  // Stop() was called; guarded by mutex_
  // guarded by mutex_: a retirement asked for (Retire), until its callback was called
  struct Retirement {
    uint64_t through = 0;
    RetiredCallback retired;
    bool done = false;
  };
  std::optional<Retirement> retirement_;
  const bool commits_;  // see commits()
  // guarded by mutex_: set once the group froze after a sidecar loss (Freeze)
  struct Freezing {
    FrozenCallback frozen;  // until called
    bool reported = false;
    Status why;  // what the ops still running here end with
  };
  std::optional<Freezing> freezing_;
  // Where each node's announcements (and piggyback slot) sit in an op's signature exchange:
  // fixed by the topology.
  std::vector<size_t> signature_bytes_per_node_;
  std::vector<size_t> signature_offsets_;
  size_t signature_bytes_ = 0;
  std::vector<uint64_t> issued_;           // guarded by mutex_; by local index
  std::map<uint64_t, PendingOp> pending_;  // guarded by mutex_; by sequence number
  uint64_t next_to_start_ = 1;             // guarded by mutex_
  uint64_t concluded_through_ = 0;         // guarded by mutex_; every op up to it concluded
  std::deque<std::unique_ptr<StartedOp>> started_;  // guarded by mutex_; in sequence order
  bool data_busy_ = false;  // guarded by mutex_: a data phase runs (one at a time)
  // guarded by mutex_: ops up to this sequence number were checked for the stuck report
  uint64_t stuck_checked_through_ = 0;
  DeadlineTimer timer_;   // guarded by mutex_: deadlines and the stuck report
  bool failing_ = false;  // guarded by mutex_: a deadline's failure is on its way to Fail
};

}  // namespace collectived
