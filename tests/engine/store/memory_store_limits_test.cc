// What MemoryStore refuses: empty and overlong keys, overlong values, negative and absurd
// timeouts, and writes past the store's capacity (which change nothing).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "engine/store/memory_store.h"
#include "tests/engine/store/memory_store_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

using namespace store_testing;  // NOLINT: the helpers of these tests

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
