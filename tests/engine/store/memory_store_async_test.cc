// MemoryStore.WaitAsync and CancelWait: completions when the keys are set, timeouts in deadline
// order, cancellation, callbacks that call back into the store, and the store destroyed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/store/memory_store.h"
#include "tests/engine/store/memory_store_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

using namespace store_testing;  // NOLINT: the helpers of these tests

// ----- WaitAsync / CancelWait -------------------------------------------------------------------

TEST(MemoryStoreTest, WaitAsyncCompletesWhenAllKeysAreSet) {
  MemoryStore store;
  AsyncResult async;
  WaitId id = store.WaitAsync({"a", "b"}, kLong, async.Callback());
  EXPECT_NE(id, kInvalidWaitId);
  EXPECT_TRUE(store.Set("a", "1").ok());
  EXPECT_FALSE(async.Ready(milliseconds(20)));
  EXPECT_TRUE(store.Set("b", "1").ok());
  // Completed on the setter's thread, before Set returned.
  ASSERT_TRUE(async.Ready());
  EXPECT_TRUE(async.future.get().ok());
  EXPECT_EQ(async.calls.load(), 1);
  EXPECT_FALSE(store.CancelWait(id));  // already completed
  EXPECT_EQ(async.calls.load(), 1);
}

TEST(MemoryStoreTest, WaitAsyncCompletesInlineWhenKeysExist) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("here", "1").ok());
  AsyncResult async;
  EXPECT_EQ(store.WaitAsync({"here"}, kShort, async.Callback()), kInvalidWaitId);
  ASSERT_TRUE(async.Ready());
  EXPECT_TRUE(async.future.get().ok());
  AsyncResult none;
  EXPECT_EQ(store.WaitAsync({}, kShort, none.Callback()), kInvalidWaitId);
  EXPECT_TRUE(none.Ready());
}

TEST(MemoryStoreTest, WaitAsyncTimesOutWithTheSameMessageAsWait) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  AsyncResult async;
  WaitId id = store.WaitAsync({"never"}, milliseconds(200), async.Callback());
  EXPECT_NE(id, kInvalidWaitId);
  clock.AwaitWaiters(1);  // the timer thread, at the deadline
  clock.Advance(milliseconds(199));
  clock.AwaitWaiters(1);
  EXPECT_FALSE(async.Ready());
  clock.Advance(milliseconds(1));
  ASSERT_TRUE(async.Ready(kLong));
  Status status = async.future.get();
  ASSERT_TRUE(status.IsTimeout());
  EXPECT_EQ(status.message(),
            "Timeout after 200 ms waiting for key 'never' in store (1 of 1 keys missing)");
  EXPECT_FALSE(store.CancelWait(id));
  // A later set does not call it again.
  EXPECT_TRUE(store.Set("never", "1").ok());
  EXPECT_EQ(async.calls.load(), 1);
}

TEST(MemoryStoreTest, WaitAsyncTimeoutsFireInDeadlineOrder) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::mutex mu;
  std::condition_variable fired_cv;
  std::vector<int> order;
  // Register the longest first so the timer must re-arm for earlier deadlines.
  for (int ms : {300, 200, 100}) {
    store.WaitAsync({"k" + std::to_string(ms)}, milliseconds(ms), [&, ms](Status s) {
      EXPECT_TRUE(s.IsTimeout());
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(ms);
      fired_cv.notify_all();
    });
  }
  // Each step of 100 ms passes one deadline; the next waits for the previous to have fired.
  for (size_t fired = 1; fired <= 3; ++fired) {
    clock.AwaitWaiters(1);
    clock.Advance(milliseconds(100));
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(fired_cv.wait_for(lock, kLong, [&] { return order.size() >= fired; }));
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{100, 200, 300}));
}

TEST(MemoryStoreTest, CancelWaitCallsDoneWithAbortedBeforeReturning) {
  MemoryStore store;
  AsyncResult async;
  WaitId id = store.WaitAsync({"cancel-me"}, kLong, async.Callback());
  ASSERT_NE(id, kInvalidWaitId);
  EXPECT_FALSE(async.Ready());
  EXPECT_TRUE(store.CancelWait(id));
  ASSERT_TRUE(async.Ready());
  Status status = async.future.get();
  EXPECT_EQ(status.kind(), ErrorKind::kAborted);
  EXPECT_NE(status.message().find("'cancel-me'"), std::string::npos);
  EXPECT_NE(status.message().find("cancelled"), std::string::npos);
  EXPECT_FALSE(store.CancelWait(id));
  EXPECT_TRUE(store.Set("cancel-me", "1").ok());
  EXPECT_EQ(async.calls.load(), 1);
  EXPECT_FALSE(store.CancelWait(kInvalidWaitId));
  EXPECT_FALSE(store.CancelWait(123456));
}

