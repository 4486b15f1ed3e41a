// Future and Promise (engine/vocabulary/work.h): completion and its first winner, waits and
// their timeouts, callbacks, abandoned promises, and Then.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/vocabulary/work.h"
#include "tests/engine/work_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

using namespace work_testing;  // NOLINT: the helpers of these tests

// A type without a default constructor, to check that Future does not need one.
struct NoDefault {
  explicit NoDefault(int v) : value(v) {}
  int value;
};

// ---------------------------------------------------------------------------------------------
// Future / Promise

TEST(FutureTest, SetValueMakesValueAvailable) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_FALSE(future.IsReady());
  EXPECT_TRUE(future.status().ok());  // OK while pending

  EXPECT_TRUE(promise.SetValue(42));
  EXPECT_TRUE(future.IsReady());
  EXPECT_TRUE(future.Wait().ok());
  EXPECT_TRUE(future.Wait(milliseconds(0)).ok());
  EXPECT_TRUE(future.status().ok());
  EXPECT_EQ(future.value(), 42);
}

TEST(FutureTest, VoidFutureCompletes) {
  Promise<void> promise;
  Future<void> future = promise.future();
  EXPECT_FALSE(promise.IsReady());
  EXPECT_TRUE(promise.SetValue());
  EXPECT_TRUE(promise.IsReady());
  EXPECT_TRUE(future.IsReady());
  EXPECT_TRUE(future.Wait().ok());
}

TEST(FutureTest, CopiesShareState) {
  Promise<std::string> promise;
  Future<std::string> a = promise.future();
  Future<std::string> b = a;
  Future<std::string> c = promise.future();
  ASSERT_TRUE(promise.SetValue("hello"));
  EXPECT_TRUE(a.IsReady() && b.IsReady() && c.IsReady());
  EXPECT_EQ(&a.value(), &b.value());
  EXPECT_EQ(&a.value(), &c.value());
  EXPECT_EQ(c.value(), "hello");
}

TEST(FutureTest, ValueTypeNeedNotBeDefaultConstructible) {
  Promise<NoDefault> promise;
  Future<NoDefault> future = promise.future();
  ASSERT_TRUE(promise.SetValue(NoDefault(7)));
  EXPECT_EQ(future.value().value, 7);
}

TEST(FutureTest, MoveOnlyValue) {
  Promise<std::unique_ptr<int>> promise;
  Future<std::unique_ptr<int>> future = promise.future();
  ASSERT_TRUE(promise.SetValue(std::make_unique<int>(5)));
  ASSERT_NE(future.value(), nullptr);
  EXPECT_EQ(*future.value(), 5);
}

TEST(FutureTest, CompletionFromAnotherThreadWakesWaiter) {
  Promise<int> promise;
  Future<int> future = promise.future();
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    Status s = future.Wait();
    EXPECT_TRUE(s.ok()) << s.ToString();
    returned = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned.load());
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(promise.SetValue(1));
  waiter.join();
  EXPECT_TRUE(returned.load());
  EXPECT_LT(ElapsedSince(start), milliseconds(1000));
}

TEST(FutureTest, TimedWaitWokenByCompletionLongBeforeTimeout) {
  Promise<void> promise;
  Future<void> future = promise.future();
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    promise.SetValue();
  });
  const Clock::time_point start = Clock::now();
  EXPECT_TRUE(future.Wait(milliseconds(60000)).ok());
  EXPECT_LT(ElapsedSince(start), milliseconds(10000));
  completer.join();
}

