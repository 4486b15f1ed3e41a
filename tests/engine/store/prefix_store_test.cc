#include "engine/store/prefix_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/store/memory_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kShort{100};
constexpr milliseconds kLong{std::chrono::seconds(20)};

TEST(PrefixStoreTest, KeysLiveUnderPrefixSlashKeyInTheInnerStore) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("group0", inner);
  EXPECT_EQ(store.prefix(), "group0");
  EXPECT_EQ(store.inner(), inner);
  EXPECT_TRUE(store.Set("rank0", "addr").ok());
  EXPECT_EQ(inner->Get("group0/rank0", kShort).value(), "addr");
  EXPECT_FALSE(inner->Check({"rank0"}).value());
  EXPECT_TRUE(inner->Set("group0/from-inner", "x").ok());
  EXPECT_EQ(store.Get("from-inner", kShort).value(), "x");
}

TEST(PrefixStoreTest, PrefixesIsolateTheSameKey) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore a("a", inner);
  PrefixStore b("b", inner);
  EXPECT_TRUE(a.Set("k", "from-a").ok());
  EXPECT_TRUE(b.Set("k", "from-b").ok());
  EXPECT_EQ(a.Get("k", kShort).value(), "from-a");
  EXPECT_EQ(b.Get("k", kShort).value(), "from-b");
  EXPECT_EQ(a.Add("n", 1).value(), 1);
  EXPECT_EQ(b.Add("n", 10).value(), 10);
  EXPECT_TRUE(a.DeleteKey("k").value());
  EXPECT_FALSE(a.Check({"k"}).value());
  EXPECT_TRUE(b.Check({"k"}).value());
  // A key that only exists under another prefix times out.
  EXPECT_TRUE(a.Set("only-a", "1").ok());
  EXPECT_TRUE(b.Get("only-a", kShort).status().IsTimeout());
}

TEST(PrefixStoreTest, NestedPrefixesJoinWithSlashes) {
  auto inner = std::make_shared<MemoryStore>();
  auto outer = std::make_shared<PrefixStore>("a", inner);
  PrefixStore nested("b", outer);
  EXPECT_TRUE(nested.Set("k", "v").ok());
  EXPECT_EQ(inner->Get("a/b/k", kShort).value(), "v");
  EXPECT_EQ(outer->Get("b/k", kShort).value(), "v");
  EXPECT_EQ(nested.Get("k", kShort).value(), "v");
  PrefixStore sibling("c", outer);
  EXPECT_FALSE(sibling.Check({"k"}).value());
}

TEST(PrefixStoreTest, EveryOperationForwardsWithThePrefix) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("p", inner);
  EXPECT_EQ(store.Add("count", 2).value(), 2);
  EXPECT_EQ(inner->Get("p/count").value(), "2");
  EXPECT_EQ(store.CompareSet("cas", "", "one").value(), "one");
  EXPECT_EQ(store.CompareSet("cas", "x", "two").value(), "one");
  EXPECT_EQ(store.CompareSet("missing", "x", "two").value(), "x");
  EXPECT_EQ(inner->Get("p/cas").value(), "one");
  EXPECT_TRUE(store.MultiSet({"m1", "m2"}, {"1", "2"}).ok());
  EXPECT_EQ(inner->MultiGet({"p/m1", "p/m2"}).value(), (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(store.MultiGet({"m2", "m1"}, kShort).value(), (std::vector<std::string>{"2", "1"}));
  EXPECT_TRUE(store.Append("log", "ab").ok());
  EXPECT_TRUE(store.Append("log", "cd").ok());
  EXPECT_EQ(inner->Get("p/log").value(), "abcd");
  EXPECT_TRUE(store.Wait({"m1", "log"}, kShort).ok());
  EXPECT_TRUE(store.Check({"m1", "m2", "cas"}).value());
  EXPECT_TRUE(store.DeleteKey("m1").value());
  EXPECT_FALSE(inner->Check({"p/m1"}).value());
  EXPECT_FALSE(store.DeleteKey("m1").value());
}

TEST(PrefixStoreTest, NumKeysCountsTheWholeInnerStoreLikeC10d) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore a("a", inner);
  PrefixStore b("b", inner);
  EXPECT_TRUE(a.Set("k", "1").ok());
  EXPECT_TRUE(b.Set("k", "1").ok());
  EXPECT_TRUE(inner->Set("unprefixed", "1").ok());
  EXPECT_EQ(a.NumKeys().value(), 3);
  EXPECT_EQ(b.NumKeys().value(), 3);
}

