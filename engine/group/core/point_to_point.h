// PointToPoint: send and recv for one group on this sidecar.
//
// Every send is matched on the destination's sidecar, in one place, against the recvs of its
// (destination, tag): a recv names its source or takes any source (kAnySource), and the first
// matching send to arrive wins, so each send is consumed by exactly one recv and the sends of one
// (source, destination, tag) are received in issue order (c10d's order).
//
// Between two ranks of this sidecar the bytes are copied. A send towards a rank of another
// sidecar announces itself first (an envelope: source, destination, tag, bytes, on a stream of
// its own between the two sidecars, through the group's transport) and hands its bytes to the
// group's data backend (which stages device memory); the destination's sidecar receives the
// envelopes of every peer sidecar as they come and, once one matches a recv, receives the bytes
// from that sender. Envelopes and bytes of one sender travel in order, so the k-th envelope of
// (source, destination, tag) announces its k-th message.
//
// An announced send matched with its recv starts its transfer at once on a host backend; on an
// asynchronous (device) backend the start makes device calls that may wait (NcclBackend records
// an event, and waits for the trainer's), which must not run where envelopes arrive (the
// transport's I/O thread, shared by every transfer of the mesh): such starts are queued in the
// order of their matches and run one at a time, by the recv's submitting thread when it matched
// (so that the transfer is ordered on the device before the trainer's next op, as on a host
// backend), else on the executor. A queued start whose transfer already timed out is dropped.
//
// A local op left unmatched fails when its timeout passes, without failing the group; a remote
// transfer that does not finish in time fails the group (its stream would be out of step). One
// timer of the runtime's TimerQueue watches the earliest deadline; every transfer completes
// through the backend's callback; nothing here holds a thread while it waits. Work that may
// block (reporting a transport failure through the group's hooks) runs on the executor.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/deadline_timer.h"
#include "engine/concurrency/runtime.h"
#include "engine/group/core/op_accounting.h"
#include "engine/group/core/topology.h"
#include "engine/group/transport/data_backend.h"
#include "engine/group/transport/message_transport.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/work.h"

namespace collectived {

class PointToPoint {
 public:
  // Sends and receives of one group that may be pending at once on this sidecar (unmatched
  // local ones plus remote transfers in flight). More are refused: each holds memory.
  static constexpr size_t kMaxPending = 4096;

  // Turns a transport failure of a remote transfer into the reason reported for it, failing the
  // group on the way (Group::PeerError). May block; called on the executor.
  using TransportError = std::function<Status(const Status& error, const std::string& where)>;

  // `topology`, `backend`, `accounting`, `runtime` and `activities` must outlive this object;
  // every callback, task and timer working for it counts in `activities` (the group's).
  // `envelopes` carries the announcements of sends between sidecars (host memory, whatever
  // the backend's device; null with one node).
  PointToPoint(std::string group, const GroupTopology& topology, DataBackend& backend,
               std::shared_ptr<MessageTransport> envelopes, OpAccounting& accounting,
               Runtime& runtime, ActivityCount& activities, TransportError transport_error);
  // Pending ops must have been failed (FailAll) before, and the backend aborted (its transfers,
  // the envelope receivers included, finished: `activities` idle).
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // Submits local rank `group_rank`'s send or recv, already validated (ValidateRequest); a recv
  // whose peer is kAnySource takes the first matching send from any rank. The work completes
  // when the bytes moved, a recv's with its sender in Work::source_rank(); fails with
  // InvalidArgument when the matched send and recv differ in size, ResourceExhausted when
  // kMaxPending are already pending, Timeout after `timeout`, or the group's failure.
  std::shared_ptr<Work> Submit(int group_rank, OpRequest request,
                               std::chrono::milliseconds timeout);

  // The group failed: every pending op and every later one fails with `reason`.
  void FailAll(const Status& reason);
  // Local rank `group_rank` leaves: its pending ops, and local ones waiting for it, fail.
  void FailRank(int group_rank, const Status& reason);

 private:
  // Sends and recvs meet per (destination, tag).
  using Key = std::pair<int, int64_t>;
  // When each unmatched local op and each remote transfer times out; every local entry of boxes_
  // has exactly one (a remote transfer's has no mailbox key: Key{-1, 0}).
  using Deadlines =
      std::multimap<std::chrono::steady_clock::time_point, std::pair<Key, std::shared_ptr<Work>>>;
  // A send waiting for its recv: a local rank's (work set), or one a peer sidecar announced
  // (work null: its bytes wait on the sender's sidecar until a recv here clears them).
  struct PendingSend {
    int source = 0;
    size_t bytes = 0;
    TensorView tensor;
    std::shared_ptr<Work> work;
    std::string where;
    Deadlines::iterator deadline;
  };
  struct PendingRecv {
    int source = 0;  // a group rank or kAnySource
    TensorView tensor;
    std::shared_ptr<Work> work;
    std::string where;
    Deadlines::iterator deadline;
  };
  struct Mailbox {
    std::deque<PendingSend> sends;
    std::deque<PendingRecv> recvs;
  };
  // What a send to another sidecar announces there; fixed size, host byte order (the sidecars of
  // a group run the same build).
  struct Envelope {
    int32_t source = 0;
    int32_t destination = 0;
    int64_t tag = 0;
    uint64_t bytes = 0;
  };
  using EnvelopeBytes = std::array<std::byte, sizeof(Envelope)>;