TEST(FutureTest, WaitTimesOutAfterAtLeastTheTimeoutWithoutCancelling) {
  Promise<int> promise;
  Future<int> future = promise.future();

  const Clock::time_point start = Clock::now();
  Status s = future.Wait(kShortTimeout);
  const milliseconds elapsed = ElapsedSince(start);

  EXPECT_EQ(s.kind(), ErrorKind::kTimeout);
  EXPECT_TRUE(s.IsTimeout());
  EXPECT_NE(s.message().find("Timeout"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("200 ms"), std::string::npos) << s.message();
  EXPECT_GE(elapsed, kShortTimeout);
  EXPECT_LT(elapsed, 3 * kShortTimeout);

  // Waiting did not complete or cancel anything: the op can still succeed.
  EXPECT_FALSE(future.IsReady());
  EXPECT_TRUE(future.status().ok());
  EXPECT_TRUE(promise.SetValue(3));
  EXPECT_TRUE(future.Wait(kShortTimeout).ok());
  EXPECT_EQ(future.value(), 3);
}

TEST(FutureTest, WaitUntilDeadline) {
  Promise<void> promise;
  Future<void> future = promise.future();
  const Clock::time_point deadline = Clock::now() + kShortTimeout;
  Status s = future.WaitUntil(deadline);
  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_NE(s.message().find("Timeout"), std::string::npos);
  EXPECT_GE(Clock::now(), deadline);
  promise.SetValue();
  EXPECT_TRUE(future.WaitUntil(Clock::time_point::max()).ok());
}

TEST(FutureTest, ZeroAndNegativeTimeoutsPoll) {
  Promise<void> promise;
  Future<void> future = promise.future();
  const Clock::time_point start = Clock::now();
  EXPECT_TRUE(future.Wait(milliseconds(0)).IsTimeout());
  EXPECT_TRUE(future.Wait(milliseconds(-5)).IsTimeout());
  EXPECT_LT(ElapsedSince(start), milliseconds(1000));
}

TEST(FutureTest, HugeTimeoutDoesNotOverflow) {
  Promise<void> promise;
  Future<void> future = promise.future();
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    promise.SetValue();
  });
  // milliseconds::max() would overflow if converted naively to the clock's nanoseconds and
  // return at once with a Timeout.
  EXPECT_TRUE(future.Wait(milliseconds::max()).ok());
  EXPECT_TRUE(future.Wait(milliseconds::max()).ok());
  completer.join();
}

TEST(FutureTest, ErrorPropagatesToAllWaitMethods) {
  Promise<int> promise;
  Future<int> future = promise.future();
  ASSERT_TRUE(promise.SetError(Status::PeerLost("rank 3 of group 'g' is gone")));

  EXPECT_TRUE(future.IsReady());
  for (const Status& s : {future.Wait(), future.Wait(kShortTimeout), future.status(),
                          future.WaitUntil(Clock::now())}) {
    EXPECT_EQ(s.kind(), ErrorKind::kPeerLost);
    EXPECT_EQ(s.message(), "rank 3 of group 'g' is gone");
  }
}

TEST(FutureTest, ErrorFromAnotherThreadWakesWaiter) {
  Promise<void> promise;
  Future<void> future = promise.future();
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    promise.SetError(Status::Aborted("group 'g' aborted"));
  });
  Status s = future.Wait();
  EXPECT_EQ(s.kind(), ErrorKind::kAborted);
  completer.join();
}

TEST(FutureTest, SetErrorWithOkStatusBecomesInternal) {
  Promise<void> promise;
  Future<void> future = promise.future();
  EXPECT_TRUE(promise.SetError(Status::Ok()));
  EXPECT_EQ(future.status().kind(), ErrorKind::kInternal);
  EXPECT_NE(future.status().message().find("OK status"), std::string::npos);
}

TEST(FutureTest, DoubleCompletionFirstWins) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_TRUE(promise.SetValue(1));
  EXPECT_FALSE(promise.SetValue(2));
  EXPECT_FALSE(promise.SetError(Status::Internal("late")));
  EXPECT_TRUE(future.status().ok());
  EXPECT_EQ(future.value(), 1);

  Promise<int> failed;
  Future<int> failed_future = failed.future();
  EXPECT_TRUE(failed.SetError(Status::Desync("ranks disagree")));
  EXPECT_FALSE(failed.SetValue(2));
  EXPECT_FALSE(failed.SetError(Status::Internal("late")));
  EXPECT_EQ(failed_future.status().kind(), ErrorKind::kDesync);
  EXPECT_EQ(failed_future.status().message(), "ranks disagree");
}

TEST(FutureTest, ConcurrentCompletersExactlyOneWins) {
  for (int round = 0; round < 20; ++round) {
    Promise<int> promise;
    Future<int> future = promise.future();
    std::atomic<int> winners{0};
    std::atomic<int> winner_value{-1};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        const bool won = (i % 2 == 0) ? promise.SetValue(i)
                                      : promise.SetError(Status::Internal(std::to_string(i)));
        if (won) {
          ++winners;
          winner_value = i;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1);
    const int w = winner_value.load();
    if (w % 2 == 0) {
      EXPECT_EQ(future.value(), w);
    } else {
      EXPECT_EQ(future.status().message(), std::to_string(w));
    }
  }
}

