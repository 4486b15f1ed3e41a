#include "engine/store/memory_store.h"

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
#include "engine/store/prefix_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kShort{100};                      // timeouts that are expected to expire
constexpr milliseconds kLong{std::chrono::seconds(20)};  // timeouts that must not expire

milliseconds Since(Clock::TimePoint start) {
  return std::chrono::duration_cast<milliseconds>(Clock::Real().Now() - start);
}

// A WaitAsync callback that records its single status.
struct AsyncResult {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  std::atomic<int> calls{0};

  WaitCallback Callback() {
    return [this](Status s) {
      if (calls.fetch_add(1) == 0) promise.set_value(std::move(s));
    };
  }
  bool Ready(milliseconds within = milliseconds(0)) {
    return future.wait_for(within) == std::future_status::ready;
  }
};

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
  std::future<StatusOr<std::vector<std::string>>> timing_out = std::async(
      std::launch::async, [&] { return store.MultiGet({"have", "lack"}, kShort); });
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

// ----- Validation -------------------------------------------------------------------------------

void ExpectInvalid(const Status& status, const std::string& names) {
  EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  EXPECT_NE(status.message().find(names), std::string::npos) << status.message();
}

TEST(MemoryStoreTest, EmptyKeyIsRejectedByEveryOperation) {
  MemoryStore store;
  const std::string empty;
  ExpectInvalid(store.Set(empty, "v"), "''");
  ExpectInvalid(store.Get(empty).status(), "''");
  ExpectInvalid(store.Add(empty, 1).status(), "''");
  ExpectInvalid(store.CompareSet(empty, "", "v").status(), "''");
  ExpectInvalid(store.Wait({"ok", empty}), "''");
  ExpectInvalid(store.Check({empty}).status(), "''");
  ExpectInvalid(store.DeleteKey(empty).status(), "''");
  ExpectInvalid(store.MultiGet({empty}).status(), "''");
  ExpectInvalid(store.MultiSet({empty}, {"v"}), "''");
  ExpectInvalid(store.Append(empty, "v"), "''");
  AsyncResult async;
  EXPECT_EQ(store.WaitAsync({empty}, kShort, async.Callback()), kInvalidWaitId);
  ASSERT_TRUE(async.Ready());
  ExpectInvalid(async.future.get(), "''");
  EXPECT_EQ(store.NumKeys().value(), 0);
}

TEST(MemoryStoreTest, KeyLengthLimit) {
  MemoryStore store;
  const std::string longest(kMaxKeyBytes, 'k');
  const std::string too_long = "toolong" + std::string(kMaxKeyBytes, 'k');
  EXPECT_TRUE(store.Set(longest, "v").ok());
  EXPECT_EQ(store.Get(longest).value(), "v");
  ExpectInvalid(store.Set(too_long, "v"), "'toolong");
  ExpectInvalid(store.Get(too_long).status(), "'toolong");
  ExpectInvalid(store.Add(too_long, 1).status(), "'toolong");
  ExpectInvalid(store.Wait({too_long}), "'toolong");
  ExpectInvalid(store.Append(too_long, "v"), "'toolong");
  // Long keys are shortened in messages.
  EXPECT_LT(store.Set(too_long, "v").message().size(), 400u);
}

TEST(MemoryStoreTest, ValueLengthLimit) {
  MemoryStore store;
  EXPECT_TRUE(store.Set("max", std::string(kMaxValueBytes, 'v')).ok());
  const std::string too_big(kMaxValueBytes + 1, 'v');
  ExpectInvalid(store.Set("big", too_big), "'big'");
  ExpectInvalid(store.CompareSet("big", "", too_big).status(), "'big'");
  ExpectInvalid(store.CompareSet("big", too_big, "").status(), "'big'");
  ExpectInvalid(store.MultiSet({"a", "big"}, {"1", too_big}), "'big'");
  ExpectInvalid(store.Append("big", too_big), "'big'");
  EXPECT_FALSE(store.Check({"big"}).value());
  EXPECT_FALSE(store.Check({"a"}).value());
}

TEST(MemoryStoreTest, NegativeAndAbsurdTimeoutsAreRejected) {
  MemoryStore store;
  const milliseconds negative(-1);
  const milliseconds absurd = kMaxStoreTimeout + milliseconds(1);
  for (milliseconds bad : {negative, absurd}) {
    ExpectInvalid(store.Get("tk", bad).status(), "'tk'");
    ExpectInvalid(store.Wait({"tk"}, bad), "'tk'");
    ExpectInvalid(store.MultiGet({"tk"}, bad).status(), "'tk'");
    AsyncResult async;
    EXPECT_EQ(store.WaitAsync({"tk"}, bad, async.Callback()), kInvalidWaitId);
    ASSERT_TRUE(async.Ready());
    ExpectInvalid(async.future.get(), "'tk'");
  }
  EXPECT_NE(store.Wait({"tk"}, absurd).message().find("absurd"), std::string::npos);
  EXPECT_NE(store.Wait({"tk"}, negative).message().find("negative"), std::string::npos);
}

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

namespace collectived {
namespace {

// The store's capacity bounds what clients can make the sidecar hold; a refused write changes
// nothing, and freed bytes (overwrites, deletes) can be used again.
TEST(MemoryStoreCapacityTest, WritesPastTheCapacityAreRefusedAndChangeNothing) {
  MemoryStore store(/*capacity_bytes=*/100);
  ASSERT_TRUE(store.Set("a", std::string(49, 'x')).ok());  // 50 bytes with its key
  Status refused = store.Set("b", std::string(50, 'y'));   // 51 more
  EXPECT_EQ(refused.kind(), ErrorKind::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("would pass its capacity of 100 bytes"), std::string::npos)
      << refused.message();
  EXPECT_FALSE(*store.Check({"b"}));
  EXPECT_EQ(store.Append("a", std::string(51, 'z')).kind(), ErrorKind::kResourceExhausted);
  EXPECT_EQ(store.Get("a")->size(), 49u);
  EXPECT_EQ(store.MultiSet({"c", "d"}, {std::string(30, 'c'), std::string(30, 'd')}).kind(),
            ErrorKind::kResourceExhausted);
  EXPECT_FALSE(*store.Check({"c"}));
  EXPECT_FALSE(*store.Check({"d"}));
  EXPECT_EQ(store.CompareSet("e", "", std::string(60, 'e')).status().kind(),
            ErrorKind::kResourceExhausted);
  ASSERT_TRUE(store.Set("b", std::string(49, 'y')).ok());  // exactly full
  EXPECT_EQ(store.Add("n", 1).status().kind(), ErrorKind::kResourceExhausted);
  ASSERT_TRUE(store.Set("a", "").ok());  // an overwrite frees 49 bytes
  EXPECT_TRUE(store.Add("n", 1).ok());
  ASSERT_TRUE(*store.DeleteKey("b"));  // a delete frees the rest
  EXPECT_TRUE(store.MultiSet({"c", "c"}, {std::string(90, 'c'), "small"}).ok())
      << "a key repeated in a batch counts with its last value";
}

}  // namespace
}  // namespace collectived
