// Work, an op's handle: its description, times, waits past the op's timeout (on a manual and
// the real clock), errors, callbacks, and use from many threads.
#include "engine/vocabulary/work.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "tests/engine/work_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

using namespace work_testing;  // NOLINT: the helpers of these tests

// ---------------------------------------------------------------------------------------------
// Work

OpInfo AllreduceInfo() {
  return OpInfo{"g", "allreduce", 12};
}

TEST(WorkTest, DescribeNamesGroupOpAndSequence) {
  EXPECT_EQ(AllreduceInfo().Describe(), "allreduce (seq 12) on group 'g'");
}

TEST(WorkTest, CompletesSuccessfully) {
  Work work(AllreduceInfo(), milliseconds(10000));
  EXPECT_EQ(work.info().group, "g");
  EXPECT_EQ(work.info().op, "allreduce");
  EXPECT_EQ(work.info().sequence_number, 12u);
  EXPECT_EQ(work.timeout(), milliseconds(10000));
  EXPECT_FALSE(work.IsCompleted());
  EXPECT_TRUE(work.status().ok());
  EXPECT_FALSE(work.future().IsReady());

  work.MarkStarted();
  EXPECT_TRUE(work.Complete(Status::Ok()));
  EXPECT_TRUE(work.IsCompleted());
  EXPECT_TRUE(work.Wait().ok());
  EXPECT_TRUE(work.Wait(milliseconds(0)).ok());
  EXPECT_TRUE(work.status().ok());
  EXPECT_TRUE(work.exception().ok());
  EXPECT_TRUE(work.future().IsReady());
}

TEST(WorkTest, TimesAreRecordedInOrder) {
  Work work(AllreduceInfo(), milliseconds(10000));
  WorkTimes before = work.times();
  EXPECT_FALSE(before.started.has_value());
  EXPECT_FALSE(before.finished.has_value());
  EXPECT_EQ(work.deadline(), before.created + milliseconds(10000));

  work.MarkStarted();
  const WorkTimes started = work.times();
  ASSERT_TRUE(started.started.has_value());
  std::this_thread::sleep_for(milliseconds(2));
  work.MarkStarted();  // only the first call counts
  EXPECT_EQ(work.times().started, started.started);

  ASSERT_TRUE(work.Complete(Status::Ok()));
  const WorkTimes after = work.times();
  ASSERT_TRUE(after.finished.has_value());
  EXPECT_LE(after.created, *after.started);
  EXPECT_LE(*after.started, *after.finished);

  EXPECT_FALSE(work.Complete(Status::Internal("late")));
  EXPECT_EQ(work.times().finished, after.finished);
}

TEST(WorkTest, MarkStartedAfterCompletionIsIgnored) {
  Work work(AllreduceInfo(), milliseconds(10000));
  ASSERT_TRUE(work.Complete(Status::Ok()));
  work.MarkStarted();
  EXPECT_FALSE(work.times().started.has_value());
}

// Starts `wait` on a thread, checks it is still blocked, moves `clock` by `step`, and returns
// what the wait returned: a timeout that passes on the manual clock, not in real time.
Status WaitAcross(ManualClock& clock, std::chrono::nanoseconds step,
                  const std::function<Status()>& wait) {
  std::promise<Status> result;
  std::future<Status> returned = result.get_future();
  std::thread waiter([&] { result.set_value(wait()); });
  clock.AwaitWaiters(1);
  EXPECT_EQ(returned.wait_for(milliseconds(20)), std::future_status::timeout)
      << "returned before its deadline passed on the clock";
  clock.Advance(step);
  waiter.join();
  return returned.get();
}

TEST(WorkTest, WaitPastOpTimeoutNamesGroupOpAndSequence) {
  ManualClock clock;
  const std::chrono::minutes half_an_hour(30);
  Work work(AllreduceInfo(), half_an_hour, clock);
  EXPECT_EQ(work.deadline(), clock.Now() + half_an_hour);
  clock.Advance(std::chrono::minutes(29));
  Status s = WaitAcross(clock, std::chrono::minutes(1), [&] { return work.Wait(); });

  EXPECT_EQ(s.kind(), ErrorKind::kTimeout);
  EXPECT_EQ(s.message(),
            "Timeout: allreduce (seq 12) on group 'g' Timed out after 1800000 ms: it did not "
            "complete");
  EXPECT_GE(clock.Now(), work.deadline());

  // The wait did not complete the op.
  EXPECT_FALSE(work.IsCompleted());
  EXPECT_TRUE(work.status().ok());
  EXPECT_TRUE(work.Complete(Status::Ok()));
  EXPECT_TRUE(work.Wait().ok());
}