TEST(FutureTest, CallbacksRunInOrderExactlyOnceOnCompletingThread) {
  Promise<int> promise;
  Future<int> future = promise.future();
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 5; ++i) {
    future.AddCallback([&, i](const Status& s) {
      EXPECT_TRUE(s.ok());
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  std::thread::id completer_id;
  std::thread completer([&] {
    completer_id = std::this_thread::get_id();
    EXPECT_TRUE(promise.SetValue(9));
    EXPECT_FALSE(promise.SetValue(10));  // must not run the callbacks again
  });
  completer.join();

  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  for (std::thread::id id : threads) EXPECT_EQ(id, completer_id);
}

TEST(FutureTest, CallbacksSeeTheError) {
  Promise<void> promise;
  Future<void> future = promise.future();
  Status seen;
  future.AddCallback([&](const Status& s) { seen = s; });
  promise.SetError(Status::Unavailable("store unreachable"));
  EXPECT_EQ(seen.kind(), ErrorKind::kUnavailable);
  EXPECT_EQ(seen.message(), "store unreachable");
}

TEST(FutureTest, CallbackRunsInlineWhenAlreadyComplete) {
  Promise<void> promise;
  Future<void> future = promise.future();
  promise.SetValue();
  bool ran = false;
  std::thread::id ran_on;
  future.AddCallback([&](const Status& s) {
    EXPECT_TRUE(s.ok());
    ran = true;
    ran_on = std::this_thread::get_id();
  });
  EXPECT_TRUE(ran);  // before AddCallback returned
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(FutureTest, EmptyCallbackIsIgnored) {
  Promise<void> promise;
  Future<void> future = promise.future();
  future.AddCallback(nullptr);
  EXPECT_TRUE(promise.SetValue());
  future.AddCallback(std::function<void(const Status&)>());
  EXPECT_TRUE(future.IsReady());
}

TEST(FutureTest, CallbackMayCallBackIntoTheFuture) {
  Promise<int> promise;
  Future<int> future = promise.future();
  std::vector<std::string> events;
  future.AddCallback([&, future](const Status& s) {
    // All of these take the internal lock: a callback run under it would deadlock here.
    EXPECT_TRUE(future.IsReady());
    EXPECT_TRUE(future.status().ok());
    EXPECT_TRUE(future.Wait().ok());
    EXPECT_TRUE(future.Wait(milliseconds(10)).ok());
    EXPECT_EQ(future.value(), 11);
    events.push_back("outer");
    future.AddCallback([&](const Status&) { events.push_back("nested"); });
    events.push_back("outer done");
  });
  future.AddCallback([&](const Status&) { events.push_back("second"); });
  EXPECT_TRUE(promise.SetValue(11));
  // A callback added from inside a callback sees a completed future and runs at once.
  EXPECT_EQ(events, (std::vector<std::string>{"outer", "nested", "outer done", "second"}));
}

TEST(FutureTest, CallbacksAreNotInvokedUnderTheLock) {
  // The callback waits for another thread that itself needs the future's lock. If callbacks
  // ran under that lock, the other thread could never answer.
  Promise<void> promise;
  Future<void> future = promise.future();
  std::atomic<bool> answered{false};
  future.AddCallback([&, future](const Status&) {
    std::thread other([&, future] {
      EXPECT_TRUE(future.IsReady());
      EXPECT_TRUE(future.status().ok());
      answered = true;
    });
    other.join();
  });
  auto done = std::async(std::launch::async, [&] { return promise.SetValue(); });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "deadlock";
  EXPECT_TRUE(done.get());
  EXPECT_TRUE(answered.load());
}

TEST(FutureTest, WaitersAreWokenBeforeSlowCallbacksFinish) {
  Promise<void> promise;
  Future<void> future = promise.future();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  future.AddCallback([released](const Status&) { released.wait(); });
  std::thread completer([&] { promise.SetValue(); });
  // The completer is stuck in the callback, yet the future is already complete.
  EXPECT_TRUE(future.Wait(milliseconds(10000)).ok());
  release.set_value();
  completer.join();
}

TEST(FutureTest, CallbacksAddedConcurrentlyWithCompletionRunExactlyOnce) {
  for (int round = 0; round < 10; ++round) {
    Promise<void> promise;
    Future<void> future = promise.future();
    constexpr int kThreads = 8;
    constexpr int kPerThread = 50;
    std::atomic<int> runs{0};
    std::vector<std::thread> adders;
    for (int t = 0; t < kThreads; ++t) {
      adders.emplace_back([&] {
        for (int i = 0; i < kPerThread; ++i) future.AddCallback([&](const Status&) { ++runs; });
      });
    }
    std::thread completer([&] { promise.SetValue(); });
    for (std::thread& t : adders) t.join();
    completer.join();
    EXPECT_EQ(runs.load(), kThreads * kPerThread);
  }
}

TEST(FutureTest, AbandonedPromiseFailsTheFuture) {
  std::optional<Future<int>> future;
  {
    Promise<int> promise;
    future.emplace(promise.future());
  }
  ASSERT_TRUE(future->IsReady());
  EXPECT_EQ(future->status().kind(), ErrorKind::kInternal);
  EXPECT_NE(future->status().message().find("promise abandoned"), std::string::npos)
      << future->status().message();
}

TEST(FutureTest, AbandonedPromiseWakesWaiterOnAnotherThread) {
  auto promise = std::make_unique<Promise<void>>();
  Future<void> future = promise->future();
  std::thread waiter([future] {
    Status s = future.Wait();
    EXPECT_EQ(s.kind(), ErrorKind::kInternal);
    EXPECT_NE(s.message().find("promise abandoned"), std::string::npos);
  });
  std::this_thread::sleep_for(milliseconds(20));
  promise.reset();
  waiter.join();
}

TEST(FutureTest, AbandonRunsCallbacks) {
  Status seen;
  {
    Promise<void> promise;
    promise.future().AddCallback([&](const Status& s) { seen = s; });
  }
  EXPECT_EQ(seen.kind(), ErrorKind::kInternal);
}

TEST(FutureTest, CompletedPromiseIsNotAbandoned) {
  std::optional<Future<int>> future;
  {
    Promise<int> promise;
    future.emplace(promise.future());
    promise.SetValue(4);
  }
  EXPECT_TRUE(future->status().ok());
  EXPECT_EQ(future->value(), 4);
}

TEST(FutureTest, MovingAPromiseDoesNotAbandonIt) {
  Promise<int> original;
  Future<int> future = original.future();
  Promise<int> moved(std::move(original));
  EXPECT_FALSE(future.IsReady());
  Promise<int> assigned;
  assigned = std::move(moved);
  EXPECT_FALSE(future.IsReady());
  EXPECT_TRUE(assigned.SetValue(8));
  EXPECT_EQ(future.value(), 8);
}

TEST(FutureTest, MoveAssignmentAbandonsTheOverwrittenPromise) {
  Promise<int> promise;
  Future<int> overwritten = promise.future();
  promise = Promise<int>();
  EXPECT_EQ(overwritten.status().kind(), ErrorKind::kInternal);
  Future<int> fresh = promise.future();
  EXPECT_FALSE(fresh.IsReady());
  EXPECT_TRUE(promise.SetValue(1));
  EXPECT_EQ(fresh.value(), 1);
}

TEST(FutureTest, ManyWaitersAreAllWoken) {
  constexpr int kWaiters = 32;
  Promise<int> promise;
  Future<int> future = promise.future();
  std::atomic<int> started{0};
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      ++started;
      // Mix unbounded and bounded waits.
      Status s = (i % 2 == 0) ? future.Wait() : future.Wait(milliseconds(60000));
      if (s.ok() && future.value() == 77) ++ok;
    });
  }
  while (started.load() < kWaiters) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_TRUE(promise.SetValue(77));
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(ok.load(), kWaiters);
}

