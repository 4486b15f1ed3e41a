// MovableStore: the store of a shrinking group that moves on to the first successor that answers
// once the store it uses is lost, and stays where it is when a failure passes.
#include "engine/store/movable_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/store/cancellable_wait.h"
#include "tests/engine/store/severable_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using store_testing::SeverableStore;

constexpr char kProbe[] = "probe";

MovableStore::Successor To(const std::string& name, std::shared_ptr<Store> store) {
  return {name, [store] { return StatusOr<std::shared_ptr<Store>>(store); }};
}

class MovableStoreTest : public ::testing::Test {
 protected:
  MovableStoreTest() {
    movable_.SetSuccessors({To("first", first_), To("second", second_), To("third", third_)});
    movable_.SetOnMoved([this](int generation, const std::string& to) {
      moves_.push_back(std::to_string(generation) + " " + to);
    });
  }

  std::shared_ptr<SeverableStore> first_ = std::make_shared<SeverableStore>();
  std::shared_ptr<SeverableStore> second_ = std::make_shared<SeverableStore>();
  std::shared_ptr<SeverableStore> third_ = std::make_shared<SeverableStore>();
  MovableStore movable_{first_, "first", kProbe};
  std::vector<std::string> moves_;
};

TEST_F(MovableStoreTest, UsesTheFirstStoreWhileItAnswers) {
  ASSERT_TRUE(movable_.Set("k", "v").ok());
  EXPECT_EQ(*first_->Get("k", milliseconds(10)), "v");
  EXPECT_EQ(movable_.generation(), 0);
  EXPECT_TRUE(moves_.empty());
}

TEST_F(MovableStoreTest, ALostStoreMovesTheCallToTheFirstSuccessorThatAnswers) {
  first_->Sever();
  second_->Sever();
  ASSERT_TRUE(movable_.Set("k", "v").ok());
  EXPECT_EQ(*third_->Get("k", milliseconds(10)), "v");
  EXPECT_EQ(movable_.generation(), 1);
  EXPECT_EQ(movable_.current_name(), "third");
  EXPECT_EQ(moves_, std::vector<std::string>{"1 third"});
  // Counters start again in the new store: what the lost one held is gone.
  EXPECT_EQ(*movable_.Add("n", 1), 1);
}

TEST_F(MovableStoreTest, AStoreThatAnswersAProbeIsNotLeft) {
  ASSERT_TRUE(movable_.Set("k", "v").ok());
  EXPECT_TRUE(movable_.MoveOn(0));  // a failure that passed: the store still answers
  EXPECT_EQ(movable_.generation(), 0);
  EXPECT_TRUE(moves_.empty());
}

TEST_F(MovableStoreTest, OnlyTheFirstOfSeveralCallsThatSawTheLossMoves) {
  first_->Sever();
  EXPECT_TRUE(movable_.MoveOn(0));
  EXPECT_TRUE(movable_.MoveOn(0));  // seen by another call: already moved
  EXPECT_EQ(movable_.generation(), 1);
  EXPECT_EQ(moves_, std::vector<std::string>{"1 second"});
}

TEST_F(MovableStoreTest, WithNoSuccessorLeftTheCallFailsWithTheLostStoresError) {
  first_->Sever();
  second_->Sever();
  third_->Sever();
  Status set = movable_.Set("k", "v");
  EXPECT_EQ(set.kind(), ErrorKind::kUnavailable) << set.ToString();
  EXPECT_EQ(movable_.generation(), 0);
}

TEST_F(MovableStoreTest, APendingWaitEndsUnavailableAndIsNotMovedWithTheStore) {
  std::atomic<int> outcome{-1};
  movable_.WaitAsync({"k"}, kNoTimeout,
                     [&](Status status) { outcome = static_cast<int>(status.kind()); });
  first_->Sever();
  EXPECT_EQ(outcome.load(), static_cast<int>(ErrorKind::kUnavailable));
  // Its owner arms it again once the store moved.
  ASSERT_TRUE(movable_.MoveOn(0));
  std::atomic<bool> found{false};
  movable_.WaitAsync({"k"}, kNoTimeout, [&](Status status) { found = status.ok(); });
  ASSERT_TRUE(second_->Set("k", "v").ok());
  EXPECT_TRUE(found.load());
}

// A join's wait (WaitUnlessCancelled) arms itself again once a call moved the store: a
// replacement whose first store is gone waits where the survivors moved the group.
TEST_F(MovableStoreTest, ACancellableWaitFollowsTheStoreWhereItMoved) {
  CancelToken never;
  first_->Sever();
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE(second_->Set("k", "v").ok());
  });
  EXPECT_TRUE(WaitUnlessCancelled(movable_, {"k"}, milliseconds(5000), &never, Clock::Real()).ok());
  writer.join();
  EXPECT_EQ(movable_.current_name(), "second");
  // With nowhere to move, it ends with the lost store's error.
  second_->Sever();
  third_->Sever();
  EXPECT_EQ(WaitUnlessCancelled(movable_, {"j"}, milliseconds(5000), &never, Clock::Real()).kind(),
            ErrorKind::kUnavailable);
}

TEST_F(MovableStoreTest, CancellingAWaitCancelsItInTheStoreThatHoldsIt) {
  std::atomic<int> outcome{-1};
  const WaitId id = movable_.WaitAsync(
      {"k"}, kNoTimeout, [&](Status status) { outcome = static_cast<int>(status.kind()); });
  ASSERT_NE(id, kInvalidWaitId);
  EXPECT_TRUE(movable_.CancelWait(id));
  EXPECT_EQ(outcome.load(), static_cast<int>(ErrorKind::kAborted));
  EXPECT_FALSE(movable_.CancelWait(id));
}

}  // namespace
}  // namespace collectived
