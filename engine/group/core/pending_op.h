// PendingOp and RunningOp: one collective of a group as its executor sees it — from the first
// local rank's arrival until it runs (PendingOp), and while it runs (RunningOp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/group/core/flight_recorder.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/work.h"

namespace collectived {

struct PendingOp {
  uint64_t sequence_number = 0;
  std::vector<std::optional<OpRequest>> requests;  // by local index; empty = not arrived yet
  std::vector<std::shared_ptr<Work>> works;        // by local index
  std::vector<int64_t> local_arrival_unix_us;      // by local index, -1 = not arrived
  // Arrivals known once agreed, (group rank, unix us) in rank order: every rank's after a full
  // exchange, this node's ranks and the group's first and last after a summary.
  std::vector<std::pair<int, int64_t>> arrival_unix_us;
  size_t arrived = 0;
  std::chrono::steady_clock::time_point first_arrival;
  std::chrono::milliseconds timeout{0};
  // Where the op's time went (the flight recorder's stages; unset = not reached): its data phase
  // began (every rank arrived and agreed), its device work was enqueued (asynchronous backends),
  // and the backend reported that work done.
  std::chrono::steady_clock::time_point data_started{};
  std::chrono::steady_clock::time_point enqueued{};
  std::chrono::steady_clock::time_point device_done{};

  // A request of a rank that arrived (every arrived rank issued the same kind of op).
  const OpRequest* AnyRequest() const {
    for (const auto& r : requests) {
      if (r) return &*r;
    }
    return nullptr;
  }
};

// What an operator sees of an op that has not completed (admin API, watchdog).
struct InFlightOp {
  uint64_t sequence_number;
  std::string op;
  std::vector<int> arrived_local_ranks;
  std::vector<int> missing_local_ranks;
  std::chrono::steady_clock::time_point first_arrival;
};

// The op the executor is running: what Fail completes at once, and what InFlight, the flight
// recorder and the stuck-op watchdog show meanwhile.
struct RunningOp {
  InFlightOp in_flight;
  std::vector<std::shared_ptr<Work>> works;  // by local index
  OpRecord record;                           // state kRunning
};

}  // namespace collectived
