// DeadlineTimer: the one timer an object keeps on the runtime's TimerQueue for its earliest
// deadline, so that any number of deadlines cost one timer. It only ever moves sooner: a later
// deadline waits until the timer fires, and the owner, handling it, arms the timer again for the
// earliest deadline left. An armed timer counts as one activity of its owner (ActivityCount),
// so that the owner is not destroyed under it.
//
// Thread-safety: Arm, Fired and Cancel are called under the owner's mutex; the callback runs on
// the timer queue's thread without it, calls Fired under that mutex first, and ends with the
// owner's ActivityCount::Exit.
#pragma once

#include <functional>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/clock.h"
#include "engine/concurrency/timer_queue.h"

namespace collectived {

class DeadlineTimer {
 public:
  DeadlineTimer(TimerQueue& timers, ActivityCount& activities, std::function<void()> on_fire)
      : timers_(timers), activities_(activities), on_fire_(std::move(on_fire)) {}
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Makes the timer fire by `when` (time_point::max(): no deadline, nothing to do). Leaves a
  // timer armed for `when` or sooner, and one already running (it arms itself again), as it is.
  void Arm(Clock::TimePoint when);

  // The callback's first step: no timer is armed any more.
  void Fired();

  // Disarms the timer. Returns true when a timer was cancelled before it ran: its activity then
  // ends with the caller, who calls ActivityCount::Exit once it has released its lock.
  bool Cancel();

 private:
  TimerQueue& timers_;
  ActivityCount& activities_;
  const std::function<void()> on_fire_;
  TimerQueue::TimerId timer_ = TimerQueue::kNoTimer;
  Clock::TimePoint at_ = Clock::TimePoint::max();
};

}  // namespace collectived
