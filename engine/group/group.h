// Group: this sidecar's part of one process group. It collects the ops that its local ranks
// issue, gives them sequence numbers, runs them in issue order on one executor thread (after
// every rank, local and remote, agreed on what the op is), and fails them all — promptly and
// with the reason — when the group is aborted, a rank is lost or a peer sidecar goes away.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/flight_recorder.h"
#include "engine/group/algorithms.h"
#include "engine/group/node_comm.h"
#include "engine/group/topology.h"
#include "engine/op.h"
#include "engine/work.h"

namespace collectived {

struct GroupSpec {
  std::string name;
  std::vector<int> members;  // sorted global ranks
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::shared_ptr<OpObserver> observer;  // may be null
  size_t flight_recorder_size = 256;
};

// What an operator sees of an op that has not completed (admin API, watchdog).
struct InFlightOp {
  uint64_t sequence_number;
  std::string op;
  std::vector<int> arrived_local_ranks;
  std::vector<int> missing_local_ranks;
  std::chrono::steady_clock::time_point first_arrival;
};

class Group {
 public:
  // Hooks to the world outside the group (the registry wires them to the rendezvous store).
  struct Hooks {
    // Called once when the group fails for a reason found here (not one learned from a peer),
    // before connections are closed, so peers can learn the reason.
    std::function<void(const Status&)> publish_failure;
    // Looks up a reason published by a peer after a connection to it broke; nullopt if none.
    std::function<std::optional<Status>()> lookup_failure;
    // After a connection broke with no reason published: asks the peer sidecars (by id) to
    // answer, and returns the indices of those that did not within `budget`, or nullopt when
    // it cannot tell (the store is unreachable). Names the sidecar that died.
    std::function<std::optional<std::vector<int>>(const std::vector<std::string>& peer_ids,
                                                  std::chrono::milliseconds budget)>
        roll_call;
  };

  Group(GroupSpec spec, GroupTopology topology, std::unique_ptr<NodeComm> comm, Hooks hooks);
  // Must only run once Finished() (GroupRegistry parks stopped groups until then): it joins
  // the executor and the point-to-point threads.
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return spec_.name; }
  const GroupSpec& spec() const { return spec_; }
  const GroupTopology& topology() const { return topology_; }

  // Submits one local rank's op. Invalid requests fail at once (InvalidArgument) without
  // taking a sequence number; ops on a failed group fail at once with the failure. Otherwise
  // the op completes when it has run on every rank, or fails (Timeout, PeerLost, Desync,
  // Aborted) naming the group, the op and its sequence number.
  std::shared_ptr<Work> Submit(int group_rank, OpRequest request);

  // Fails every pending and later op with `reason`, publishes it to peers (unless `from_peer`)
  // and closes the connections so blocked peers notice at once. The first reason wins.
  void Fail(const Status& reason, bool from_peer = false);

  // Fails the pending ops of `group_rank` (a rank of this sidecar that leaves) with `reason`.
  void AbortRank(int group_rank, const Status& reason);

  // Fails everything with Aborted("destroyed") and lets the executor exit. Never blocks.
  void Stop();
  // Whether every thread of the group has exited (after Stop). A thread blocked inside Gloo
  // when the group failed (Gloo does not wake a pending send when connections close) exits
  // when that Gloo call times out; its ops were already failed by Fail.
  bool Finished() const;

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
  struct PendingOp {
    uint64_t sequence_number = 0;
    std::vector<std::optional<OpRequest>> requests;  // by local index
    std::vector<std::shared_ptr<Work>> works;        // by local index
    std::vector<std::chrono::steady_clock::time_point> arrivals;
    std::vector<int64_t> local_arrival_unix_us;  // by local index
    std::vector<int64_t> arrival_unix_us;        // by group rank, filled by the agreement exchange
    size_t arrived = 0;
    std::chrono::steady_clock::time_point first_arrival;
    std::chrono::milliseconds timeout{0};
  };

  void ExecutorLoop();
  Status Execute(PendingOp& op);
  Status CheckAgreement(PendingOp& op, uint32_t tag, std::chrono::milliseconds timeout);
  Status NetworkError(const Status& status, const PendingOp& op);
  // The reason to report for a transport failure of the op `where` (a published reason if a
  // peer gave one); fails the group with it.
  Status PeerError(const Status& status, const std::string& where);
  // The PeerLost reason for a broken connection: names the peer sidecars that no longer
  // answer (a roll call through the store), else lists every peer.
  Status NameLostPeers(const Status& broken);
  std::string Describe(const PendingOp& op) const;
  OpRecord BaseRecord(const OpRequest& request, uint64_t sequence_number) const;
  OpRecord RecordOf(const PendingOp& op, OpRecord::State state, const Status& status) const;
  void Finished(OpRecord record);
  std::shared_ptr<Work> SubmitPointToPoint(int group_rank, OpRequest request);
  void ReapFinishedPeerThreads();

  const GroupSpec spec_;
  const GroupTopology topology_;
  const std::unique_ptr<NodeComm> comm_;
  const Hooks hooks_;
  Scratch scratch_;  // executor thread only
  FlightRecorder recorder_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Status failure_;                                    // guarded by mutex_
  bool stopping_ = false;                             // guarded by mutex_
  std::vector<uint64_t> issued_;                      // guarded by mutex_; by local index
  std::map<uint64_t, PendingOp> pending_;             // guarded by mutex_; by sequence number
  uint64_t next_to_run_ = 1;                          // guarded by mutex_
  std::optional<InFlightOp> running_;                 // guarded by mutex_; for InFlight()
  std::vector<std::shared_ptr<Work>> running_works_;  // guarded by mutex_; failed by Fail()
  bool executor_done_ = false;                        // guarded by mutex_
  std::optional<OpRecord> running_record_;            // guarded by mutex_
  std::set<uint64_t> stuck_reported_;                 // guarded by mutex_

  // Point to point between two local ranks: unmatched sends and receives per (src, dst, tag).
  struct Mailbox {
    std::deque<std::pair<TensorView, std::shared_ptr<Work>>> sends, recvs;
  };
  std::map<std::tuple<int, int, int64_t>, Mailbox> mailboxes_;  // guarded by mutex_
  struct PeerThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<PeerThread> peer_threads_;        // guarded by mutex_
  std::set<std::shared_ptr<Work>> remote_p2p_;  // guarded by mutex_; failed by Fail()

  std::thread executor_;
};

}  // namespace collectived
