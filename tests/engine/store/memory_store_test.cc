// MemoryStore, one call at a time: Set and Get, Wait and Check, Add, CompareSet, DeleteKey and
// NumKeys, MultiGet and MultiSet, Append, with their timeouts and the waiters they release.
#include "engine/store/memory_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/store/prefix_store.h"
#include "tests/engine/store/memory_store_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

using namespace store_testing;  // NOLINT: the helpers of these tests

milliseconds Since(Clock::TimePoint start) {
  return std::chrono::duration_cast<milliseconds>(Clock::Real().Now() - start);
}

// ----- Set / Get ------------------------------------------------------------------------------

TEST(MemoryStoreTest, SetThenGetReturnsValueBytes) {
  MemoryStore store;
  const std::string binary("a\0b\xff", 4);
  EXPECT_TRUE(store.Set("key", binary).ok());
  StatusOr<std::string> got = store.Get("key");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), binary);
}

TEST(MemoryStoreTest, SetOverwritesAndEmptyValueIsAValue) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("key", "one").ok());
  EXPECT_TRUE(store.Set("key", "two").ok());
  EXPECT_EQ(store.Get("key").value(), "two");
  EXPECT_TRUE(store.Set("empty", "").ok());
  EXPECT_TRUE(store.Check({"empty"}).value());
  EXPECT_EQ(store.Get("empty", milliseconds(10)).value(), "");
}

TEST(MemoryStoreTest, GetOfMissingKeyTimesOutAfterOneSecond) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::future<StatusOr<std::string>> result =
      std::async(std::launch::async, [&] { return store.Get("foo", milliseconds(1000)); });
  clock.AwaitWaiters(1);
  clock.Advance(milliseconds(999));
  clock.AwaitWaiters(1);  // still waiting a millisecond before its deadline
  EXPECT_EQ(result.wait_for(milliseconds(0)), std::future_status::timeout);
  clock.Advance(milliseconds(1));
  StatusOr<std::string> got = result.get();
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(got.status().IsTimeout());
  EXPECT_NE(got.status().message().find("Timeout"), std::string::npos);
  EXPECT_NE(got.status().message().find("'foo'"), std::string::npos);
  EXPECT_EQ(got.status().message(),
            "Timeout after 1000 ms waiting for key 'foo' in store (1 of 1 keys missing)");
}

TEST(MemoryStoreTest, DefaultTimeoutIsUsedWhenNoneIsGiven) {
  MemoryStore store;
  EXPECT_EQ(store.default_timeout(), kDefaultStoreTimeout);
  EXPECT_EQ(store.default_timeout(), std::chrono::seconds(300));
  ASSERT_TRUE(store.SetDefaultTimeout(kShort).ok());
  EXPECT_EQ(store.default_timeout(), kShort);
  const Clock::TimePoint start = Clock::Real().Now();
  StatusOr<std::string> got = store.Get("missing");
  EXPECT_TRUE(got.status().IsTimeout());
  EXPECT_NE(got.status().message().find("after 100 ms"), std::string::npos);
  EXPECT_GE(Since(start), kShort);
  EXPECT_TRUE(store.Wait({"missing"}).IsTimeout());
  EXPECT_TRUE(store.MultiGet({"missing"}).status().IsTimeout());
}

TEST(MemoryStoreTest, SetDefaultTimeoutRejectsNegativeAndAbsurdValues) {
  MemoryStore store;
  EXPECT_TRUE(store.SetDefaultTimeout(milliseconds(-1)).IsInvalidArgument());
  EXPECT_TRUE(store.SetDefaultTimeout(kMaxStoreTimeout + milliseconds(1)).IsInvalidArgument());
  EXPECT_EQ(store.default_timeout(), kDefaultStoreTimeout);
  EXPECT_TRUE(store.SetDefaultTimeout(kNoTimeout).ok());
  EXPECT_TRUE(store.SetDefaultTimeout(kMaxStoreTimeout).ok());
}

