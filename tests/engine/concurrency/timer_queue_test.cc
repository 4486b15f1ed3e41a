// TimerQueue: callbacks run at their deadline, in order, on a manual clock as on the real one.
#include "engine/concurrency/timer_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <vector>

namespace collectived {
namespace {

using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

TEST(TimerQueueTest, RunsTimersInDeadlineOrderWhenTheClockReachesThem) {
  ManualClock clock;
  TimerQueue timers(clock);
  std::mutex mutex;
  std::vector<int> ran;
  auto record = [&](int what) {
    return [&, what] {
      std::lock_guard<std::mutex> lock(mutex);
      ran.push_back(what);
    };
  };
  timers.ScheduleAfter(minutes(30), record(30));
  timers.ScheduleAfter(minutes(1), record(1));
  timers.ScheduleAfter(minutes(10), record(10));
  timers.ScheduleAfter(minutes(10), record(11));  // same deadline: schedule order
  timers.Settle();
  EXPECT_TRUE(ran.empty());
  clock.Advance(minutes(10));
  timers.Settle();
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(ran, (std::vector<int>{1, 10, 11}));
  }
  EXPECT_EQ(timers.pending(), 1u);
  clock.Advance(minutes(20));
  timers.Settle();
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(ran, (std::vector<int>{1, 10, 11, 30}));
}

TEST(TimerQueueTest, ACancelledTimerNeverRuns) {
  ManualClock clock;
  TimerQueue timers(clock);
  std::atomic<int> ran{0};
  const TimerQueue::TimerId cancelled = timers.ScheduleAfter(seconds(1), [&] { ran += 1; });
  const TimerQueue::TimerId kept = timers.ScheduleAfter(seconds(1), [&] { ran += 10; });
  EXPECT_TRUE(timers.Cancel(cancelled));
  EXPECT_FALSE(timers.Cancel(cancelled));
  EXPECT_FALSE(timers.Cancel(TimerQueue::kNoTimer));
  clock.Advance(seconds(2));
  timers.Settle();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(timers.Cancel(kept)) << "it already ran";
}

TEST(TimerQueueTest, ATimerEarlierThanTheOneSleptForWakesTheQueue) {
  TimerQueue timers(Clock::Real());
  std::promise<void> fired;
  timers.ScheduleAfter(std::chrono::hours(1), [] {});
  const auto start = std::chrono::steady_clock::now();
  timers.ScheduleAfter(milliseconds(5), [&] { fired.set_value(); });
  ASSERT_EQ(fired.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
}

TEST(TimerQueueTest, CallbacksMayScheduleAndCancelTimers) {
  ManualClock clock;
  TimerQueue timers(clock);
  std::atomic<int> ran{0};
  TimerQueue::TimerId doomed = timers.ScheduleAfter(seconds(5), [&] { ran += 100; });
  timers.ScheduleAfter(seconds(1), [&] {
    ran += 1;
    timers.Cancel(doomed);
    timers.ScheduleAfter(seconds(0), [&] { ran += 10; });  // due at once: runs in this round
  });
  clock.Advance(seconds(1));
  timers.Settle();
  EXPECT_EQ(ran.load(), 11);
  clock.Advance(seconds(10));
  timers.Settle();
  EXPECT_EQ(ran.load(), 11);
}

TEST(TimerQueueTest, StopDropsWhatHasNotRun) {
  ManualClock clock;
  std::atomic<int> ran{0};
  {
    TimerQueue timers(clock);
    timers.ScheduleAfter(seconds(1), [&] { ++ran; });
    timers.Stop();
    clock.Advance(seconds(2));
    timers.ScheduleAfter(seconds(0), [&] { ++ran; });  // accepted, never run
    EXPECT_EQ(timers.pending(), 2u);
  }
  EXPECT_EQ(ran.load(), 0);
}

}  // namespace
}  // namespace collectived
