// DeadlineTimer: one timer for many deadlines, moved only sooner, counted as its owner's
// activity while armed.
#include "engine/concurrency/deadline_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <vector>

namespace collectived {
namespace {

using std::chrono::minutes;

// An owner as Group and PointToPoint are: deadlines under a mutex, the timer re-armed for the
// earliest one left whenever it fires.
struct Owner {
  explicit Owner(ManualClock& clock) : clock(clock), timers(clock) {}
  ~Owner() { activities.Wait(); }

  void AddDeadline(Clock::TimePoint when) {
    std::lock_guard<std::mutex> lock(mutex);
    deadlines.push_back(when);
    timer.Arm(Earliest());
  }
  Clock::TimePoint Earliest() const {
    Clock::TimePoint earliest = Clock::TimePoint::max();
    for (auto when : deadlines) earliest = std::min(earliest, when);
    return earliest;
  }
  void OnFire() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      timer.Fired();
      ++fired;
      std::erase_if(deadlines, [&](Clock::TimePoint when) { return when <= clock.Now(); });
      timer.Arm(Earliest());
    }
    activities.Exit();
  }

  ManualClock& clock;
  TimerQueue timers;
  ActivityCount activities;
  std::mutex mutex;
  std::vector<Clock::TimePoint> deadlines;
  int fired = 0;
  DeadlineTimer timer{timers, activities, [this] { OnFire(); }};
};

TEST(DeadlineTimerTest, FiresForTheEarliestDeadlineAndRearmsForTheNext) {
  ManualClock clock;
  Owner owner(clock);
  owner.AddDeadline(clock.Now() + minutes(30));
  owner.AddDeadline(clock.Now() + minutes(10));  // sooner: the timer moves
  owner.AddDeadline(clock.Now() + minutes(20));  // later: waits for the timer to fire
  EXPECT_EQ(owner.activities.count(), 1u) << "one armed timer, one activity";
  clock.Advance(minutes(10));
  owner.timers.Settle();
  EXPECT_EQ(owner.fired, 1);
  clock.Advance(minutes(10));
  owner.timers.Settle();
  EXPECT_EQ(owner.fired, 2);
  clock.Advance(minutes(10));
  owner.timers.Settle();
  EXPECT_EQ(owner.fired, 3);
  EXPECT_TRUE(owner.deadlines.empty());
  EXPECT_TRUE(owner.activities.Idle()) << "no deadline left, no timer armed";
}

TEST(DeadlineTimerTest, ACancelledTimerHandsItsActivityToTheCaller) {
  ManualClock clock;
  Owner owner(clock);
  owner.AddDeadline(clock.Now() + minutes(5));
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(owner.mutex);
    cancelled = owner.timer.Cancel();
    EXPECT_FALSE(owner.timer.Cancel()) << "nothing armed any more";
  }
  ASSERT_TRUE(cancelled);
  owner.activities.Exit();
  clock.Advance(minutes(5));
  owner.timers.Settle();
  EXPECT_EQ(owner.fired, 0);
  EXPECT_TRUE(owner.activities.Idle());
}

}  // namespace
}  // namespace collectived
