// PointToPoint: send and recv for one group on this sidecar.
//
// Every send is matched on the destination's sidecar, in one place, against the recvs of its
// (destination, tag): a recv names its source or takes any source (kAnySource), and the first
// matching send to arrive wins, so each send is consumed by exactly one recv and the sends of one
// (source, destination, tag) are received in issue order (c10d's order).
//
// Between two ranks of this sidecar the bytes are copied. A send towards a rank of another
// sidecar announces itself first (an envelope: source, destination, tag, bytes, on a stream of
// its own between the two sidecars) and hands its bytes to the group's data backend; the
// destination's sidecar receives the envelopes of every peer sidecar as they come and, once one
// matches a recv, receives the bytes from that sender. Envelopes and bytes of one sender travel
// in order, so the k-th envelope of (source, destination, tag) announces its k-th message.
//
// A local op left unmatched fails when its timeout passes, without failing the group; one timer
// thread watches every deadline (started with the first unmatched op), instead of a thread per
// pending op.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/group/data_backend.h"
#include "engine/group/op_accounting.h"
#include "engine/group/topology.h"
#include "engine/op.h"
#include "engine/work.h"

namespace collectived {

class PointToPoint {
 public:
  // Sends and receives of one group that may be pending at once on this sidecar (unmatched
  // local ones plus remote transfers in flight). More are refused: each holds memory, and a
  // remote one over Gloo a thread.
  static constexpr size_t kMaxPending = 4096;

  // Turns a transport failure of a remote transfer into the reason reported for it, failing the
  // group on the way (Group::PeerError). Called on a backend thread.
  using TransportError = std::function<Status(const Status& error, const std::string& where)>;

  // `topology`, `backend` and `accounting` must outlive this object.
  PointToPoint(std::string group, const GroupTopology& topology, DataBackend& backend,
               OpAccounting& accounting, TransportError transport_error);
  // Stops the timer thread; pending local ops must have been failed (FailAll) before, and the
  // backend aborted (its transfers, the envelope receivers included, finished: Idle()).
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

  // Whether nothing is in flight: no remote transfer running in the backend, no timer thread.
  bool Idle() const;

 private:
  // Sends and recvs meet per (destination, tag).
  using Key = std::pair<int, int64_t>;
  // When each unmatched local op times out; every local entry of boxes_ has exactly one.
  using Deadlines =
      std::multimap<std::chrono::steady_clock::time_point, std::pair<Key, std::shared_ptr<Work>>>;
  // A send waiting for its recv: a local rank's (work set), or one a peer sidecar announced
  // (work null: its bytes wait in the backend until a recv asks for them).
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
  // Queues an unmatched local op with its deadline (mutex_ held).
  Deadlines::iterator AddDeadlineLocked(const Key& key, const std::shared_ptr<Work>& work);

  // Envelope receivers, one per peer sidecar, started with the first op submitted here.
  void StartEnvelopeReceiversLocked(std::vector<int>& nodes);
  void ReceiveEnvelope(int node);
  void OnEnvelope(int node, const EnvelopeBytes& bytes, const Status& status);

  void TimerLoop();
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
  OpAccounting& accounting_;
  const TransportError transport_error_;

  // Held while a remote send posts its envelope and its bytes, so that concurrent sends reach
  // the backend's streams in one order.
  std::mutex post_mutex_;
  mutable std::mutex mutex_;
  std::condition_variable timer_wakeup_;
  Status failure_;                          // guarded by mutex_
  std::map<Key, Mailbox> boxes_;            // guarded by mutex_
  Deadlines deadlines_;                     // guarded by mutex_; one per unmatched local op
  std::set<std::shared_ptr<Work>> remote_;  // guarded by mutex_; failed at once by FailAll
  bool receiving_envelopes_ = false;        // guarded by mutex_
  // guarded by mutex_; why a peer sidecar's envelopes stopped (by node), while the group lives
  std::map<int, Status> envelopes_lost_;
  bool stopping_ = false;  // guarded by mutex_
  std::thread timer_;      // started with the first unmatched local op
};

}  // namespace collectived
