// Clock: the one way time enters the engine. Deadlines, timers (TimerQueue), the stuck-op
// watchdog and every timed wait read and wait through a Clock, so that a test can replace the
// real one (Clock::Real(), the steady clock) with a ManualClock and run a 30-minute timeout in
// microseconds, deterministically.
//
// Thread-safety: every method of both clocks may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace collectived {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;

  // The current time, monotonic.
  virtual TimePoint Now() const = 0;
  // Wall-clock time in microseconds since the Unix epoch (records and arrival stamps a person
  // reads); moves with Now() on a manual clock.
  virtual int64_t UnixMicros() const = 0;

  // Waits on `cv` (whose mutex `lock` holds) until `ready()` is true or Now() reaches
  // `deadline` (TimePoint::max(): no deadline). Returns ready() as last evaluated, with `lock`
  // held. Spurious wake-ups are absorbed; whoever makes `ready()` true must notify `cv` under
  // its mutex. On a manual clock, Advance wakes such waits.
  virtual bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         TimePoint deadline, const std::function<bool()>& ready) const = 0;

  // How long a poll() on a real descriptor may block before its caller reads this clock again
  // on its way to `deadline`: the milliseconds left, rounded up (0 once it passed; poll() must
  // not return early only to find 0 ms left forever). A manual clock answers at most 1: its time
  // moves only when a test moves it, so a poller looks again soon.
  virtual int PollMillis(TimePoint deadline) const;
  // Blocks for `duration` of this clock's time: a back-off, never a wait for a state change.
  void SleepFor(Duration duration) const;

  // now + `after`, saturating at TimePoint::max() (never) instead of overflowing; a negative
  // `after` counts as zero.
  TimePoint After(std::chrono::milliseconds after) const { return Saturating(Now(), after); }
  // `from` + `after`, likewise.
  static TimePoint Saturating(TimePoint from, std::chrono::milliseconds after);

  // The process's steady clock: what production code uses. Never destroyed.
  static Clock& Real();
};

// A clock that moves only when told to. Starts at the real steady time of its construction (so
// that time points read from it and from the real clock are comparable in logs), and at
// Unix time 1,800,000,000 s.
class ManualClock final : public Clock {
 public:
  ManualClock();
  ~ManualClock() override;

  TimePoint Now() const override;
  int64_t UnixMicros() const override;
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline, const std::function<bool()>& ready) const override;
  // 0 once `deadline` passed, 1 before; counts the call (AwaitPolls).
  int PollMillis(TimePoint deadline) const override;

  // Moves time forward by `by` (negative: ignored) and wakes every WaitUntil in progress, so
  // that each re-checks its deadline. Returns once they have been woken (not once they ran).
  void Advance(Duration by);

  // Blocks until at least `count` WaitUntil calls are in progress: from then on, an Advance
  // reaches them (a test's way to know a waiter took its deadline before time moves).
  void AwaitWaiters(size_t count) const;
  // Blocks until PollMillis was called at least `count` times in all: a poller on real
  // descriptors has read its deadline, and an Advance past it reaches the poller's next look.
  void AwaitPolls(uint64_t count) const;

 private:
  struct Waiter;

  mutable std::mutex mutex_;
  mutable std::condition_variable waiters_changed_;
  TimePoint now_;                                         // guarded by mutex_
  int64_t unix_micros_;                                   // guarded by mutex_
  mutable uint64_t polls_ = 0;                            // guarded by mutex_
  mutable std::vector<std::shared_ptr<Waiter>> waiters_;  // guarded by mutex_
};

}  // namespace collectived
