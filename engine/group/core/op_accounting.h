// OpAccounting: what a group tells the outside world about its ops — the OpRecords built from
// who arrived when, the flight recorder of finished ops, the observer (metrics) and which ops
// were already reported stuck. The executor and point-to-point decide what happens to an op;
// this class only records it.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/group/core/flight_recorder.h"
#include "engine/group/core/pending_op.h"
#include "engine/group/core/topology.h"
#include "engine/vocabulary/op.h"

namespace collectived {

class OpAccounting {
 public:
  // `topology` and `clock` must outlive this object; `observer` may be null.
  // `device`: where the group's tensors live (every record carries it).
  OpAccounting(std::string group, DeviceKind device, const GroupTopology& topology,
               std::shared_ptr<OpObserver> observer, size_t flight_recorder_size,
               const Clock& clock = Clock::Real());

  // The membership epoch every record is stamped with (GroupSpec::epoch); 0 unless set.
  void set_epoch(int epoch) { epoch_ = epoch; }

  // The record of one rank's request, before anything happened to it: op, dtype, sizes as
  // nccl-tests counts them, bus-bandwidth factor, root; every rank's arrival unknown.
  OpRecord Base(const OpRequest& request, uint64_t sequence_number) const;
  // The record of a collective in `state`: its local and (once agreed) global arrivals, the
  // straggler and the skew, the local ranks that have not arrived.
  OpRecord Of(const PendingOp& op, OpRecord::State state, const Status& status) const;

  // Reports a finished op (completed, failed or refused) to the observer and keeps it in the
  // flight recorder.
  void Finish(OpRecord record);
  // The last `limit` finished ops (0 = all kept), oldest first.
  std::vector<OpRecord> Finished(size_t limit) const;

  // Reports to the observer that the data backend was aborted while in use (see OpObserver).
  void BackendAborted(ErrorKind reason);
  // Reports to the observer that an op's data backend call failed with `kind`.
  void BackendError(ErrorKind kind);

  // Its wall-clock time, as records carry it.
  std::chrono::system_clock::time_point WallNow() const {
    return std::chrono::system_clock::time_point(std::chrono::microseconds(clock_.UnixMicros()));
  }

 private:
  const std::string group_;
  const DeviceKind device_;
  const GroupTopology& topology_;
  const std::shared_ptr<OpObserver> observer_;
  const Clock& clock_;
  int epoch_ = 0;
  FlightRecorder recorder_;
};

}  // namespace collectived
