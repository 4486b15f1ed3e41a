// TimerQueue: runs callbacks at points in time of a Clock, on one thread shared by everything
// that has a deadline (op and transfer timeouts, the stuck-op watchdog, drains) instead of a
// thread or a sleep-and-recheck loop per deadline. Timers are ordered by deadline; the thread
// sleeps on the clock until the earliest one is due or an earlier one is scheduled, so a
// ManualClock's Advance fires them.
//
// Callbacks run one at a time on the queue's thread, without any lock of the queue held. They
// must be short and must not throw: work that blocks (a store call, a transport call) is posted
// to an Executor from the callback.
//
// Thread-safety: every method may be called from any thread, callbacks included.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "engine/concurrency/clock.h"

namespace collectived {

class TimerQueue {
 public:
  using TimerId = uint64_t;
  static constexpr TimerId kNoTimer = 0;

  // Starts the queue's thread on `clock`, which must outlive the queue.
  explicit TimerQueue(Clock& clock);
  // Stops the thread (Stop); timers not yet run are dropped without running.
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  Clock& clock() const { return clock_; }

  // Runs `fn` once the clock reaches `when` (at once, on the queue's thread, if it already has).
  // Timers due at the same time run in the order they were scheduled. Returns the timer's id,
  // never kNoTimer.
  TimerId Schedule(Clock::TimePoint when, std::function<void()> fn);
  TimerId ScheduleAfter(Clock::Duration after, std::function<void()> fn) {
    return Schedule(clock_.Now() + after, std::move(fn));
  }

  // Returns true if the timer had not started to run (and never will); false if it ran, is
  // running now, or is unknown (kNoTimer included). Never waits for a running callback: a
  // callback must tolerate running after a Cancel that raced with it (hold what it needs).
  bool Cancel(TimerId id);

  // Blocks until every timer due at the clock's current time has run and none is running. For
  // tests on a ManualClock: Advance, then Settle, then check.
  void Settle();

  // Timers scheduled and not yet run.
  size_t pending() const;

  // Stops running timers: returns once the thread has exited (a callback that was running has
  // returned). Schedule and Cancel still work, but nothing runs any more. Idempotent; not from a
  // callback.
  void Stop();

 private:
  using Key = std::pair<Clock::TimePoint, TimerId>;
  void Loop();
  bool DueLocked() const;

  Clock& clock_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;                     // an earlier timer, or stopping
  std::condition_variable settled_;                     // a callback finished
  std::map<Key, std::function<void()>> timers_;         // guarded by mutex_
  std::unordered_map<TimerId, Clock::TimePoint> when_;  // guarded by mutex_; by id
  TimerId next_id_ = 1;                                 // guarded by mutex_
  TimerId running_ = kNoTimer;                          // guarded by mutex_
  bool earlier_ = false;   // guarded by mutex_: a timer earlier than the one slept for came
  bool stopping_ = false;  // guarded by mutex_
  std::mutex join_mutex_;  // one Stop joins
  std::thread thread_;
};

}  // namespace collectived