TEST(MemoryStoreTest, GetIsReleasedBySetFromAnotherThread) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::promise<StatusOr<std::string>> result;
  std::thread getter([&] { result.set_value(store.Get("late", kLong)); });
  clock.AwaitWaiters(1);
  EXPECT_TRUE(store.Set("late", "value").ok());
  getter.join();
  StatusOr<std::string> got = result.get_future().get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), "value");
}

TEST(MemoryStoreTest, GetWithNoTimeoutWaitsUntilSet) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::promise<StatusOr<std::string>> result;
  std::thread getter([&] { result.set_value(store.Get("late", kNoTimeout)); });
  clock.AwaitWaiters(1);
  EXPECT_TRUE(store.Set("late", "v").ok());
  getter.join();
  EXPECT_EQ(result.get_future().get().value(), "v");
}

// ----- Wait / Check -----------------------------------------------------------------------------

TEST(MemoryStoreTest, WaitReturnsOnlyWhenAllKeysExist) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::atomic<bool> returned{false};
  Status status;
  std::thread waiter([&] {
    status = store.Wait({"a", "b", "c"}, kLong);
    returned = true;
  });
  EXPECT_TRUE(store.Set("a", "1").ok());
  EXPECT_TRUE(store.Set("b", "1").ok());
  clock.AwaitWaiters(1);
  EXPECT_FALSE(returned.load());
  EXPECT_TRUE(store.Set("c", "1").ok());
  waiter.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(MemoryStoreTest, WaitTimeoutNamesMissingKeys) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("present", "1").ok());
  Status status = store.Wait({"present", "absent"}, kShort);
  ASSERT_TRUE(status.IsTimeout());
  EXPECT_EQ(status.message(),
            "Timeout after 100 ms waiting for keys ['present', 'absent'] in store "
            "(1 of 2 keys missing: ['absent'])");
}

TEST(MemoryStoreTest, WaitOnExistingAndEmptyKeysReturnsAtOnce) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("x", "1").ok());
  EXPECT_TRUE(store.Wait({"x"}, kShort).ok());
  EXPECT_TRUE(store.Wait({}, kShort).ok());
  EXPECT_TRUE(store.Wait({"x", "x"}, kShort).ok());
}

TEST(MemoryStoreTest, WaiterKeepsWaitingWhenAKeyIsDeletedBeforeTheLastOneIsSet) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  EXPECT_TRUE(store.Set("a", "1").ok());
  std::promise<Status> result;
  std::future<Status> future = result.get_future();
  std::thread waiter([&] { result.set_value(store.Wait({"a", "b"}, kLong)); });
  clock.AwaitWaiters(1);
  ASSERT_TRUE(store.DeleteKey("a").value());
  EXPECT_TRUE(store.Set("b", "1").ok());
  EXPECT_EQ(future.wait_for(milliseconds(100)), std::future_status::timeout);
  EXPECT_TRUE(store.Set("a", "2").ok());
  EXPECT_TRUE(future.get().ok());
  waiter.join();
}

TEST(MemoryStoreTest, CheckNeverWaits) {
  MemoryStore store;
  const Clock::TimePoint start = Clock::Real().Now();
  EXPECT_FALSE(store.Check({"nope"}).value());
  EXPECT_LT(Since(start), milliseconds(1000));  // not the 300 s default timeout
  EXPECT_TRUE(store.Set("yes", "1").ok());
  EXPECT_TRUE(store.Check({"yes"}).value());
  EXPECT_FALSE(store.Check({"yes", "nope"}).value());
  EXPECT_TRUE(store.Check({}).value());
}

// ----- Add --------------------------------------------------------------------------------------

TEST(MemoryStoreTest, AddCreatesAndStoresDecimalText) {
  MemoryStore store;
  EXPECT_EQ(store.Add("n", 5).value(), 5);
  EXPECT_EQ(store.Get("n").value(), "5");
  EXPECT_EQ(store.Add("n", -7).value(), -2);
  EXPECT_EQ(store.Get("n").value(), "-2");
  EXPECT_EQ(store.Add("n", 0).value(), -2);
  EXPECT_TRUE(store.Set("s", "40").ok());
  EXPECT_EQ(store.Add("s", 2).value(), 42);
  EXPECT_TRUE(store.Set("empty", "").ok());  // c10d treats an empty value as 0
  EXPECT_EQ(store.Add("empty", 3).value(), 3);
}

