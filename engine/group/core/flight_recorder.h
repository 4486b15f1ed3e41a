// The flight recorder: what happened to the last N ops of a group (op kind, dtype, count,
// sequence number, state, per-rank arrival times, duration), and the observer interface through
// which the engine reports every op to the outside (metrics) without knowing who listens.
//
// Thread-safety: FlightRecorder may be used from any thread. OpObserver implementations must
// accept calls from any thread and return quickly (they run on the group's executor).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/reduce_op.h"
#include "engine/vocabulary/status.h"

namespace collectived {

struct OpRecord {
  enum class State { kWaitingForPeers, kRunning, kCompleted, kFailed };

  std::string group;
  int epoch = 0;                         // the membership epoch it ran in (fault_tolerance.h)
  DeviceKind device = DeviceKind::kCpu;  // where the group's tensors live
  uint64_t sequence_number = 0;          // 0 for send/recv and for ops refused before they got one
  OpKind kind{};                         // 0 ("unknown") only in a record made without a request
  DType dtype = DType::kUnspecified;
  uint64_t count = 0;       // elements of this rank's input
  uint64_t bytes = 0;       // the op's size as nccl-tests counts it (algbw = bytes / time)
  double bus_factor = 1.0;  // nccl-tests' bus-bandwidth factor for the op and group size
  ReduceOp reduce_op;
  bool reducing = false;
  int root = -1;
  int group_size = 0;
  State state = State::kWaitingForPeers;
  Status status;
  std::chrono::system_clock::time_point issued;  // first arrival of a rank of this sidecar
  std::chrono::microseconds duration{0};         // issue to completion (or to now)
  // The arrivals this sidecar knows, in group-rank order: (rank, microseconds after the first
  // rank's arrival anywhere). Every rank's once a full agreement exchanged them; in a group that
  // agrees through summaries (from 64 sidecars) this sidecar's ranks and the group's first and
  // last only, so that a record costs O(local ranks), not O(R), per op.
  std::vector<std::pair<int, int64_t>> known_arrivals_us;
  int last_rank = -1;                 // the rank that arrived last (the straggler)
  std::chrono::microseconds skew{0};  // last arrival - first arrival
  std::vector<int> missing_ranks;     // in flight: ranks of this sidecar that have not arrived
  bool last_rank_is_local = false;
  // Microseconds after `issued` when the op's data phase began (all ranks arrived and agreed),
  // when its device work was enqueued, and when the device reported it done; -1 = not reached
  // (enqueued and device done: asynchronous backends only).
  int64_t data_started_us = -1;
  int64_t enqueued_us = -1;
  int64_t device_done_us = -1;

  // Per group rank (group_size of them): microseconds after the first rank's arrival anywhere,
  // -1 = unknown or not yet.
  std::vector<int64_t> RankArrivalUs() const;

  // Waiting for peers or running: not concluded yet.
  bool InFlight() const { return state == State::kWaitingForPeers || state == State::kRunning; }
};

std::string_view OpStateName(OpRecord::State state);

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // An op finished on this sidecar (successfully or not; refused ops included).
  virtual void OnOpFinished(const OpRecord& record) = 0;
  // An op has been in flight longer than the stuck threshold (reported once per op).
  virtual void OnOpStuck(const OpRecord& record) = 0;
  // The group left this sidecar: forget what is labelled with it.
  virtual void OnGroupGone(const std::string& group) = 0;
  // The group's data backend (Gloo's connections, NCCL's communicator) was aborted while in use
  // because of a failure of kind `reason` (a timeout, a lost peer, an operator's abort, ...);
  // reported once per group failure, not for the teardown of an idle group.
  virtual void OnBackendAborted(const std::string& group, DeviceKind device, ErrorKind reason) {
    (void)group, (void)device, (void)reason;
  }
  // An op's call into the data backend failed with `kind` (a library error, or a lost peer or
  // timeout the library saw); requests the backend refuses (InvalidArgument) are not counted.
  virtual void OnBackendError(const std::string& group, DeviceKind device, ErrorKind kind) {
    (void)group, (void)device, (void)kind;
  }
  // A shrinking group changed its membership here: it is now in `epoch`, for `reason`
  // ("rank_lost" or "rank_joined"; docs/fault-tolerance.md).
  virtual void OnMembershipChange(const std::string& group, int epoch, const std::string& reason) {
    (void)group, (void)epoch, (void)reason;
  }
};

// A bounded ring of the most recent finished ops of one group.
class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}
  void Add(OpRecord record);
  // The most recent `limit` records (0 = all), oldest first.
  std::vector<OpRecord> Snapshot(size_t limit) const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<OpRecord> records_;  // guarded by mutex_
};

}  // namespace collectived