TEST(MemoryStoreTest, CancelWaitWithoutDeadline) {
  MemoryStore store;
  AsyncResult async;
  WaitId id = store.WaitAsync({"forever"}, kNoTimeout, async.Callback());
  EXPECT_TRUE(store.CancelWait(id));
  EXPECT_EQ(async.future.get().kind(), ErrorKind::kAborted);
}

TEST(MemoryStoreTest, ManyAsyncWaitersOnOneKeyAreWokenByOneSet) {
  MemoryStore store;
  constexpr int kWaiters = 200;
  std::atomic<int> ok{0};
  std::atomic<int> calls{0};
  for (int i = 0; i < kWaiters; ++i) {
    WaitId id = store.WaitAsync({"go"}, i % 2 == 0 ? kLong : kNoTimeout, [&](Status s) {
      if (s.ok()) ok++;
      calls++;
    });
    EXPECT_NE(id, kInvalidWaitId);
  }
  EXPECT_EQ(calls.load(), 0);
  EXPECT_TRUE(store.Set("go", "1").ok());
  EXPECT_EQ(ok.load(), kWaiters);
  EXPECT_EQ(calls.load(), kWaiters);
}

TEST(MemoryStoreTest, AsyncCallbackMayCallBackIntoTheStore) {
  MemoryStore store;
  std::promise<std::string> value;
  store.WaitAsync({"reentrant"}, kLong, [&](Status s) {
    // No store lock is held while `done` runs.
    StatusOr<std::string> got = store.Get("reentrant", kShort);
    (void)store.Set("from-callback", "x");
    value.set_value(got.ok() ? got.value() : got.status().ToString());
  });
  EXPECT_TRUE(store.Set("reentrant", "v").ok());
  EXPECT_EQ(value.get_future().get(), "v");
  EXPECT_TRUE(store.Check({"from-callback"}).value());
}

TEST(MemoryStoreTest, AsyncWaiterSurvivesDeletionOfAKeyItAlreadySaw) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("a", "1").ok());
  AsyncResult async;
  WaitId id = store.WaitAsync({"a", "b"}, kLong, async.Callback());
  ASSERT_NE(id, kInvalidWaitId);
  ASSERT_TRUE(store.DeleteKey("a").value());
  EXPECT_TRUE(store.Set("b", "1").ok());
  EXPECT_FALSE(async.Ready(milliseconds(20)));
  EXPECT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(async.Ready());
  EXPECT_TRUE(async.future.get().ok());
}

TEST(MemoryStoreTest, ConcurrentCancelAndSetCallDoneExactlyOnce) {
  MemoryStore store;
  constexpr int kRounds = 300;
  std::vector<std::unique_ptr<std::atomic<int>>> calls;
  int cancelled = 0;
  for (int r = 0; r < kRounds; ++r) {
    calls.push_back(std::make_unique<std::atomic<int>>(0));
    const std::string key = "race" + std::to_string(r);
    std::atomic<int>* counter = calls.back().get();
    WaitId id = store.WaitAsync({key}, kLong, [counter](Status) { counter->fetch_add(1); });
    std::thread setter([&] { (void)store.Set(key, "1"); });
    if (store.CancelWait(id)) {
      cancelled++;
      EXPECT_EQ(counter->load(), 1);  // called before CancelWait returned
    }
    setter.join();
  }
  for (int r = 0; r < kRounds; ++r) EXPECT_EQ(calls[r]->load(), 1) << r;
  (void)cancelled;
}

TEST(MemoryStoreTest, DestroyingTheStoreAbortsPendingAsyncWaits) {
  AsyncResult timed;
  AsyncResult untimed;
  {
    MemoryStore store;
    EXPECT_NE(store.WaitAsync({"x"}, kLong, timed.Callback()), kInvalidWaitId);
    EXPECT_NE(store.WaitAsync({"y"}, kNoTimeout, untimed.Callback()), kInvalidWaitId);
  }
  ASSERT_TRUE(timed.Ready());
  ASSERT_TRUE(untimed.Ready());
  EXPECT_EQ(timed.future.get().kind(), ErrorKind::kAborted);
  EXPECT_EQ(untimed.future.get().kind(), ErrorKind::kAborted);
}

}  // namespace
}  // namespace collectived