TEST(MemoryStoreTest, AddOnNonIntegerIsInvalidArgumentNamingTheKey) {
  MemoryStore store;
  for (const char* bad : {"abc", "12x", " 1", "1.5", "+-1", "99999999999999999999"}) {
    EXPECT_TRUE(store.Set("word", bad).ok());
    StatusOr<std::int64_t> added = store.Add("word", 1);
    ASSERT_TRUE(added.status().IsInvalidArgument()) << bad;
    EXPECT_NE(added.status().message().find("'word'"), std::string::npos);
    EXPECT_EQ(store.Get("word").value(), bad);  // unchanged
  }
}

TEST(MemoryStoreTest, AddOverflowIsInvalidArgument) {
  MemoryStore store;
  ASSERT_TRUE(store.Add("big", INT64_MAX).ok());
  StatusOr<std::int64_t> added = store.Add("big", 1);
  EXPECT_TRUE(added.status().IsInvalidArgument());
  EXPECT_NE(added.status().message().find("'big'"), std::string::npos);
  EXPECT_EQ(store.Get("big").value(), std::to_string(INT64_MAX));
}

TEST(MemoryStoreTest, AddReleasesWaiterOnCreation) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::promise<StatusOr<std::string>> result;
  std::thread getter([&] { result.set_value(store.Get("counter", kLong)); });
  clock.AwaitWaiters(1);
  ASSERT_TRUE(store.Add("counter", 3).ok());
  getter.join();
  EXPECT_EQ(result.get_future().get().value(), "3");
}

// ----- CompareSet -------------------------------------------------------------------------------

TEST(MemoryStoreTest, CompareSetFollowsC10dSemantics) {
  MemoryStore store;
  // Missing key, non-empty expected: returns expected, sets nothing.
  EXPECT_EQ(store.CompareSet("k", "old", "new").value(), "old");
  EXPECT_FALSE(store.Check({"k"}).value());
  // Missing key, empty expected: sets desired and returns it.
  EXPECT_EQ(store.CompareSet("k", "", "first").value(), "first");
  EXPECT_EQ(store.Get("k").value(), "first");
  // Present and equal: sets desired, returns desired.
  EXPECT_EQ(store.CompareSet("k", "first", "second").value(), "second");
  EXPECT_EQ(store.Get("k").value(), "second");
  // Present and different: returns the current value, sets nothing.
  EXPECT_EQ(store.CompareSet("k", "first", "third").value(), "second");
  EXPECT_EQ(store.Get("k").value(), "second");
  // Present with an empty value and empty expected: equal, so it sets.
  EXPECT_TRUE(store.Set("e", "").ok());
  EXPECT_EQ(store.CompareSet("e", "", "filled").value(), "filled");
  EXPECT_EQ(store.Get("e").value(), "filled");
}

TEST(MemoryStoreTest, CompareSetCreationReleasesWaiter) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::promise<Status> result;
  std::thread waiter([&] { result.set_value(store.Wait({"cas"}, kLong)); });
  clock.AwaitWaiters(1);
  EXPECT_EQ(store.CompareSet("cas", "", "v").value(), "v");
  waiter.join();
  EXPECT_TRUE(result.get_future().get().ok());
}

TEST(MemoryStoreTest, CompareSetIsAtomicUnderContention) {
  MemoryStore store;
  constexpr int kThreads = 8;
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string mine = "rank" + std::to_string(t);
      if (store.CompareSet("leader", "", mine).value() == mine) winners++;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
}

// ----- DeleteKey / NumKeys
// ------------------------------------------------------------------------

