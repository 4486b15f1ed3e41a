// Clock and ManualClock: time moves only when told to, and waits on a manual clock wake when it
// does.
#include "engine/concurrency/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace collectived {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;

TEST(ManualClockTest, MovesOnlyWhenAdvanced) {
  ManualClock clock;
  const Clock::TimePoint start = clock.Now();
  const int64_t unix_start = clock.UnixMicros();
  std::this_thread::sleep_for(milliseconds(5));  // real time passes; the clock must not
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(minutes(30));
  EXPECT_EQ(clock.Now() - start, minutes(30));
  EXPECT_EQ(clock.UnixMicros() - unix_start, int64_t{30} * 60 * 1000 * 1000);
  clock.Advance(-minutes(1));  // ignored
  EXPECT_EQ(clock.Now() - start, minutes(30));
}

TEST(ManualClockTest, AWaitTimesOutWhenTheClockPassesItsDeadline) {
  ManualClock clock;
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<int> outcome{-1};
  const Clock::TimePoint deadline = clock.Now() + hours(2);
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mutex);
    outcome = clock.WaitUntil(cv, lock, deadline, [] { return false; }) ? 1 : 0;
  });
  clock.Advance(hours(1));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(outcome.load(), -1) << "woke before its deadline";
  clock.Advance(hours(1));
  waiter.join();
  EXPECT_EQ(outcome.load(), 0);
}

TEST(ManualClockTest, AWaitEndsWhenItsConditionHolds) {
  ManualClock clock;
  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mutex);
    result = clock.WaitUntil(cv, lock, Clock::TimePoint::max(), [&] { return ready; });
  });
  {
    std::lock_guard<std::mutex> lock(mutex);
    ready = true;
  }
  cv.notify_all();
  waiter.join();
  EXPECT_TRUE(result);
}

TEST(ManualClockTest, ManyWaitersAndAdvancesRace) {
  ManualClock clock;
  const Clock::TimePoint deadline = clock.Now() + milliseconds(500);
  std::vector<std::thread> waiters;
  std::atomic<int> timed_out{0};
  for (int i = 0; i < 8; ++i) {
    waiters.emplace_back([&] {
      std::mutex mutex;
      std::condition_variable cv;
      std::unique_lock<std::mutex> lock(mutex);
      if (!clock.WaitUntil(cv, lock, deadline, [] { return false; })) ++timed_out;
    });
  }
  for (int i = 0; i < 500; ++i) clock.Advance(milliseconds(1));
  for (auto& waiter : waiters) waiter.join();
  EXPECT_EQ(timed_out.load(), 8);
}

TEST(RealClockTest, WaitsUntilTheDeadline) {
  Clock& clock = Clock::Real();
  std::mutex mutex;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mutex);
  const Clock::TimePoint start = clock.Now();
  EXPECT_FALSE(clock.WaitUntil(cv, lock, start + milliseconds(20), [] { return false; }));
  EXPECT_GE(clock.Now() - start, milliseconds(20));
}

TEST(ClockTest, AfterSaturatesInsteadOfOverflowing) {
  ManualClock clock;
  EXPECT_EQ(clock.After(milliseconds::max()), Clock::TimePoint::max());
  EXPECT_EQ(clock.After(milliseconds(-5)), clock.Now());
  EXPECT_EQ(clock.After(milliseconds(7)), clock.Now() + milliseconds(7));
}

TEST(ManualClockTest, AwaitWaitersReturnsOnceAWaiterTookItsDeadline) {
  ManualClock clock;
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<bool> timed_out{false};
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lock(mutex);
    timed_out = !clock.WaitUntil(cv, lock, clock.After(minutes(5)), [] { return false; });
  });
  clock.AwaitWaiters(1);
  clock.Advance(minutes(5));  // reaches the waiter: it cannot be missed once registered
  waiter.join();
  EXPECT_TRUE(timed_out.load());
}

}  // namespace
}  // namespace collectived
