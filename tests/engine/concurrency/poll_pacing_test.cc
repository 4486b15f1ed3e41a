// PollPacing: spins after activity, then sleeps in proportion to the newest wait, within bounds;
// and the timer slack it asks for is what the thread gets.
#include "engine/concurrency/poll_pacing.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <thread>

namespace collectived {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using TimePoint = PollPacing::TimePoint;

const TimePoint kStart = TimePoint() + std::chrono::hours(1);

TEST(PollPacingTest, SpinsForAWhileAfterActivity) {
  PollPacing pacing;
  pacing.Activity(kStart);
  EXPECT_EQ(pacing.NextSleep(kStart, kStart), microseconds(0));
  EXPECT_EQ(pacing.NextSleep(kStart + microseconds(299), kStart), microseconds(0));
  EXPECT_GT(pacing.NextSleep(kStart + microseconds(300), kStart), microseconds(0));
  // Later activity extends the spin; earlier activity reported late does not shorten it.
  pacing.Activity(kStart + microseconds(200));
  pacing.Activity(kStart + microseconds(100));
  EXPECT_EQ(pacing.NextSleep(kStart + microseconds(450), kStart), microseconds(0));
  EXPECT_GT(pacing.NextSleep(kStart + microseconds(500), kStart), microseconds(0));
  // Spinning says the same, for a poller with nothing to wait for.
  EXPECT_TRUE(pacing.Spinning(kStart + microseconds(499)));
  EXPECT_FALSE(pacing.Spinning(kStart + microseconds(500)));
}

TEST(PollPacingTest, SleepsInProportionToTheNewestWaitWithinBounds) {
  PollPacing pacing;  // no activity: no spin
  // A wait that just began: the shortest sleep.
  EXPECT_EQ(pacing.NextSleep(kStart + microseconds(10), kStart), microseconds(5));
  // 1/16 of how long it has waited: a 480 us op is seen at most ~30 us late.
  EXPECT_EQ(pacing.NextSleep(kStart + microseconds(480), kStart), microseconds(30));
  EXPECT_EQ(pacing.NextSleep(kStart + microseconds(1600), kStart), microseconds(100));
  // Long waits: the longest sleep, not more.
  EXPECT_EQ(pacing.NextSleep(kStart + milliseconds(500), kStart), microseconds(100));
  // The newest wait decides: a wait begun now makes the sleeps short again.
  EXPECT_EQ(pacing.NextSleep(kStart + milliseconds(500), kStart + milliseconds(500)),
            microseconds(5));
}

TEST(PollPacingTest, OptionsSetTheBounds) {
  PollPacing::Options options;
  options.spin = microseconds(0);
  options.shortest_sleep = microseconds(1);
  options.longest_sleep = microseconds(20);
  options.fraction = 4;
  PollPacing pacing(options);
  pacing.Activity(kStart);
  EXPECT_EQ(pacing.NextSleep(kStart, kStart), microseconds(1));
  EXPECT_EQ(pacing.NextSleep(kStart + microseconds(40), kStart), microseconds(10));
  EXPECT_EQ(pacing.NextSleep(kStart + milliseconds(1), kStart), microseconds(20));
}

TEST(PollPacingTest, TheThreadGetsAFineTimerSlack) {
  long slack = -1;
  std::thread([&] {
    PollPacing::FineTimerSlackForThisThread();
    slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  }).join();
  EXPECT_EQ(slack, 1000);  // nanoseconds
  EXPECT_NE(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), 1000) << "only the calling thread changes";
}

}  // namespace
}  // namespace collectived