TEST(FutureTest, MakeReadyAndFailedFutures) {
  Future<int> ready = MakeReadyFuture(5);
  EXPECT_TRUE(ready.IsReady());
  EXPECT_EQ(ready.value(), 5);

  Future<void> ready_void = MakeReadyFuture();
  EXPECT_TRUE(ready_void.IsReady());
  EXPECT_TRUE(ready_void.status().ok());

  Future<int> failed = MakeFailedFuture<int>(Status::InvalidArgument("bad root"));
  EXPECT_TRUE(failed.IsReady());
  EXPECT_TRUE(failed.status().IsInvalidArgument());
}

using FutureDeathTest = ::testing::Test;

TEST(FutureDeathTest, ValueOfFailedFutureAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Future<int> failed = MakeFailedFuture<int>(Status::Internal("boom"));
  EXPECT_DEATH((void)failed.value(), "contract violation.*boom");
}

TEST(FutureDeathTest, ValueOfPendingFutureAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Promise<int> promise;
  Future<int> pending = promise.future();
  EXPECT_DEATH((void)pending.value(), "contract violation");
  promise.SetValue(0);
}

// ---------------------------------------------------------------------------------------------
// Then

TEST(FutureThenTest, TransformsTheValue) {
  Promise<int> promise;
  Future<std::string> text =
      promise.future().Then([](const int& v) { return std::to_string(v * 2); });
  EXPECT_FALSE(text.IsReady());
  promise.SetValue(21);
  ASSERT_TRUE(text.IsReady());
  EXPECT_EQ(text.value(), "42");
}

