// StreamSignalWords, the client's half of stream signals: a block of words per group, values in
// issue order, a word reused only after its previous op succeeded, every completion setting its
// word (so no stream waits forever on a failed op), a failed group taking no more words, and
// blocks returned once their group is forgotten with nothing in flight, their words never moved
// back.
#include "clients/cpp/stream_signal_words.h"

#include <gtest/gtest.h>

#include <vector>

namespace collectived {
namespace {

constexpr size_t kPerGroup = StreamSignalWords::kWordsPerGroup;

class StreamSignalWordsTest : public ::testing::Test {
 protected:
  std::vector<uint32_t> memory_ = std::vector<uint32_t>(3 * kPerGroup);
  StreamSignalWords words_{memory_.data(), memory_.size()};
};

TEST_F(StreamSignalWordsTest, EachGroupHasABlockAndItsOpsTakeValuesInIssueOrder) {
  auto a1 = words_.Assign("a");
  auto b1 = words_.Assign("b");
  auto a2 = words_.Assign("a");
  ASSERT_TRUE(a1 && b1 && a2);
  EXPECT_EQ(a1->value, 1u);
  EXPECT_EQ(a1->offset, 4u);
  EXPECT_EQ(a1->word, &memory_[1]);
  EXPECT_EQ(a2->value, 2u);
  EXPECT_EQ(a2->word, &memory_[2]);
  EXPECT_EQ(b1->value, 1u);
  EXPECT_EQ(b1->offset, (kPerGroup + 1) * 4);
  EXPECT_EQ(words_.free_blocks(), 1u);
  EXPECT_EQ(memory_[1], 0u) << "the sidecar writes it, or the completion";
  words_.Completed(*a1, /*succeeded=*/true);
  EXPECT_EQ(memory_[1], 1u);
}

TEST_F(StreamSignalWordsTest, AWordIsReusedOnlyOnceItsPreviousOpCompleted) {
  std::vector<StreamSignalWords::Assigned> out;
  for (size_t i = 0; i < kPerGroup; ++i) {
    auto assigned = words_.Assign("g");
    ASSERT_TRUE(assigned) << i;
    out.push_back(*assigned);
  }
  EXPECT_EQ(out.back().value, kPerGroup);
  EXPECT_EQ(out.back().word, &memory_[0]) << "value 256 takes word 0";
  EXPECT_FALSE(words_.Assign("g")) << "word 1 still belongs to op 1";
  words_.Completed(out[0], true);
  auto next = words_.Assign("g");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->value, kPerGroup + 1);
  EXPECT_EQ(next->word, &memory_[1]);
  EXPECT_EQ(memory_[1], 1u) << "the old value: the new op's waiter waits for 257";
}

TEST_F(StreamSignalWordsTest, AFailedOpSetsItsWordAndItsGroupTakesNoMoreWords) {
  auto first = words_.Assign("g");
  auto second = words_.Assign("g");
  ASSERT_TRUE(first && second);
  words_.Completed(*second, /*succeeded=*/false);
  EXPECT_EQ(memory_[2], 2u) << "a stream waiting on the failed op goes on";
  EXPECT_FALSE(words_.Assign("g"));
  EXPECT_TRUE(words_.Assign("other")) << "other groups are not affected";
  words_.Completed(*first, true);
  words_.Forget("g");
  EXPECT_EQ(words_.free_blocks(), 1u) << "a failed group's block never returns";
  auto again = words_.Assign("g");
  ASSERT_TRUE(again) << "a group created again under the name gets a fresh block";
  EXPECT_EQ(again->value, 1u);
  EXPECT_EQ(words_.free_blocks(), 0u);
  EXPECT_FALSE(words_.Assign("fourth")) << "every block is taken";
}

TEST_F(StreamSignalWordsTest, AForgottenGroupsBlockReturnsOnceItsLastOpCompletedAndGoesOn) {
  std::vector<StreamSignalWords::Assigned> ops;
  for (int i = 0; i < 3; ++i) ops.push_back(*words_.Assign("g"));
  words_.Forget("g");
  EXPECT_EQ(words_.free_blocks(), 2u) << "ops are in flight";
  for (const auto& op : ops) words_.Completed(op, true);
  EXPECT_EQ(words_.free_blocks(), 3u);
  // Not cleared: a stream may still reach a queued wait for value 3 on word 3.
  EXPECT_EQ(memory_[3], 3u);
  auto next = words_.Assign("h");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->value, 4u) << "the block's next group goes on from its values";
  EXPECT_EQ(next->word, &memory_[4]);
  words_.Disable();
  EXPECT_FALSE(words_.Assign("h"));
}

}  // namespace
}  // namespace collectived
