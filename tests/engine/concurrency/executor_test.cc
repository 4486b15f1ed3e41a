// Executor and ParallelFor: a fixed pool that lends threads while tasks block in transport calls,
// bounded whatever is posted.
#include "engine/concurrency/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <numeric>
#include <vector>

#include "engine/concurrency/parallel_for.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A one-shot gate tasks wait on.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  bool WaitOpen(milliseconds limit = milliseconds(20000)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Polls `condition` (a test's own check, not the code under test) for up to ten seconds.
bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(ExecutorTest, RunsEveryTaskOnItsFixedThreads) {
  Executor executor(ExecutorOptions{3, 0});
  EXPECT_EQ(executor.threads(), 3u);
  EXPECT_EQ(executor.ThreadCount(), 3u);
  std::atomic<int> sum{0};
  std::promise<void> all_done;
  std::atomic<int> left{1000};
  for (int i = 1; i <= 1000; ++i) {
    executor.Post([&, i] {
      EXPECT_TRUE(executor.OnPoolThread());
      sum += i;
      if (--left == 0) all_done.set_value();
    });
  }
  all_done.get_future().wait();
  EXPECT_EQ(sum.load(), 500500);
  EXPECT_EQ(executor.PeakThreadCount(), 3u) << "no thread was started per task";
  EXPECT_FALSE(executor.OnPoolThread());
}

TEST(ExecutorTest, DefaultsToTheCoresAndAtLeastTwo) {
  Executor executor;
  EXPECT_GE(executor.threads(), 2u);
  EXPECT_GE(executor.threads(), static_cast<size_t>(std::thread::hardware_concurrency()));
}

TEST(ExecutorTest, LendsAThreadWhilePoolThreadsBlockSoQueuedTasksRun) {
  Executor executor(ExecutorOptions{2, 4});
  Gate release;
  std::atomic<int> blocked{0};
  for (int i = 0; i < 2; ++i) {
    executor.Post([&] {
      Executor::Blocking blocking;
      ++blocked;
      EXPECT_TRUE(release.WaitOpen());
    });
  }
  ASSERT_TRUE(Eventually([&] { return blocked.load() == 2; }));
  // Both pool threads are blocked: the task that unblocks them must still run.
  executor.Post([&] { release.Open(); });
  ASSERT_TRUE(release.WaitOpen());
  EXPECT_GE(executor.PeakThreadCount(), 3u);
  // The lent threads leave once the blocked ones are back.
  EXPECT_TRUE(Eventually([&] { return executor.ThreadCount() == 2; }))
      << executor.ThreadCount() << " threads";
}

TEST(ExecutorTest, TwoSidecarsWhosePoolsAreFullOfEachOthersWaitsDoNotDeadlock) {
  // Group A runs on sidecar 1 and waits for its part on sidecar 2, queued behind group B there,
  // whose part on sidecar 1 is queued behind A: one thread each, and they still finish.
  Executor sidecar1(ExecutorOptions{1, 2});
  Executor sidecar2(ExecutorOptions{1, 2});
  Gate a_on_2, b_on_1;
  std::promise<void> a_done, b_done;
  sidecar1.Post([&] {
    Executor::Blocking blocking;
    EXPECT_TRUE(a_on_2.WaitOpen());
    a_done.set_value();
  });
  sidecar2.Post([&] {
    Executor::Blocking blocking;
    EXPECT_TRUE(b_on_1.WaitOpen());
    b_done.set_value();
  });
  sidecar1.Post([&] { b_on_1.Open(); });
  sidecar2.Post([&] { a_on_2.Open(); });
  EXPECT_EQ(a_done.get_future().wait_for(seconds(20)), std::future_status::ready);
  EXPECT_EQ(b_done.get_future().wait_for(seconds(20)), std::future_status::ready);
}

TEST(ExecutorTest, NeverExceedsItsBoundHoweverManyTasksBlock) {
  Executor executor(ExecutorOptions{2, 3});
  EXPECT_EQ(executor.max_threads(), 5u);
  Gate release;
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  for (int i = 0; i < 40; ++i) {
    executor.Post([&] {
      Executor::Blocking blocking;
      ++started;
      EXPECT_TRUE(release.WaitOpen());
      ++finished;
    });
  }
  ASSERT_TRUE(Eventually([&] { return started.load() == 5; }));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(started.load(), 5) << "the sixth blocked task must wait for a thread";
  EXPECT_EQ(executor.ThreadCount(), 5u);
  release.Open();
  ASSERT_TRUE(Eventually([&] { return finished.load() == 40; }));
  EXPECT_EQ(executor.PeakThreadCount(), 5u);
}

TEST(ExecutorTest, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    Executor executor(ExecutorOptions{1, 0});
    Gate release;
    executor.Post([&] { release.WaitOpen(); });
    for (int i = 0; i < 10; ++i) {
      executor.Post([&] {
        ++ran;
        if (ran == 5) executor.Post([&] { ++ran; });  // posted while stopping
      });
    }
    release.Open();
  }
  EXPECT_EQ(ran.load(), 11);
}

TEST(ParallelForTest, RunsEveryItemOnceAcrossThePool) {
  Executor executor(ExecutorOptions{2, 0});
  std::vector<std::atomic<int>> hits(1000);
  Status status = ParallelFor(&executor, hits.size(), 4, [&](size_t i) {
    ++hits[i];
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok());
  for (const auto& hit : hits) EXPECT_EQ(hit.load(), 1);
}

TEST(ParallelForTest, FinishesOnTheCallerWhenEveryPoolThreadIsBusy) {
  Executor executor(ExecutorOptions{1, 0});
  Gate release;
  executor.Post([&] { release.WaitOpen(); });  // the one pool thread is taken
  std::atomic<int> items{0};
  Status status = ParallelFor(&executor, 64, 3, [&](size_t) {
    ++items;
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(items.load(), 64);
  release.Open();
}

TEST(ParallelForTest, ReportsTheFirstErrorAndSkipsWhatHasNotStarted) {
  std::atomic<int> ran{0};
  Status status = ParallelFor(nullptr, 100, 0, [&](size_t i) {
    ++ran;
    return i == 10 ? Status::Internal("item 10 failed") : Status::Ok();
  });
  EXPECT_EQ(status.message(), "item 10 failed");
  EXPECT_EQ(ran.load(), 11);
}

}  // namespace
}  // namespace collectived
