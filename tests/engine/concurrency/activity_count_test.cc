// ActivityCount: its owner learns when the last activity ended, and the idle hook that ending runs
// has returned before a waiter goes on to destroy what the hook uses.
#include "engine/concurrency/activity_count.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace collectived {
namespace {

using std::chrono::milliseconds;

TEST(ActivityCountTest, CountsEnteredActivitiesUntilTheyExit) {
  ActivityCount activities;
  EXPECT_TRUE(activities.Idle());
  activities.Enter();
  activities.Enter();
  EXPECT_EQ(activities.count(), 2u);
  activities.Exit();
  EXPECT_FALSE(activities.Idle());
  activities.Exit();
  EXPECT_TRUE(activities.Idle());
  activities.Wait();  // returns at once
}

TEST(ActivityCountTest, CloseRunsTheHookAtOnceWhenNothingIsLeft) {
  ActivityCount activities;
  int runs = 0;
  activities.Close([&] { ++runs; });
  EXPECT_EQ(runs, 1);
  activities.Close([&] { ++runs; });  // once only
  EXPECT_EQ(runs, 1);
}

TEST(ActivityCountTest, TheLastExitAfterCloseRunsTheHookOnce) {
  ActivityCount activities;
  int runs = 0;
  activities.Enter();
  activities.Enter();
  activities.Close([&] { ++runs; });
  EXPECT_EQ(runs, 0);
  activities.Exit();
  EXPECT_EQ(runs, 0);
  activities.Exit();
  EXPECT_EQ(runs, 1);
  activities.Enter();
  activities.Exit();
  EXPECT_EQ(runs, 1);
}

TEST(ActivityCountTest, WaitReturnsOnlyOnceTheHookOfTheLastExitReturned) {
  auto activities = std::make_unique<ActivityCount>();
  std::atomic<bool> hook_started{false}, hook_may_return{false}, hook_returned{false};
  activities->Enter();
  activities->Close([&] {
    hook_started = true;
    while (!hook_may_return) std::this_thread::sleep_for(milliseconds(1));
    hook_returned = true;
  });
  std::thread last([&] { activities->Exit(); });
  while (!hook_started) std::this_thread::sleep_for(milliseconds(1));
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    activities->Wait();
    waited = true;
    // What owns the count goes now: the exiting thread must be done with it.
    EXPECT_TRUE(hook_returned.load());
    activities.reset();
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(waited.load()) << "Wait returned while the idle hook was still running";
  hook_may_return = true;
  waiter.join();
  last.join();
  EXPECT_TRUE(waited.load());
}

}  // namespace
}  // namespace collectived