TEST(MemoryStoreTest, DeletePrefixRemovesExactlyTheKeysUnderItAndFreesTheirBytes) {
  MemoryStore store(/*capacity_bytes=*/64);
  ASSERT_TRUE(store.Set("g/1/a", "0123456789").ok());
  ASSERT_TRUE(store.Set("g/1/b", "0123456789").ok());
  ASSERT_TRUE(store.Set("g/10", "x").ok());
  ASSERT_TRUE(store.Set("h", "x").ok());
  EXPECT_EQ(store.DeletePrefix("g/1/").value(), 2);
  EXPECT_EQ(store.NumKeys().value(), 2);
  EXPECT_TRUE(store.Check({"g/10", "h"}).value());
  EXPECT_EQ(store.DeletePrefix("g/1/").value(), 0);
  EXPECT_TRUE(store.DeletePrefix("").status().IsInvalidArgument());
  // The freed bytes can be written again.
  EXPECT_TRUE(store.Set("g/2/a", std::string(40, 'z')).ok());
  PrefixStore prefixed("g", std::make_shared<MemoryStore>());
  ASSERT_TRUE(prefixed.Set("2/a", "1").ok());
  EXPECT_EQ(prefixed.DeletePrefix("2/").value(), 1);
}

TEST(MemoryStoreTest, DeleteKeyReportsWhetherItExistedAndNumKeysCounts) {
  MemoryStore store;
  EXPECT_EQ(store.NumKeys().value(), 0);
  EXPECT_TRUE(store.Set("a", "1").ok());
  EXPECT_TRUE(store.Set("b", "2").ok());
  ASSERT_TRUE(store.Add("c", 1).ok());
  EXPECT_EQ(store.NumKeys().value(), 3);
  EXPECT_TRUE(store.DeleteKey("a").value());
  EXPECT_FALSE(store.DeleteKey("a").value());
  EXPECT_FALSE(store.DeleteKey("never").value());
  EXPECT_EQ(store.NumKeys().value(), 2);
  EXPECT_FALSE(store.Check({"a"}).value());
  EXPECT_TRUE(store.Get("a", milliseconds(10)).status().IsTimeout());
}

// ----- MultiGet / MultiSet
// ------------------------------------------------------------------------

TEST(MemoryStoreTest, MultiSetThenMultiGetInOrder) {
  MemoryStore store;
  ASSERT_TRUE(store.MultiSet({"x", "y", "z"}, {"1", "2", "3"}).ok());
  StatusOr<std::vector<std::string>> values = store.MultiGet({"z", "x", "y", "x"});
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(values.value(), (std::vector<std::string>{"3", "1", "2", "1"}));
  EXPECT_TRUE(store.MultiGet({}).value().empty());
  EXPECT_TRUE(store.MultiSet({}, {}).ok());
  ASSERT_TRUE(store.MultiSet({"d", "d"}, {"first", "last"}).ok());
  EXPECT_EQ(store.Get("d").value(), "last");
}

TEST(MemoryStoreTest, MultiSetSizeMismatchIsInvalidArgumentAndSetsNothing) {
  MemoryStore store;
  Status status = store.MultiSet({"a", "b"}, {"1"});
  ASSERT_TRUE(status.IsInvalidArgument());
  EXPECT_NE(status.message().find("'a'"), std::string::npos);
  EXPECT_NE(status.message().find("2 keys but 1 values"), std::string::npos);
  EXPECT_EQ(store.NumKeys().value(), 0);
  // One bad key rejects the whole batch.
  EXPECT_TRUE(store.MultiSet({"ok", ""}, {"1", "2"}).IsInvalidArgument());
  EXPECT_EQ(store.NumKeys().value(), 0);
}