TEST(WorkTest, WaitPastOpTimeoutOnTheRealClock) {
  Work work(AllreduceInfo(), kShortTimeout);
  const Clock::time_point start = Clock::now();
  Status s = work.Wait();
  const milliseconds elapsed = ElapsedSince(start);
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_GE(elapsed, kShortTimeout - milliseconds(1));  // measured from creation, just before
  EXPECT_GE(Clock::now(), work.deadline());
}

TEST(WorkTest, ExplicitWaitTimeoutOverridesOpTimeout) {
  ManualClock clock;
  Work work(OpInfo{"trainers", "broadcast", 3}, Work::kNoTimeout, clock);
  EXPECT_EQ(work.deadline(), Clock::time_point::max());
  Status s =
      WaitAcross(clock, std::chrono::hours(2), [&] { return work.Wait(std::chrono::hours(2)); });
  EXPECT_TRUE(s.IsTimeout());
  EXPECT_EQ(s.message(),
            "Timeout: broadcast (seq 3) on group 'trainers' Timed out after 7200000 ms: it did "
            "not complete");

  // A longer explicit timeout than the op's own is honoured too.
  Work short_op(AllreduceInfo(), milliseconds(10), clock);
  std::promise<Status> result;
  std::future<Status> returned = result.get_future();
  std::thread waiter([&] { result.set_value(short_op.Wait(std::chrono::hours(1))); });
  clock.AwaitWaiters(1);
  clock.Advance(std::chrono::minutes(59));  // long past the op's own 10 ms
  EXPECT_EQ(returned.wait_for(milliseconds(20)), std::future_status::timeout);
  short_op.Complete(Status::Ok());
  waiter.join();
  EXPECT_TRUE(returned.get().ok());
}

TEST(WorkTest, WaitAfterDeadlineReturnsAtOnce) {
  ManualClock clock;
  Work work(AllreduceInfo(), milliseconds(10), clock);
  clock.Advance(milliseconds(30));
  Status s = work.Wait();  // would hang if it waited for the clock to move again
  EXPECT_TRUE(s.IsTimeout());
  EXPECT_NE(s.message().find("Timed out after 10 ms"), std::string::npos) << s.message();
}

TEST(WorkTest, NegativeTimeoutsActAsZero) {
  Work work(AllreduceInfo(), milliseconds(-5));
  EXPECT_TRUE(work.Wait().IsTimeout());
  Status s = work.Wait(milliseconds(-1));
  EXPECT_TRUE(s.IsTimeout());
  EXPECT_NE(s.message().find("Timed out after 0 ms"), std::string::npos) << s.message();
}

TEST(WorkTest, CompletionFromAnotherThreadWakesWaiter) {
  auto work = std::make_shared<Work>(AllreduceInfo(), Work::kNoTimeout);
  std::thread engine([work] {
    std::this_thread::sleep_for(milliseconds(30));
    work->MarkStarted();
    work->Complete(Status::Ok());
  });
  EXPECT_TRUE(work->Wait().ok());
  EXPECT_TRUE(work->IsCompleted());
  engine.join();
}

TEST(WorkTest, ErrorPropagates) {
  Work work(AllreduceInfo(), milliseconds(10000));
  ASSERT_TRUE(work.Complete(Status::PeerLost("rank 3 of group 'g' lost during allreduce")));
  EXPECT_TRUE(work.IsCompleted());
  for (const Status& s : {work.Wait(), work.Wait(milliseconds(5)), work.status(), work.exception(),
                          work.future().status()}) {
    EXPECT_EQ(s.kind(), ErrorKind::kPeerLost);
    EXPECT_EQ(s.message(), "rank 3 of group 'g' lost during allreduce");
  }
  EXPECT_FALSE(work.Complete(Status::Ok()));
  EXPECT_EQ(work.status().kind(), ErrorKind::kPeerLost);
}

