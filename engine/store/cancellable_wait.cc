#include "engine/store/cancellable_wait.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace collectived {

Status WaitUnlessCancelled(Store& store, const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout, CancelToken* cancel,
                           bool* cancelled) {
  if (cancelled) *cancelled = false;
  if (!cancel) return store.Wait(keys, timeout);
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
  const uint64_t watch = cancel->OnCancel([outcome](const Status& reason) {
    std::lock_guard<std::mutex> lock(outcome->mutex);
    if (!outcome->status) {
      outcome->status = reason;
      outcome->cancelled = true;
    }
    outcome->done.notify_all();
  });
  std::unique_lock<std::mutex> lock(outcome->mutex);
  outcome->done.wait(lock, [&] { return outcome->status.has_value(); });
  const bool gone = outcome->cancelled;
  const Status status = *outcome->status;
  lock.unlock();
  cancel->Remove(watch);
  if (gone) {
    store.CancelWait(id);
    if (cancelled) *cancelled = true;
  }
  return status;
}

}  // namespace collectived
