// Helpers of the files of memory_store_test: the timeouts that are expected to expire and those
// that must not, and a WaitAsync callback that records its status.
#pragma once

#include <atomic>
#include <chrono>
#include <future>

#include "engine/store/memory_store.h"

namespace collectived {
namespace store_testing {

using std::chrono::milliseconds;

inline constexpr milliseconds kShort{100};  // timeouts that are expected to expire
inline constexpr milliseconds kLong{std::chrono::seconds(20)};  // timeouts that must not expire

// A WaitAsync callback that records its single status.
struct AsyncResult {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  std::atomic<int> calls{0};

  WaitCallback Callback() {
    return [this](Status s) {
      if (calls.fetch_add(1) == 0) promise.set_value(std::move(s));
    };
  }
  bool Ready(milliseconds within = milliseconds(0)) {
    return future.wait_for(within) == std::future_status::ready;
  }
};

}  // namespace store_testing
}  // namespace collectived