TEST(MemoryStoreTest, MultiGetWaitsForAllKeysAndTimesOut) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  EXPECT_TRUE(store.Set("have", "1").ok());
  std::future<StatusOr<std::vector<std::string>>> timing_out = std::async(std::launch::async, [&] {
    return store.MultiGet({"have", "lack"}, kShort);
  });
  clock.AwaitWaiters(1);
  clock.Advance(kShort);
  StatusOr<std::vector<std::string>> timed_out = timing_out.get();
  ASSERT_TRUE(timed_out.status().IsTimeout());
  EXPECT_NE(timed_out.status().message().find("'lack'"), std::string::npos);

  std::promise<StatusOr<std::vector<std::string>>> result;
  std::thread getter([&] { result.set_value(store.MultiGet({"have", "lack"}, kLong)); });
  clock.AwaitWaiters(1);
  EXPECT_TRUE(store.Set("lack", "2").ok());
  getter.join();
  EXPECT_EQ(result.get_future().get().value(), (std::vector<std::string>{"1", "2"}));
}

TEST(MemoryStoreTest, MultiSetIsAtomicForWaiters) {
  MemoryStore store;
  constexpr int kRounds = 200;
  const std::vector<std::string> names = {"k0", "k1", "k2", "k3"};
  std::atomic<int> partial{0};
  // A waiter woken by the first key of a batch must already see every key of it.
  std::thread waiter([&] {
    for (int r = 0; r < kRounds; ++r) {
      const std::string p = std::to_string(r) + "/";
      if (!store.Wait({p + "k0"}, kLong).ok()) partial++;
      if (!store.Check({p + "k1", p + "k2", p + "k3"}).value()) partial++;
    }
  });
  // An async waiter on the last key checks from inside the writer's wake-up.
  std::atomic<int> async_done{0};
  for (int r = 0; r < kRounds; ++r) {
    const std::string p = std::to_string(r) + "/";
    store.WaitAsync({p + "k3"}, kLong, [&, p](Status s) {
      if (!s.ok() || !store.Check({p + "k0", p + "k1", p + "k2"}).value()) partial++;
      async_done++;
    });
  }
  for (int r = 0; r < kRounds; ++r) {
    const std::string p = std::to_string(r) + "/";
    EXPECT_TRUE(
        store.MultiSet({p + "k0", p + "k1", p + "k2", p + "k3"}, {"a", "b", "c", "d"}).ok());
  }
  waiter.join();
  EXPECT_EQ(async_done.load(), kRounds);
  EXPECT_EQ(partial.load(), 0);

  // Readers never see a mix of two batches.
  std::atomic<bool> stop{false};
  std::atomic<int> mixed{0};
  std::thread reader([&] {
    while (!stop) {
      std::vector<std::string> v = store.MultiGet(names, kLong).value();
      for (const std::string& s : v) {
        if (s != v[0]) mixed++;
      }
    }
  });
  for (int i = 0; i < 2000; ++i) {
    const std::string val = std::to_string(i);
    EXPECT_TRUE(store.MultiSet(names, {val, val, val, val}).ok());
  }
  stop = true;
  reader.join();
  EXPECT_EQ(mixed.load(), 0);
}

// ----- Append -----------------------------------------------------------------------------------

TEST(MemoryStoreTest, AppendCreatesThenAppends) {
  ManualClock clock;
  MemoryStore store(MemoryStore::kDefaultCapacityBytes, clock);
  std::promise<StatusOr<std::string>> result;
  std::thread getter([&] { result.set_value(store.Get("log", kLong)); });
  clock.AwaitWaiters(1);
  ASSERT_TRUE(store.Append("log", "ab").ok());
  getter.join();
  EXPECT_EQ(result.get_future().get().value(), "ab");
  ASSERT_TRUE(store.Append("log", "cd").ok());
  ASSERT_TRUE(store.Append("log", "").ok());
  EXPECT_EQ(store.Get("log").value(), "abcd");
}

TEST(MemoryStoreTest, AppendBeyondValueLimitIsRejected) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("big", std::string(kMaxValueBytes - 1, 'x')).ok());
  ASSERT_TRUE(store.Append("big", "y").ok());
  Status status = store.Append("big", "z");
  ASSERT_TRUE(status.IsInvalidArgument());
  EXPECT_NE(status.message().find("'big'"), std::string::npos);
  EXPECT_EQ(store.Get("big").value().size(), kMaxValueBytes);
}

}  // namespace
}  // namespace collectived
