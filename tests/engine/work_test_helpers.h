// Helpers of both files of work_test: the timeout of the timing tests and the time since a point
// of the steady clock.
#pragma once

#include <chrono>

namespace collectived {
namespace work_testing {

// Timeouts used by the timing tests: long enough to be measurable on a busy 2-core machine,
// with a generous upper bound (3x) so that sanitizer builds stay reliable.
inline constexpr std::chrono::milliseconds kShortTimeout{200};

// The time since `start`, in whole milliseconds.
inline std::chrono::milliseconds ElapsedSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

}  // namespace work_testing
}  // namespace collectived
