#include "engine/concurrency/clock.h"

#include <algorithm>
#include <limits>

namespace collectived {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }

  int64_t UnixMicros() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline, const std::function<bool()>& ready) const override {
    if (deadline == TimePoint::max()) {
      cv.wait(lock, ready);
      return true;
    }
    return cv.wait_until(lock, deadline, ready);
  }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* const clock = new RealClock();
  return *clock;
}

int Clock::PollMillis(TimePoint deadline) const {
  if (deadline == TimePoint::max()) return -1;
  const Duration left = deadline - Now();
  if (left <= Duration::zero()) return 0;
  const int64_t millis = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(millis, std::numeric_limits<int>::max()));
}

void Clock::SleepFor(Duration duration) const {
  std::mutex mutex;
  std::condition_variable never;
  std::unique_lock<std::mutex> lock(mutex);
  const TimePoint now = Now();
  const TimePoint until = TimePoint::max() - now < duration ? TimePoint::max() : now + duration;
  WaitUntil(never, lock, until, [] { return false; });
}

Clock::TimePoint Clock::Saturating(TimePoint from, std::chrono::milliseconds after) {
  if (after <= std::chrono::milliseconds::zero()) return from;
  // Compared in milliseconds: converting a huge timeout to the clock's nanoseconds overflows.
  const auto headroom =
      std::chrono::duration_cast<std::chrono::milliseconds>(TimePoint::max() - from);
  if (after >= headroom) return TimePoint::max();
  return from + after;
}

// One WaitUntil in progress on a manual clock. `guard` orders Advance's wake-up against the
// waiter's leaving: once `active` is false, Advance no longer touches `cv` or `mutex` (which the
// waiter's owner may destroy as soon as the wait returns).
struct ManualClock::Waiter {
  std::mutex guard;
  bool active = true;  // guarded by guard
  std::condition_variable* cv;
  std::mutex* mutex;
};

ManualClock::ManualClock()
    : now_(std::chrono::steady_clock::now()), unix_micros_(int64_t{1'800'000'000} * 1'000'000) {}

ManualClock::~ManualClock() = default;

Clock::TimePoint ManualClock::Now() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return now_;
}

int64_t ManualClock::UnixMicros() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unix_micros_;
}

bool ManualClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                            TimePoint deadline, const std::function<bool()>& ready) const {
  auto waiter = std::make_shared<Waiter>();
  waiter->cv = &cv;
  waiter->mutex = lock.mutex();
  {
    std::lock_guard<std::mutex> registry(mutex_);
    waiters_.push_back(waiter);
    waiters_changed_.notify_all();
  }
  // The caller's mutex is held from each check to the wait, and Advance takes that mutex before
  // it notifies: a move of time is never missed between the two.
  while (!ready() && Now() < deadline) cv.wait(lock);
  // Leaving needs `guard`, which Advance holds while it takes the caller's mutex: leave without
  // the caller's mutex, so that the two never wait on each other.
  lock.unlock();
  {
    std::lock_guard<std::mutex> guard(waiter->guard);
    waiter->active = false;
  }
  {
    std::lock_guard<std::mutex> registry(mutex_);
    waiters_.erase(std::remove(waiters_.begin(), waiters_.end(), waiter), waiters_.end());
  }
  lock.lock();
  return ready();
}

void ManualClock::Advance(Duration by) {
  if (by <= Duration::zero()) return;
  std::vector<std::shared_ptr<Waiter>> waiters;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    now_ += by;
    unix_micros_ += std::chrono::duration_cast<std::chrono::microseconds>(by).count();
    waiters = waiters_;
  }
  for (const std::shared_ptr<Waiter>& waiter : waiters) {
    std::lock_guard<std::mutex> guard(waiter->guard);
    if (!waiter->active) continue;
    { std::lock_guard<std::mutex> waiting(*waiter->mutex); }
    waiter->cv->notify_all();
  }
}

int ManualClock::PollMillis(TimePoint deadline) const {
  std::lock_guard<std::mutex> lock(mutex_);
  ++polls_;
  waiters_changed_.notify_all();
  return now_ >= deadline ? 0 : 1;
}

void ManualClock::AwaitPolls(uint64_t count) const {
  std::unique_lock<std::mutex> lock(mutex_);
  waiters_changed_.wait(lock, [&] { return polls_ >= count; });
}

void ManualClock::AwaitWaiters(size_t count) const {
  std::unique_lock<std::mutex> lock(mutex_);
  waiters_changed_.wait(lock, [&] { return waiters_.size() >= count; });
}

}  // namespace collectived