TEST(PrefixStoreTest, TimeoutMessageNamesThePrefixedKey) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("grp", inner);
  StatusOr<std::string> got = store.Get("foo", kShort);
  ASSERT_TRUE(got.status().IsTimeout());
  EXPECT_EQ(got.status().message(),
            "Timeout after 100 ms waiting for key 'grp/foo' in store (1 of 1 keys missing)");
}

TEST(PrefixStoreTest, DefaultTimeoutIsItsOwn) {
  auto inner = std::make_shared<MemoryStore>();
  ASSERT_TRUE(inner->SetDefaultTimeout(milliseconds(5000)).ok());
  PrefixStore store("p", inner);
  EXPECT_EQ(store.default_timeout(), milliseconds(5000));  // copied at construction
  ASSERT_TRUE(store.SetDefaultTimeout(kShort).ok());
  EXPECT_EQ(inner->default_timeout(), milliseconds(5000));  // unchanged
  const auto start = std::chrono::steady_clock::now();
  Status waited = store.Wait({"absent"});
  EXPECT_TRUE(waited.IsTimeout());
  EXPECT_NE(waited.message().find("after 100 ms"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(PrefixStoreTest, ValidationHappensOnTheCallersKeyAndOnThePrefixedKey) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("p", inner);
  // The empty key is rejected before it becomes "p/".
  Status empty = store.Set("", "v");
  EXPECT_TRUE(empty.IsInvalidArgument());
  EXPECT_NE(empty.message().find("''"), std::string::npos);
  EXPECT_EQ(inner->NumKeys().value(), 0);
  // A key that fits alone but not with its prefix is rejected by the inner store.
  Status too_long = store.Set(std::string(kMaxKeyBytes, 'k'), "v");
  EXPECT_TRUE(too_long.IsInvalidArgument());
  EXPECT_NE(too_long.message().find("'p/kkk"), std::string::npos);
  EXPECT_TRUE(store.Set(std::string(kMaxKeyBytes - 2, 'k'), "v").ok());
  EXPECT_TRUE(store.Wait({"k"}, milliseconds(-5)).IsInvalidArgument());
  EXPECT_TRUE(store.MultiSet({"a"}, {}).IsInvalidArgument());
}

TEST(PrefixStoreTest, WaiterThroughPrefixIsReleasedByAWriterOnTheInnerStore) {
  auto inner = std::make_shared<MemoryStore>();
  auto outer = std::make_shared<PrefixStore>("a", inner);
  PrefixStore nested("b", outer);
  std::promise<StatusOr<std::string>> result;
  std::thread getter([&] { result.set_value(nested.Get("late", kLong)); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(inner->Set("a/b/late", "v").ok());
  getter.join();
  EXPECT_EQ(result.get_future().get().value(), "v");
}

TEST(PrefixStoreTest, WaitAsyncAndCancelForwardToTheInnerStore) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore store("p", inner);

  std::promise<Status> completed;
  WaitId id = store.WaitAsync({"k"}, kLong, [&](Status s) { completed.set_value(s); });
  ASSERT_NE(id, kInvalidWaitId);
  EXPECT_TRUE(inner->Set("p/k", "1").ok());
  EXPECT_TRUE(completed.get_future().get().ok());

  std::promise<Status> cancelled;
  id = store.WaitAsync({"other"}, kLong, [&](Status s) { cancelled.set_value(s); });
  ASSERT_NE(id, kInvalidWaitId);
  EXPECT_TRUE(store.CancelWait(id));
  EXPECT_EQ(cancelled.get_future().get().kind(), ErrorKind::kAborted);

  std::promise<Status> timed_out;
  store.WaitAsync({"never"}, kShort, [&](Status s) { timed_out.set_value(s); });
  Status status = timed_out.get_future().get();
  EXPECT_TRUE(status.IsTimeout());
  EXPECT_NE(status.message().find("'p/never'"), std::string::npos);

  std::promise<Status> inline_done;
  EXPECT_EQ(store.WaitAsync({"k"}, kShort, [&](Status s) { inline_done.set_value(s); }),
            kInvalidWaitId);
  EXPECT_TRUE(inline_done.get_future().get().ok());
}

}  // namespace
}  // namespace collectived
