#include "engine/store/cancellable_wait.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "engine/store/movable_store.h"

namespace collectived {

namespace {

Status WaitOnce(Store& store, const std::vector<std::string>& keys,
                std::chrono::milliseconds timeout, CancelToken& cancel, bool& cancelled) {
  // Both callbacks may outlive this call (a completion already taken when it returns): they hold
  // the outcome, not the frame.
  struct Outcome {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<Status> status;
    bool cancelled = false;
  };
  auto outcome = std::make_shared<Outcome>();
  const WaitId id = store.WaitAsync(keys, timeout, [outcome](Status status) {
    std::lock_guard<std::mutex> lock(outcome->mutex);
    if (!outcome->status) outcome->status = std::move(status);
    outcome->done.notify_all();
  });
  const uint64_t watch = cancel.OnCancel([outcome](const Status& reason) {
    std::lock_guard<std::mutex> lock(outcome->mutex);
    if (!outcome->status) {
      outcome->status = reason;
      outcome->cancelled = true;
    }
    outcome->done.notify_all();
  });
  std::unique_lock<std::mutex> lock(outcome->mutex);
  outcome->done.wait(lock, [&] { return outcome->status.has_value(); });
  cancelled = outcome->cancelled;
  const Status status = *outcome->status;
  lock.unlock();
  cancel.Remove(watch);
  if (cancelled) store.CancelWait(id);
  return status;
}

}  // namespace

Status WaitUnlessCancelled(Store& store, const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout, CancelToken* cancel,
                           const Clock& clock, bool* cancelled) {
  if (cancelled) *cancelled = false;
  if (!cancel) return store.Wait(keys, timeout);
  // Bounded: a store whose waits keep failing while its calls answer does not spin here.
  const Clock::TimePoint deadline = clock.After(timeout);
  for (int rearmed = 0;; ++rearmed) {
    bool gone = false;
    const Status status = WaitOnce(store, keys, timeout, *cancel, gone);
    if (gone) {
      if (cancelled) *cancelled = true;
      return status;
    }
    if (status.kind() != ErrorKind::kUnavailable) return status;
    // The store was lost: if a call reaches one now (it moved), wait there for what is left.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.Now());
    if (rearmed == kMaxStoreMovesPerCall || left.count() <= 0 ||
        store.Check(keys).status().kind() == ErrorKind::kUnavailable) {
      return status;
    }
    timeout = left;
  }
}

}  // namespace collectived
