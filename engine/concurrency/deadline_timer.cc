#include "engine/concurrency/deadline_timer.h"

namespace collectived {

void DeadlineTimer::Arm(Clock::TimePoint when) {
  if (when == Clock::TimePoint::max()) return;
  if (timer_ != TimerQueue::kNoTimer) {
    if (at_ <= when) return;
    // Running now: it arms itself again for the earliest deadline.
    if (!timers_.Cancel(timer_)) return;
    // Cancelled: its activity carries over to the new timer.
  } else {
    activities_.Enter();
  }
  at_ = when;
  timer_ = timers_.Schedule(when, on_fire_);
}

void DeadlineTimer::Fired() {
  timer_ = TimerQueue::kNoTimer;
  at_ = Clock::TimePoint::max();
}

bool DeadlineTimer::Cancel() {
  const bool cancelled = timer_ != TimerQueue::kNoTimer && timers_.Cancel(timer_);
  timer_ = TimerQueue::kNoTimer;
  at_ = Clock::TimePoint::max();
  return cancelled;
}

}  // namespace collectived