TEST(FutureThenTest, RunsInlineOnReadyFuture) {
  Future<int> doubled = MakeReadyFuture(3).Then([](int v) { return v * 2; });
  ASSERT_TRUE(doubled.IsReady());
  EXPECT_EQ(doubled.value(), 6);
}

TEST(FutureThenTest, VoidFutures) {
  Promise<void> promise;
  bool ran = false;
  Future<void> after = promise.future().Then([&] { ran = true; });
  Future<int> value = promise.future().Then([] { return 5; });
  promise.SetValue();
  EXPECT_TRUE(ran);
  EXPECT_TRUE(after.IsReady());
  EXPECT_TRUE(after.status().ok());
  EXPECT_EQ(value.value(), 5);
}

TEST(FutureThenTest, StatusAndStatusOrResults) {
  Future<void> failed =
      MakeReadyFuture(1).Then([](int) { return Status::Desync("op mismatch at seq 4"); });
  EXPECT_EQ(failed.status().kind(), ErrorKind::kDesync);

  Future<void> succeeded = MakeReadyFuture(1).Then([](int) { return Status::Ok(); });
  EXPECT_TRUE(succeeded.IsReady());
  EXPECT_TRUE(succeeded.status().ok());

  Future<int> value = MakeReadyFuture(2).Then([](int v) -> StatusOr<int> { return v + 1; });
  EXPECT_EQ(value.value(), 3);

  Future<int> error =
      MakeReadyFuture(2).Then([](int) -> StatusOr<int> { return Status::InvalidArgument("no"); });
  EXPECT_TRUE(error.status().IsInvalidArgument());
}

TEST(FutureThenTest, ErrorSkipsTheContinuation) {
  Promise<int> promise;
  bool ran = false;
  Future<int> next = promise.future().Then([&](int v) {
    ran = true;
    return v;
  });
  promise.SetError(Status::PeerLost("rank 1 lost"));
  EXPECT_FALSE(ran);
  EXPECT_EQ(next.status().kind(), ErrorKind::kPeerLost);
  EXPECT_EQ(next.status().message(), "rank 1 lost");
}

TEST(FutureThenTest, ExceptionBecomesInternalError) {
  Future<int> next =
      MakeReadyFuture(1).Then([](int) -> int { throw std::runtime_error("kaboom"); });
  EXPECT_EQ(next.status().kind(), ErrorKind::kInternal);
  EXPECT_NE(next.status().message().find("kaboom"), std::string::npos);
}

TEST(FutureThenTest, ChainsAcrossThreads) {
  Promise<int> promise;
  Future<int> chained =
      promise.future().Then([](int v) { return v + 1; }).Then([](int v) { return v * 10; });
  std::thread completer([&] { promise.SetValue(4); });
  EXPECT_TRUE(chained.Wait(milliseconds(10000)).ok());
  EXPECT_EQ(chained.value(), 50);
  completer.join();
}

TEST(FutureThenTest, AbandonedParentFailsChild) {
  std::optional<Future<int>> child;
  {
    Promise<int> promise;
    child.emplace(promise.future().Then([](int v) { return v; }));
  }
  EXPECT_EQ(child->status().kind(), ErrorKind::kInternal);
}

}  // namespace
}  // namespace collectived