TEST(WorkTest, EngineTimeoutErrorIsWhatWaitersSee) {
  Work work(AllreduceInfo(), milliseconds(1000));
  ASSERT_TRUE(work.Complete(work.TimeoutError(work.timeout())));
  Status s = work.Wait();
  EXPECT_TRUE(s.IsTimeout());
  EXPECT_EQ(s.message(),
            "Timeout: allreduce (seq 12) on group 'g' Timed out after 1000 ms: it did not "
            "complete");
  EXPECT_EQ(work.exception().message(), s.message());
}

TEST(WorkTest, CallbacksRunOnceAndSeeFinishTime) {
  auto work = std::make_shared<Work>(AllreduceInfo(), milliseconds(10000));
  std::vector<int> order;
  bool finished_visible = false;
  work->AddCallback([&, work](const Status& s) {
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE(work->IsCompleted());  // no deadlock: not under a lock
    finished_visible = work->times().finished.has_value();
    order.push_back(1);
  });
  work->future().AddCallback([&](const Status&) { order.push_back(2); });
  work->AddCallback([&](const Status&) { order.push_back(3); });
  ASSERT_TRUE(work->Complete(Status::Ok()));
  EXPECT_FALSE(work->Complete(Status::Ok()));
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(finished_visible);

  work->AddCallback([&](const Status&) { order.push_back(4); });  // inline
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4}));
}

TEST(WorkTest, DestroyedWithoutCompletionFailsItsFuture) {
  std::optional<Future<void>> future;
  Status seen;
  {
    Work work(AllreduceInfo(), milliseconds(10000));
    future.emplace(work.future());
    work.AddCallback([&](const Status& s) { seen = s; });
  }
  ASSERT_TRUE(future->IsReady());
  EXPECT_EQ(future->status().kind(), ErrorKind::kInternal);
  EXPECT_NE(future->status().message().find("promise abandoned"), std::string::npos);
  EXPECT_NE(future->status().message().find("allreduce (seq 12) on group 'g'"), std::string::npos)
      << future->status().message();
  EXPECT_EQ(seen.kind(), ErrorKind::kInternal);
}

TEST(WorkTest, ManyThreadsWaitAtOnce) {
  constexpr int kWaiters = 32;
  auto work = std::make_shared<Work>(OpInfo{"g", "barrier", 1}, milliseconds(60000));
  std::atomic<int> started{0};
  std::atomic<int> ok{0};
  std::atomic<int> callbacks{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      ++started;
      work->AddCallback([&](const Status&) { ++callbacks; });
      Status s;
      switch (i % 3) {
        case 0:
          s = work->Wait();
          break;
        case 1:
          s = work->Wait(milliseconds(60000));
          break;
        default:
          s = work->future().Wait();
          break;
      }
      if (s.ok() && work->IsCompleted()) ++ok;
    });
  }
  while (started.load() < kWaiters) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(20));
  std::thread engine([work] { work->Complete(Status::Ok()); });
  for (std::thread& t : waiters) t.join();
  engine.join();
  EXPECT_EQ(ok.load(), kWaiters);
  EXPECT_EQ(callbacks.load(), kWaiters);
}

TEST(WorkTest, ConcurrentUseFromManyThreads) {
  // Completers, starters, pollers and waiters race; exactly one completion wins.
  for (int round = 0; round < 10; ++round) {
    auto work = std::make_shared<Work>(AllreduceInfo(), milliseconds(60000));
    std::atomic<int> wins{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        work->MarkStarted();
        if (work->Complete(Status::Ok())) ++wins;
      });
      threads.emplace_back([&] {
        while (!work->IsCompleted()) {
          (void)work->status();
          (void)work->times();
        }
      });
      threads.emplace_back([&] { EXPECT_TRUE(work->Wait().ok()); });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(wins.load(), 1);
    const WorkTimes times = work->times();
    ASSERT_TRUE(times.started.has_value());
    ASSERT_TRUE(times.finished.has_value());
    EXPECT_LE(*times.started, *times.finished);
  }
}

}  // namespace
}  // namespace collectived
