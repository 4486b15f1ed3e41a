#include "engine/store/store_barrier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/store/memory_store.h"
#include "engine/store/prefix_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{std::chrono::seconds(20)};
constexpr char kTimedOut[] = "Timed out initializing process group in store based barrier";

// Runs the barrier on one thread per rank in `ranks` and returns each rank's status (indexed by
// rank; ranks that do not take part stay OK). With `clock` (the store's manual clock), once
// every rank waits, moves time to a millisecond before `timeout`, checks that every rank still
// waits, then moves it to `timeout`.
std::vector<Status> RunBarrier(Store& store, int world_size, const std::vector<int>& ranks,
                               const std::string& name, milliseconds timeout,
                               ManualClock* clock = nullptr) {
  std::vector<Status> results(world_size);
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back(
        [&, rank] { results[rank] = StoreBasedBarrier(store, rank, world_size, name, timeout); });
  }
  if (clock != nullptr) {
    clock->AwaitWaiters(ranks.size());
    clock->Advance(timeout - milliseconds(1));
    clock->AwaitWaiters(ranks.size());
    clock->Advance(milliseconds(1));
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(StoreBarrierTest, AllRanksPass) {
  MemoryStore store;
  std::vector<Status> results = RunBarrier(store, 4, {0, 1, 2, 3}, "all", kLong);
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank].ToString();
}

TEST(StoreBarrierTest, WorldSizeOnePassesAlone) {
  MemoryStore store;
  EXPECT_TRUE(StoreBasedBarrier(store, 0, 1, "solo", milliseconds(100)).ok());
}

// PyTorch's TimeoutTest.test_store_based_barrier: world size 4, the last rank never arrives;
// every present rank fails with the c10d message. Run on the in-memory store (c10d's "hash")
// and on a PrefixStore view of one, as process groups use it.
TEST(StoreBarrierTest, MissingLastRankMakesEveryPresentRankTimeOut) {
  ManualClock clock;
  auto memory = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  auto prefixed = std::make_shared<PrefixStore>("default_pg", memory);
  for (Store* store : std::vector<Store*>{memory.get(), prefixed.get()}) {
    const milliseconds timeout(1000);
    std::vector<Status> results = RunBarrier(*store, 4, {0, 1, 2}, "_", timeout, &clock);
    for (int rank = 0; rank < 3; ++rank) {
      const Status& status = results[rank];
      ASSERT_TRUE(status.IsTimeout()) << status.ToString();
      EXPECT_NE(status.message().find(kTimedOut), std::string::npos) << status.message();
      EXPECT_EQ(status.message(), std::string(kTimedOut) + " on rank " + std::to_string(rank) +
                                      " for key '_' (world_size=4, arrived=3, missing ranks: [3], "
                                      "timeout=1000 ms)");
    }
  }
}

TEST(StoreBarrierTest, NamesEveryMissingRank) {
  MemoryStore store;
  std::vector<Status> results = RunBarrier(store, 5, {0, 2}, "sparse", milliseconds(200));
  for (int rank : {0, 2}) {
    ASSERT_TRUE(results[rank].IsTimeout());
    EXPECT_NE(results[rank].message().find("arrived=2, missing ranks: [1, 3, 4]"),
              std::string::npos)
        << results[rank].message();
    EXPECT_NE(results[rank].message().find("on rank " + std::to_string(rank)), std::string::npos);
  }
}

TEST(StoreBarrierTest, ReusableWithDifferentNames) {
  auto memory = std::make_shared<MemoryStore>();
  PrefixStore group("g", memory);
  for (int round = 0; round < 5; ++round) {
    const std::string name = "barrier" + std::to_string(round);
    std::vector<Status> results = RunBarrier(group, 3, {0, 1, 2}, name, kLong);
    for (const Status& status : results) EXPECT_TRUE(status.ok()) << status.ToString();
  }
  // The same names on another prefix are independent barriers.
  PrefixStore other("h", memory);
  std::vector<Status> results = RunBarrier(other, 2, {0, 1}, "barrier0", kLong);
  for (const Status& status : results) EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(StoreBarrierTest, LateRankReleasesTheOthers) {
  MemoryStore store;
  std::vector<Status> results(3);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back(
        [&, rank] { results[rank] = StoreBasedBarrier(store, rank, 3, "late", kLong); });
  }
  std::this_thread::sleep_for(milliseconds(100));
  results[2] = StoreBasedBarrier(store, 2, 3, "late", kLong);
  for (std::thread& t : threads) t.join();
  for (const Status& status : results) EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(StoreBarrierTest, ReusingACompletedNameIsInvalid) {
  MemoryStore store;
  ASSERT_TRUE(StoreBasedBarrier(store, 0, 1, "once", kLong).ok());
  Status again = StoreBasedBarrier(store, 0, 1, "once", kLong);
  EXPECT_TRUE(again.IsInvalidArgument());
  EXPECT_NE(again.message().find("'once'"), std::string::npos);
}

TEST(StoreBarrierTest, ValidatesArguments) {
  MemoryStore store;
  EXPECT_TRUE(StoreBasedBarrier(store, 0, 0, "b", kLong).IsInvalidArgument());
  EXPECT_TRUE(StoreBasedBarrier(store, -1, 4, "b", kLong).IsInvalidArgument());
  Status out_of_range = StoreBasedBarrier(store, 4, 4, "b", kLong);
  EXPECT_TRUE(out_of_range.IsInvalidArgument());
  EXPECT_NE(out_of_range.message().find("rank 4 is out of range [0, 4)"), std::string::npos);
  EXPECT_TRUE(StoreBasedBarrier(store, 0, 4, "", kLong).IsInvalidArgument());
  EXPECT_TRUE(StoreBasedBarrier(store, 0, 4, "b", milliseconds(-1)).IsInvalidArgument());
  EXPECT_TRUE(
      StoreBasedBarrier(store, 0, 4, "b", kMaxStoreTimeout + milliseconds(1)).IsInvalidArgument());
  EXPECT_EQ(store.NumKeys().value(), 0);  // nothing was written
}

}  // namespace
}  // namespace collectived