  void SubmitSend(int group_rank, const TensorView& tensor, const std::shared_ptr<Work>& work,
                  const std::string& where, int64_t tag, int peer);
  void SubmitRecv(int group_rank, const TensorView& tensor, const std::shared_ptr<Work>& work,
                  const std::string& where, int64_t tag, int peer);
  void SendRemote(int group_rank, const TensorView& tensor, const std::shared_ptr<Work>& work,
                  const std::string& where, int64_t tag, int peer);
  // Copies a matched local send into its recv and completes both.
  void CompleteLocal(PendingSend send, PendingRecv recv);
  // Receives the bytes of an announced send from `send.source` into `recv` (remote_ already
  // holds recv.work).
  void ReceiveAnnounced(const PendingSend& send, const PendingRecv& recv, const Key& key);
  // An announced send and its recv, matched, whose transfer has yet to start.
  struct Announced {
    PendingSend send;
    PendingRecv recv;
    Key key;
  };
  // Queues `announced` behind those matched before it (mutex_ held; only where
  // queue_announced_). True when the caller is to start the queue
  // (StartQueuedAnnounced, once it let go of mutex_): none was starting it.
  bool QueueAnnouncedLocked(Announced announced);
  // Starts the queued announced transfers one at a time, in order, until none is left; none
  // once the group failed (FailAll failed their works), and none whose work is no longer a
  // remote transfer in flight (its deadline passed).
  void StartQueuedAnnounced();
  // Queues an unmatched local op (or a remote transfer) with its deadline (mutex_ held).
  Deadlines::iterator AddDeadlineLocked(const Key& key, const std::shared_ptr<Work>& work);
  // One timer for the earliest deadline (mutex_ held).
  void ArmTimerLocked();
  void OnTimer();
  // A remote transfer of `work` ended with `result`: completes it, through the group's
  // TransportError (on the executor) for a transport failure.
  void FinishRemote(const std::shared_ptr<Work>& work, const std::string& where, Status result,
                    int source);
  // Starts a transfer of a tensor's bytes (through the backend, which stages device memory) or
  // of an envelope (through the transport directly); its callback counts as an activity.
  void StartTransfer(bool is_send, void* data, size_t bytes, int node, const P2PKey& key,
                     DataBackend::Done done);
  void StartEnvelopeTransfer(bool is_send, void* data, int node, const P2PKey& key,
                             DataBackend::Done done);
  // `done` counted as an activity until it returned.
  DataBackend::Done Counted(DataBackend::Done done);
  // Runs `task` on the executor, counted as an activity.
  void Post(std::function<void()> task);

  // Envelope receivers, one per peer sidecar, started with the first op submitted here.
  void StartEnvelopeReceiversLocked(std::vector<int>& nodes);
  void ReceiveEnvelope(int node);
  void OnEnvelope(int node, const EnvelopeBytes& bytes, const Status& status);
  // Hands a transport failure that concerns no single work to the group (on the executor).
  void ReportLoss(const Status& status, const std::string& where);
  // "send on group 'g'": how a failure of the whole group is annotated for one of its ops.
  std::string OnGroup(const Work& work) const;
  // Removes `work` from its mailbox, with its deadline; its tensor and annotation if it was
  // still there.
  std::optional<std::pair<TensorView, std::string>> Unqueue(const Key& key,
                                                            const std::shared_ptr<Work>& work);
  // ResourceExhausted when kMaxPending ops are pending (mutex_ held).
  Status CheckCapacityLocked(const std::string& where) const;

  const std::string group_;
  const GroupTopology& topology_;
  DataBackend& backend_;
  const std::shared_ptr<MessageTransport> envelopes_;
  OpAccounting& accounting_;
  Runtime& runtime_;
  // Whether announced transfers start through the queue: an asynchronous backend's.
  const bool queue_announced_;
  ActivityCount& activities_;
  const TransportError transport_error_;

  // Held while a remote send posts its envelope and its bytes, so that concurrent sends reach
  // the backend's streams in one order.
  std::mutex post_mutex_;
  mutable std::mutex mutex_;
  Status failure_;                // guarded by mutex_
  std::map<Key, Mailbox> boxes_;  // guarded by mutex_
  // guarded by mutex_; one per pending op: each unmatched local op and remote transfer
  Deadlines deadlines_;
  // guarded by mutex_: remote transfers in flight, with their deadlines; failed at once by FailAll
  std::map<std::shared_ptr<Work>, Deadlines::iterator> remote_;
  std::deque<Announced> announced_;   // guarded by mutex_: see QueueAnnouncedLocked
  bool starting_announced_ = false;   // guarded by mutex_: a StartQueuedAnnounced will run
  bool receiving_envelopes_ = false;  // guarded by mutex_
  // guarded by mutex_; why a peer sidecar's envelopes stopped (by node), while the group lives
  std::map<int, Status> envelopes_lost_;
  DeadlineTimer timer_;  // guarded by mutex_
};

}  // namespace collectived
