// Group: this sidecar's part of one process group. It collects the ops that its local ranks
// issue, gives them sequence numbers, runs them in issue order on one executor thread (after
// every rank, local and remote, agreed on what the op is, over the control channel), and fails
// them all — promptly and with the reason — when the group is aborted, a rank is lost or a peer
// sidecar goes away. The data moves through the group's DataBackend; send/recv go through
// PointToPoint; what happened to each op is recorded by OpAccounting.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/flight_recorder.h"
#include "engine/group/op_accounting.h"
#include "engine/group/op_tags.h"
#include "engine/group/pending_op.h"
#include "engine/group/point_to_point.h"
#include "engine/group/topology.h"
#include "engine/group/transport_factory.h"
#include "engine/op.h"
#include "engine/work.h"

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
};

// Across sidecars, an allreduce of at most kPiggybackPayloadBytes travels with the op's signature
// exchange: one network round instead of two.
inline constexpr size_t kPiggybackSlotBytes = 256;
inline constexpr size_t kPiggybackHeaderBytes = 8;  // byte 0: 1 when the slot carries data
inline constexpr size_t kPiggybackPayloadBytes = kPiggybackSlotBytes - kPiggybackHeaderBytes;

class Group {
 public:
  // Hooks to the world outside the group (the registry wires them to the rendezvous store).
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
  };

  // `transport` must be connected for `topology` (TransportFactory::Connect).
  Group(GroupSpec spec, GroupTopology topology, GroupTransport transport, Hooks hooks);
  // Must only run once ThreadsExited() (GroupRegistry parks stopped groups until then): it
  // joins the executor and the point-to-point machinery.
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
  std::shared_ptr<Work> Submit(int group_rank, OpRequest request);

  // Fails every pending and later op with `reason`, publishes it to peers (unless `from_peer`)
  // and closes the connections so blocked peers notice at once. The first reason wins.
  // A peer's failure comes with the last sequence number that peer completed
  // (`peer_completed_through`): an op running here up to that number is let finish first (its
  // peer already did its part: a rank that destroys the group right after its last collective
  // must not fail that collective on the other sidecars); the failure applies once it concludes.
  void Fail(const Status& reason, bool from_peer = false, uint64_t peer_completed_through = 0);

  // Fails the pending ops of `group_rank` (a rank of this sidecar that leaves) with `reason`.
  void AbortRank(int group_rank, const Status& reason);

  // Fails everything with Aborted("destroyed") and lets the executor exit. Never blocks.
  void Stop();
  // Whether every thread working for the group has exited (after Stop). A transfer blocked in
  // the transport when the group failed (Gloo does not wake a pending send when connections
  // close) ends when its own timeout passes; its op was already failed by Fail.
  bool ThreadsExited() const;

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
  // In-flight ops older than `threshold` that were not reported before (each is reported once).
  std::vector<OpRecord> TakeNewlyStuck(std::chrono::milliseconds threshold);

 private:
  void ExecutorLoop();
  // The executor's sleep until `until` or a change it must act on (see Submit). Called with
  // `lock` held; holds it again on return.
  void WaitForChange(std::unique_lock<std::mutex>& lock,
                     std::chrono::steady_clock::time_point until);
  // Takes the op at `it` (every local rank arrived, next in order) out of pending_, runs it and
  // concludes it. Called with `lock` (on mutex_) held; releases it while the op runs and holds
  // it again on return.
  void RunNext(std::unique_lock<std::mutex>& lock, std::map<uint64_t, PendingOp>::iterator it);
  // Runs one op whose local ranks have all arrived: agreement, then the algorithm.
  Status Execute(PendingOp& op);
  // Device ops whose requests asked for it (OpRequest::on_enqueued): records the backend's
  // completion event once the op's work is enqueued and hands its handle to them.
  void NotifyEnqueued(const OpContext& context);
  // Exchanges every rank's signature (and, when more than one node takes part, a fixed-size
  // slot per node that carries a small allreduce's combined local contribution) and checks that
  // all ranks issued the same op. `*piggybacked` tells whether every node's slot carries its
  // contribution (then `*slots`, kPiggybackSlotBytes per node in node order, holds them all and
  // the op needs no other network round).
  Status CheckAgreement(PendingOp& op, const OpTags& tags, std::chrono::milliseconds timeout,
                        std::vector<std::byte>* slots, bool* piggybacked);

  // Completes every work of `op` with `status` (annotated with the op) and records it.
  void Conclude(PendingOp& op, const Status& status);
  // The reason to report for a transport failure of the op `where`: the group's failure if it
  // already failed, else a reason a peer published, else the error (PeerLost naming the lost
  // sidecars); fails the group with it.
  Status PeerError(const Status& status, const std::string& where);
  // The PeerLost reason for a broken connection: names the peer sidecars that no longer
  // answer (a roll call through the store), else lists every peer.
  Status NameLostPeers(const Status& broken);
  std::string Describe(const PendingOp& op) const;

  const GroupSpec spec_;
  const GroupTopology topology_;
  const std::unique_ptr<ControlChannel> control_;
  const std::unique_ptr<DataBackend> data_;
  const Hooks hooks_;
  OpAccounting accounting_;
  PointToPoint point_to_point_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Status failure_;                          // guarded by mutex_
  std::optional<Status> deferred_failure_;  // guarded by mutex_; applies after the running op
  bool stopping_ = false;                   // guarded by mutex_
  bool stop_requested_ = false;             // Stop() was called; guarded by mutex_
  std::vector<uint64_t> issued_;            // guarded by mutex_; by local index
  std::map<uint64_t, PendingOp> pending_;   // guarded by mutex_; by sequence number
  uint64_t next_to_run_ = 1;                // guarded by mutex_
  std::optional<RunningOp> running_;        // guarded by mutex_
  bool executor_done_ = false;              // guarded by mutex_
  // Until when the executor sleeps on changed_: a Submit that needs nothing from it before
  // then (an arrival that completes no op it must run, a deadline no sooner) does not wake it.
  // time_point::min() while it is awake. Guarded by mutex_.
  std::chrono::steady_clock::time_point executor_sleeps_until_ =
      std::chrono::steady_clock::time_point::min();

  std::thread executor_;
};

}  // namespace collectived
