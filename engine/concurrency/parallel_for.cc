#include "engine/concurrency/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace collectived {
namespace {

// Shared by the caller and its helper tasks; a helper that starts after every item was taken
// touches only this (never `body`, which lives on the caller's stack).
struct Pass {
  std::atomic<size_t> next{0};
  size_t items = 0;
  const std::function<Status(size_t)>* body = nullptr;
  std::mutex mutex;
  std::condition_variable finished;
  size_t done = 0;  // guarded by mutex: items whose body returned (or was skipped)
  Status error;     // guarded by mutex: the first failure
  std::atomic<bool> failed{false};

  // Takes items until none is left.
  void Run() {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= items) return;
      Status status = failed.load() ? Status::Ok() : (*body)(i);
      std::lock_guard<std::mutex> lock(mutex);
      if (!status.ok() && error.ok()) {
        error = std::move(status);
        failed.store(true);
      }
      if (++done == items) finished.notify_all();
    }
  }
};

}  // namespace

Status ParallelFor(Executor* executor, size_t items, size_t helpers,
                   const std::function<Status(size_t)>& body) {
  if (items == 0) return Status::Ok();
  auto pass = std::make_shared<Pass>();
  pass->items = items;
  pass->body = &body;
  if (executor != nullptr) {
    helpers = std::min(helpers, items - 1);
    for (size_t h = 0; h < helpers; ++h) executor->Post([pass] { pass->Run(); });
  }
  pass->Run();
  std::unique_lock<std::mutex> lock(pass->mutex);
  // Every item was taken; the ones still running belong to helpers that started them.
  pass->finished.wait(lock, [&] { return pass->done == items; });
  return pass->error;
}

}  // namespace collectived
