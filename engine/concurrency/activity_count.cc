#include "engine/concurrency/activity_count.h"

#include <utility>

namespace collectived {

void ActivityCount::Enter() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++count_;
}

void ActivityCount::Exit() {
  std::function<void()> on_idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--count_ > 0) return;
    if (closed_) on_idle = std::exchange(on_idle_, nullptr);
    if (!on_idle) {
      // Under the lock: a waiter may destroy this object as soon as it sees the count at zero.
      idle_.notify_all();
      return;
    }
    hook_running_ = true;
  }
  on_idle();
  // Waiters wait for the hook too, so that what it uses lives until it returned.
  std::lock_guard<std::mutex> lock(mutex_);
  hook_running_ = false;
  idle_.notify_all();
}

bool ActivityCount::Idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_ == 0;
}

size_t ActivityCount::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

void ActivityCount::Close(std::function<void()> on_idle) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    if (count_ > 0) {
      on_idle_ = std::move(on_idle);
      return;
    }
  }
  if (on_idle) on_idle();
}

void ActivityCount::Wait() const {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return count_ == 0 && !hook_running_; });
}

bool ActivityCount::WaitUntil(const Clock& clock, Clock::TimePoint deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return clock.WaitUntil(idle_, lock, deadline, [this] { return count_ == 0 && !hook_running_; });
}

}  // namespace collectived
