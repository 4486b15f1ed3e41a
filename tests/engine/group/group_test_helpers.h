// Helpers of several files of group_test (Group over the in-process fabric): an uneven
// alltoall_single and what it must give, and the options of a Cluster on a ManualClock.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "engine/concurrency/clock.h"
#include "tests/engine/group/group_cluster.h"

namespace collectived {
namespace group_testing {

// alltoall_single with uneven splits, on rank r of n: it sends j + 1 elements to rank j, valued
// r * 100 + j * 10 + k, and receives r + 1 from each. Returns what its output must hold.
inline std::vector<int64_t> UnevenAllToAllSingle(int r, int n, OpRequest* request) {
  request->kind = OpKind::kAllToAllSingle;
  std::vector<int64_t> send;
  for (int j = 0; j < n; ++j) {
    request->input_splits.push_back(j + 1);
    request->output_splits.push_back(r + 1);
    for (int k = 0; k <= j; ++k) send.push_back(r * 100 + j * 10 + k);
  }
  request->inputs = {Tensor(send)};
  request->outputs = {Zeros(n * (r + 1))};
  std::vector<int64_t> expected;
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k <= r; ++k) expected.push_back(j * 100 + r * 10 + k);
  }
  return expected;
}

// Timeouts run on a ManualClock: a 30-minute timeout passes in microseconds, and nothing fires
// a moment early or late because the machine is loaded.
inline Cluster::Options OnManualClock(ManualClock& clock) {
  Cluster::Options options;
  options.clock = &clock;
  return options;
}

inline constexpr std::chrono::minutes kHalfHour{30};

}  // namespace group_testing
}  // namespace collectived
