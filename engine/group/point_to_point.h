// PointToPoint: send and recv for one group on this sidecar.
//
// Between two ranks of this sidecar, sends and receives are matched per (source, destination,
// tag) in issue order (c10d's order for one pair and tag) and the bytes are copied. Towards a
// rank of another sidecar the transfer is handed to the group's data backend. A local op left
// unmatched fails when its timeout passes; one timer thread watches every deadline (started with
// the first unmatched op), instead of a thread per pending op.
//
// Thread-safety: every method may be called from any thread.
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
#include <tuple>

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
  // Stops the timer thread; pending local ops must have been failed (FailAll) before.
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // Submits local rank `group_rank`'s send or recv, already validated (ValidateRequest). The
  // work completes when the bytes moved; fails with InvalidArgument when the matched send and
  // recv differ in size, ResourceExhausted when kMaxPending are already pending, Timeout after
  // `timeout`, or the group's failure.
  std::shared_ptr<Work> Submit(int group_rank, OpRequest request,
                               std::chrono::milliseconds timeout);

  // The group failed: every pending op and every later one fails with `reason`.
  void FailAll(const Status& reason);
  // Local rank `group_rank` leaves: its pending ops, and local ones waiting for it, fail.
  void FailRank(int group_rank, const Status& reason);

  // Whether nothing is in flight: no remote transfer running in the backend, no timer thread.
  bool Idle() const;

 private:
  // Unmatched local ops of one (source, destination, tag): at most one of the queues is
  // non-empty at a time.
  using Key = std::tuple<int, int, int64_t>;
  // When each unmatched local op times out; every entry of boxes_ has exactly one.
  using Deadlines =
      std::multimap<std::chrono::steady_clock::time_point, std::pair<Key, std::shared_ptr<Work>>>;
  struct Entry {
    TensorView tensor;
    std::shared_ptr<Work> work;
    std::string where;
    Deadlines::iterator deadline;
  };
  struct Mailbox {
    std::deque<Entry> sends, recvs;
  };

  std::shared_ptr<Work> SubmitLocal(bool is_send, int group_rank, const TensorView& tensor,
                                    const std::shared_ptr<Work>& work, const std::string& where,
                                    int64_t tag, int peer);
  void SubmitRemote(bool is_send, int group_rank, const TensorView& tensor,
                    const std::shared_ptr<Work>& work, const std::string& where, int64_t tag,
                    int peer, std::chrono::milliseconds timeout);
  void TimerLoop();
  // "send on group 'g'": how a failure of the whole group is annotated for one of its ops.
  std::string OnGroup(const Work& work) const;
  // Removes `work` from its mailbox, with its deadline; nullopt if it is no longer there.
  std::optional<Entry> Unqueue(const Key& key, const std::shared_ptr<Work>& work);
  // ResourceExhausted when kMaxPending ops are pending (mutex_ held).
  Status CheckCapacityLocked(const std::string& where) const;

  const std::string group_;
  const GroupTopology& topology_;
  DataBackend& backend_;
  OpAccounting& accounting_;
  const TransportError transport_error_;

  mutable std::mutex mutex_;
  std::condition_variable timer_wakeup_;
  Status failure_;                          // guarded by mutex_
  std::map<Key, Mailbox> boxes_;            // guarded by mutex_
  Deadlines deadlines_;                     // guarded by mutex_; one per unmatched local op
  std::set<std::shared_ptr<Work>> remote_;  // guarded by mutex_; failed at once by FailAll
  bool stopping_ = false;                   // guarded by mutex_
  std::thread timer_;                       // started with the first unmatched local op
};

}  // namespace collectived
