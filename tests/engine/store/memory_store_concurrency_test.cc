// MemoryStore under many threads at once: adders and waiters, waiters on many keys, and the
// waiters of a rendezvous released only when every key exists at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
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

// ----- Concurrency ------------------------------------------------------------------------------

TEST(MemoryStoreTest, ManyThreadsAddAndWaitAtOnce) {
  MemoryStore store;
  constexpr int kThreads = 16;
  constexpr int kAdds = 500;
  std::vector<std::string> done_keys;
  for (int t = 0; t < kThreads; ++t) done_keys.push_back("done/" + std::to_string(t));
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string own = "own/" + std::to_string(t);
      for (int i = 0; i < kAdds; ++i) {
        if (!store.Add("counter", 1).ok() || !store.Add(own, 2).ok()) failures[t] += "add;";
      }
      if (!store.Set(done_keys[t], "1").ok()) failures[t] += "set;";
      // Everybody waits for everybody, then reads the exact total.
      Status waited = store.Wait(done_keys, kLong);
      if (!waited.ok()) failures[t] += waited.ToString();
      StatusOr<std::string> total = store.Get("counter", kLong);
      if (!total.ok() || total.value() != std::to_string(kThreads * kAdds)) {
        failures[t] += "total=" + (total.ok() ? total.value() : total.status().ToString());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
    EXPECT_EQ(store.Get("own/" + std::to_string(t)).value(), std::to_string(2 * kAdds));
  }
  EXPECT_EQ(store.Add("counter", 0).value(), kThreads * kAdds);
  EXPECT_EQ(store.NumKeys().value(), 1 + 2 * kThreads);
}

TEST(MemoryStoreTest, ManyWaitersOnManyKeysAreAllReleased) {
  MemoryStore store;
  constexpr int kThreads = 16;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t waits for keys t and t+1 (mod n), then publishes its own "ack" key.
      const std::string a = "k" + std::to_string(t);
      const std::string b = "k" + std::to_string((t + 1) % kThreads);
      if (store.Wait({a, b}, kLong).ok()) ok++;
    });
  }
  std::vector<std::thread> setters;
  for (int t = 0; t < kThreads; ++t) {
    setters.emplace_back([&, t] { (void)store.Add("k" + std::to_string(t), 1); });
  }
  for (std::thread& t : setters) t.join();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads);
}

// A rendezvous: every waiter waits for all keys. A waiter looks at its keys again only once
// every key it was waiting for has been created, so a key deleted meanwhile (one it had already
// seen) must still hold it back until that key is set again.
TEST(MemoryStoreTest, WaitersOnAllKeysOfARendezvousAreReleasedOnlyWhenAllExistAtOnce) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  constexpr int kKeys = 200;
  constexpr int kWaiters = 8;
  std::vector<std::string> keys;
  for (int k = 0; k < kKeys; ++k) keys.push_back("rank/" + std::to_string(k));
  ASSERT_TRUE(store.Set(keys[0], "early").ok());
  std::vector<AsyncResult> async(kWaiters);
  for (AsyncResult& result : async) {
    ASSERT_NE(store.WaitAsync(keys, kLong, result.Callback()), kInvalidWaitId);
  }
  std::vector<std::promise<Status>> sync(kWaiters);
  std::vector<std::future<Status>> sync_results;
  std::vector<std::thread> threads;
  for (auto& result : sync) {
    sync_results.push_back(result.get_future());
    threads.emplace_back([&store, &keys, &result] { result.set_value(store.Wait(keys, kLong)); });
  }
  clock.AwaitWaiters(1);
  for (int k = 1; k < kKeys - 1; ++k) ASSERT_TRUE(store.Set(keys[k], "v").ok());
  ASSERT_TRUE(store.DeleteKey(keys[0]).value());  // seen by every waiter, now gone
  ASSERT_TRUE(store.Set(keys[kKeys - 1], "last").ok());
  std::this_thread::sleep_for(milliseconds(50));
  for (AsyncResult& result : async) EXPECT_FALSE(result.Ready()) << "released without key 0";
  for (auto& result : sync_results) {
    EXPECT_EQ(result.wait_for(milliseconds(0)), std::future_status::timeout)
        << "released without key 0";
  }
  ASSERT_TRUE(store.Set(keys[0], "again").ok());
  for (AsyncResult& result : async) {
    ASSERT_TRUE(result.Ready(kLong));
    EXPECT_TRUE(result.future.get().ok());
  }
  for (std::thread& t : threads) t.join();
  for (auto& result : sync_results) EXPECT_TRUE(result.get().ok());
}

}  // namespace
}  // namespace collectived
