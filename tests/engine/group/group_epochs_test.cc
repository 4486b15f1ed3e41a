// A shrinking group's epochs (docs/fault-tolerance.md): what an op becomes in an epoch that lost
// ranks (EpochView), and, through GroupRegistry over the in-process fabric, a lost rank's cut,
// the next epoch among the live ranks and the ops that cross it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/rendezvous/epoch_view.h"
#include "tests/engine/group/group_cluster.h"
#include "tests/engine/group/registry_cluster.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

using namespace group_testing;  // NOLINT: the helpers of this suite

// Group "g" of 4 ranks in epoch 1, rank 2 lost: ranks 0, 1, 3 are the epoch's 0, 1, 2.
EpochView RankTwoLost() {
  return EpochView{"g", 1, {0, 1, -1, 2}};
}

OpRequest Rooted(OpKind kind, int root) {
  OpRequest request;
  request.kind = kind;
  request.root = root;
  request.inputs = {Tensor<float>({1})};
  return request;
}

TEST(EpochViewTest, SumsAreRescaledToTheGroupSizeAndTheOtherReductionsAreNot) {
  const EpochView view = RankTwoLost();
  OpRequest sum = AllReduce(Tensor<float>({1}));
  ASSERT_TRUE(TranslateForEpoch(sum, 0, view).ok());
  EXPECT_EQ(sum.reduce_op, ReduceOp::PremulSum(4.0 / 3.0));
  OpRequest integers = AllReduce(Tensor<int64_t>({1}));
  ASSERT_TRUE(TranslateForEpoch(integers, 0, view).ok());
  EXPECT_EQ(integers.reduce_op, ReduceOp::Sum());
  OpRequest premul = AllReduce(Tensor<float>({1}), ReduceOp::PremulSum(0.5));
  ASSERT_TRUE(TranslateForEpoch(premul, 0, view).ok());
  EXPECT_EQ(premul.reduce_op, ReduceOp::PremulSum(0.5 * 4.0 / 3.0));
  for (ReduceOp op : {ReduceOp::Avg(), ReduceOp::Max(), ReduceOp::Product()}) {
    OpRequest other = AllReduce(Tensor<float>({1}), op);
    ASSERT_TRUE(TranslateForEpoch(other, 0, view).ok());
    EXPECT_EQ(other.reduce_op, op);
  }
  // An epoch that lost nothing changes nothing.
  OpRequest whole = AllReduce(Tensor<float>({1}));
  ASSERT_TRUE(TranslateForEpoch(whole, 0, EpochView{"g", 0, {0, 1, 2, 3}}).ok());
  EXPECT_EQ(whole.reduce_op, ReduceOp::Sum());
}

TEST(EpochViewTest, RootsAndPeersAreRenumberedAndALostOneFailsTheOpNamingIt) {
  const EpochView view = RankTwoLost();
  OpRequest broadcast = Rooted(OpKind::kBroadcast, 3);
  ASSERT_TRUE(TranslateForEpoch(broadcast, 0, view).ok());
  EXPECT_EQ(broadcast.root, 2);
  OpRequest from_lost = Rooted(OpKind::kReduce, 2);
  Status lost = TranslateForEpoch(from_lost, 0, view);
  EXPECT_TRUE(lost.kind() == ErrorKind::kPeerLost);
  EXPECT_THAT(lost.message(), HasSubstr("its root, group rank 2, was lost"));

  OpRequest send = PointToPointOp(OpKind::kSend, Tensor<float>({1}), 3, 0);
  ASSERT_TRUE(TranslateForEpoch(send, 0, view).ok());
  EXPECT_EQ(send.peer, 2);
  OpRequest to_lost = PointToPointOp(OpKind::kSend, Tensor<float>({1}), 2, 0);
  EXPECT_THAT(TranslateForEpoch(to_lost, 0, view).message(),
              HasSubstr("its peer, group rank 2, was lost"));
  OpRequest any = PointToPointOp(OpKind::kRecv, Tensor<float>({1}), kAnySource, 0);
  EXPECT_TRUE(TranslateForEpoch(any, 0, view).IsInvalidArgument());
}

TEST(EpochViewTest, OpsWithASlotOfEveryRankFailNamingTheLostRanks) {
  OpRequest allgather;
  allgather.kind = OpKind::kAllGather;
  allgather.inputs = {Tensor<float>({1})};
  for (int r = 0; r < 4; ++r) allgather.outputs.push_back(Tensor<float>({0}));
  Status lost = TranslateForEpoch(allgather, 1, RankTwoLost());
  EXPECT_TRUE(lost.kind() == ErrorKind::kPeerLost);
  EXPECT_THAT(lost.message(), HasSubstr("allgather of group rank 1 on group 'g' (epoch 1)"));
  EXPECT_THAT(lost.message(), HasSubstr("group ranks 2 were lost"));
}

TEST(EpochViewTest, AnOpTakenBackIsTranslatedAgainForTheNextEpoch) {
  const EpochView from = RankTwoLost();
  const EpochView to{"g", 2, {0, -1, -1, 1}};  // rank 1 lost too
  OpRequest sum = AllReduce(Tensor<float>({1}));
  ASSERT_TRUE(TranslateForEpoch(sum, 0, from).ok());
  ASSERT_TRUE(RetranslateForEpoch(sum, 0, from, to).ok());
  EXPECT_DOUBLE_EQ(sum.reduce_op.scale, 2.0);  // 4 ranks / 2 live
  OpRequest broadcast = Rooted(OpKind::kBroadcast, 3);
  ASSERT_TRUE(TranslateForEpoch(broadcast, 0, from).ok());
  ASSERT_TRUE(RetranslateForEpoch(broadcast, 0, from, to).ok());
  EXPECT_EQ(broadcast.root, 1);
  OpRequest from_one = Rooted(OpKind::kBroadcast, 1);
  ASSERT_TRUE(TranslateForEpoch(from_one, 0, from).ok());
  EXPECT_TRUE(RetranslateForEpoch(from_one, 0, from, to).kind() == ErrorKind::kPeerLost);
}

// --- through the registry ---

constexpr milliseconds kJoin{10000};

FaultTolerance Shrink(int min_ranks = 1) {
  return FaultTolerance{FaultToleranceMode::kShrink, min_ranks};
}

const char* SidecarOf(int rank) {
  return rank < 2 ? "a" : "b";
}

constexpr Device kGpu{DeviceKind::kCuda, 0};

// Ranks 0, 1 on sidecar "a", 2, 3 on "b", in one shrinking group "g" that ran one allreduce.
class ShrinkingGroupTest : public ::testing::Test {
 protected:
  void Form(FaultTolerance tolerance = Shrink(), DeviceKind device = DeviceKind::kCpu) {
    device_ = device == DeviceKind::kCuda ? kGpu : Device{};
    ForEachRank(4, [&](int r) {
      StatusOr<Membership> membership = cluster_.Join("g", r, kJoin, tolerance, device);
      ASSERT_TRUE(membership.ok()) << membership.status().ToString();
    });
    ForEachRank(4, [&](int r) {
      TensorView t = Tensor<float>({1}, device_);
      ASSERT_TRUE(WaitFor(Submit(r, AllReduce(t))).ok());
      EXPECT_EQ(Values<float>(t), std::vector<float>{4});
    });
  }
  std::shared_ptr<Work> Submit(int rank, OpRequest request) {
    return cluster_.registry(SidecarOf(rank)).Submit("g", rank, std::move(request));
  }
  void Lose(int rank) {
    GroupRegistry& registry = cluster_.registry(SidecarOf(rank));
    ASSERT_TRUE(registry
                    .LoseRank("g", rank,
                              Status::PeerLost("rank " + std::to_string(rank) +
                                               " was lost: its session ended"))
                    .ok());
    ASSERT_TRUE(registry.Leave("g", rank).ok());
  }
  // Every survivor's allreduce of `value` (float); their results.
  std::vector<float> AllReduceOn(const std::vector<int>& ranks, float value) {
    std::vector<float> got(ranks.size(), -1);
    ForEachRank(static_cast<int>(ranks.size()), [&](int i) {
      TensorView t = Tensor<float>({value}, device_);
      Status done = WaitFor(Submit(ranks[i], AllReduce(t)));
      ASSERT_TRUE(done.ok()) << done.ToString();
      got[i] = Values<float>(t)[0];
    });
    return got;
  }
  // The epoch and lost ranks of the group on sidecar `id` once it is past epoch `after`.
  std::pair<int, std::vector<int>> EpochOn(const std::string& id, int after = 0) {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
    std::shared_ptr<Group> group = cluster_.registry(id).Find("g");
    while (group && group->spec().epoch <= after && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));
      group = cluster_.registry(id).Find("g");
    }
    if (!group) return {-1, {}};
    return {group->spec().epoch, group->spec().LostGroupRanks()};
  }

  RegistryCluster cluster_{{"a", "a", "b", "b"}};
  Device device_;
};

TEST_F(ShrinkingGroupTest, SurvivorsGoOnInTheNextEpochWithTheSumRescaled) {
  Form();
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(EpochOn(id), (std::pair<int, std::vector<int>>{1, {3}})) << id;
    // The group's own numbering: rank 3's sidecar still hosts rank 2 (rank 2 of 3 in the epoch).
    EXPECT_EQ(cluster_.registry(id).Find("g")->spec().GroupSize(), 4);
  }
  EXPECT_EQ(cluster_.registry("b").SequenceNumber("g", 2), 2u);
}

TEST_F(ShrinkingGroupTest, AnOpWaitingForTheLostRankCompletesAmongTheSurvivors) {
  Form();
  std::vector<TensorView> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int r : {0, 1, 2}) {
    tensors.push_back(Tensor<float>({1}));
    works.push_back(Submit(r, AllReduce(tensors.back())));
  }
  std::this_thread::sleep_for(milliseconds(50));
  for (const auto& work : works) EXPECT_FALSE(work->IsCompleted());
  Lose(3);
  for (size_t i = 0; i < works.size(); ++i) {
    ASSERT_TRUE(WaitFor(works[i]).ok()) << works[i]->status().ToString();
    EXPECT_EQ(Values<float>(tensors[i]), std::vector<float>{4});
  }
}

TEST_F(ShrinkingGroupTest, TheLostRanksOpsUpToTheCutRunWithItsInput) {
  Form();
  TensorView lost_input = Tensor<float>({10});
  std::shared_ptr<Work> lost_work = Submit(3, AllReduce(lost_input));
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{13, 13, 13}));
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  EXPECT_TRUE(WaitFor(lost_work).ok());
}

TEST_F(ShrinkingGroupTest, OpsIssuedDuringTheChangeRunInIssueOrder) {
  Form();
  Lose(3);
  std::vector<std::vector<TensorView>> tensors(3);
  std::vector<std::shared_ptr<Work>> works;
  for (int op = 0; op < 3; ++op) {
    for (int r : {0, 1, 2}) {
      tensors[op].push_back(Tensor<float>({static_cast<float>(op + 1)}));
      works.push_back(Submit(r, AllReduce(tensors[op].back())));
    }
  }
  for (const auto& work : works) ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  for (int op = 0; op < 3; ++op) {
    for (const TensorView& t : tensors[op]) {
      EXPECT_EQ(Values<float>(t), std::vector<float>{4.0f * (op + 1)}) << "op " << op;
    }
  }
}

TEST_F(ShrinkingGroupTest, ASidecarWhoseRanksAreAllLostDropsOut) {
  Form();
  Lose(3);
  Lose(2);
  EXPECT_EQ(AllReduceOn({0, 1}, 1), (std::vector<float>{4, 4}));  // 2 ones, scaled by 4 / 2
  std::pair<int, std::vector<int>> epoch = EpochOn("a");
  EXPECT_EQ(epoch.second, (std::vector<int>{2, 3}));
  EXPECT_EQ(cluster_.registry("a").Find("g")->topology().node_count(), 1);
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (cluster_.registry("b").Find("g") && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  EXPECT_EQ(cluster_.registry("b").Find("g"), nullptr);
}

// A CUDA group on the in-process fabric's simulated device (an asynchronous backend, several ops
// enqueued at once): the epoch retires once its enqueued ops up to the cut completed, and the
// next epoch gets a communicator of its own.
TEST_F(ShrinkingGroupTest, ACudaGroupOnTheSimulatedDeviceShrinksWithOpsOnTheDevice) {
  Form(Shrink(), DeviceKind::kCuda);
  ASSERT_EQ(cluster_.registry("a").Find("g")->spec().device, DeviceKind::kCuda);
  // Rank 3 issues three ops and is lost; the survivors issue five: three with its input, two
  // among themselves.
  std::vector<TensorView> lost_inputs;
  for (int op = 0; op < 3; ++op) {
    lost_inputs.push_back(Tensor<float>({10}, kGpu));
    (void)Submit(3, AllReduce(lost_inputs.back()));
  }
  Lose(3);
  std::vector<std::vector<TensorView>> tensors(3);
  std::vector<std::shared_ptr<Work>> works;
  for (int r : {0, 1, 2}) {
    for (int op = 0; op < 5; ++op) {
      tensors[r].push_back(Tensor<float>({1}, kGpu));
      works.push_back(Submit(r, AllReduce(tensors[r].back())));
    }
  }
  for (const auto& work : works) ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  for (int r : {0, 1, 2}) {
    for (int op = 0; op < 5; ++op) {
      EXPECT_EQ(Values<float>(tensors[r][op]), std::vector<float>{op < 3 ? 13.0f : 4.0f})
          << "rank " << r << " op " << op;
    }
  }
  EXPECT_EQ(EpochOn("a").first, 1);
}

TEST_F(ShrinkingGroupTest, ALostRankThatJoinsAgainIsRefusedAtOnceUnlessTheJobAdmitsIt) {
  Form();
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  const auto started = SteadyClock::now();
  StatusOr<Membership> again = cluster_.Join("g", 3, kJoin, Shrink());
  EXPECT_LT(SteadyClock::now() - started, std::chrono::seconds(2));
  EXPECT_TRUE(again.status().IsInvalidArgument()) << again.status().ToString();
  EXPECT_THAT(again.status().message(), HasSubstr("its job admits no replacement"));
  // The survivors are untouched.
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 2), (std::vector<float>{8, 8, 8}));
}

// --- replacements: the group grows back ---

TEST_F(ShrinkingGroupTest, AReplacementOnASidecarOfTheGroupJoinsAtTheAdmittedCut) {
  Form();
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  ASSERT_TRUE(cluster_.registry("a").AcceptReplacements("g", 0).ok());
  StatusOr<Membership> replacement = Status::Internal("not joined");
  std::thread joiner([&] { replacement = cluster_.Join("g", 3, kJoin, Shrink()); });
  cluster_.AdmitOnEachSurvivor({0, 1, 2}, 3);
  joiner.join();
  ASSERT_TRUE(replacement.ok()) << replacement.status().ToString();
  EXPECT_TRUE(replacement->replacement);
  EXPECT_EQ(replacement->sequence_number, 2u);  // its first op is the group's third
  EXPECT_EQ(AllReduceOn({0, 1, 2, 3}, 1), (std::vector<float>{4, 4, 4, 4}));
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(EpochOn(id, 1), (std::pair<int, std::vector<int>>{2, {}})) << id;
  }
  EXPECT_EQ(cluster_.registry("b").SequenceNumber("g", 3), 3u);
  // Lost again, it shrinks as the first time.
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  EXPECT_EQ(EpochOn("a", 2).second, std::vector<int>{3});
}

TEST_F(ShrinkingGroupTest, AReplacementOnASidecarThatLeftTheGroupFormsTheEpochWithTheOthers) {
  Form();
  Lose(3);
  Lose(2);
  EXPECT_EQ(AllReduceOn({0, 1}, 1), (std::vector<float>{4, 4}));
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (cluster_.registry("b").Find("g") && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  ASSERT_EQ(cluster_.registry("b").Find("g"), nullptr);
  ASSERT_TRUE(cluster_.registry("a").AcceptReplacements("g", 1).ok());
  StatusOr<Membership> replacement = Status::Internal("not joined");
  std::thread joiner([&] { replacement = cluster_.Join("g", 2, kJoin, Shrink()); });
  cluster_.AdmitOnEachSurvivor({0, 1}, 2);
  joiner.join();
  ASSERT_TRUE(replacement.ok()) << replacement.status().ToString();
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 3), (std::vector<float>{12, 12, 12}));  // 9, scaled by 4 / 3
  EXPECT_EQ(EpochOn("b").second, std::vector<int>{3});
  EXPECT_EQ(cluster_.registry("b").Find("g")->topology().node_count(), 2);
}

TEST_F(ShrinkingGroupTest, AReplacementForALiveRankOrASecondOneForTheSameRankIsRefused) {
  Form();
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  ASSERT_TRUE(cluster_.registry("b").AcceptReplacements("g", 2).ok());
  StatusOr<Membership> live = cluster_.JoinOn("b", "g", 1, kJoin, Shrink());
  EXPECT_TRUE(live.status().IsInvalidArgument()) << live.status().ToString();
  EXPECT_THAT(live.status().message(), HasSubstr("is live in the running group"));
  StatusOr<Membership> first = Status::Internal("not joined");
  std::thread joiner([&] { first = cluster_.Join("g", 3, milliseconds(3000), Shrink()); });
  // The first replacement is waiting once its sidecar sees it.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (cluster_.registry("b").Replacements("g", 2).value().empty() &&
         SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  StatusOr<Membership> second = cluster_.Join("g", 3, kJoin, Shrink());
  EXPECT_TRUE(second.status().IsInvalidArgument()) << second.status().ToString();
  EXPECT_THAT(second.status().message(), HasSubstr("another replacement for that rank"));
  // Admitting a live rank, or after an op that is not the rank's last, is refused.
  GroupRegistry& a = cluster_.registry("a");
  EXPECT_THAT(a.Admit("g", 0, a.SequenceNumber("g", 0), {1}).message(), HasSubstr("is live"));
  EXPECT_THAT(a.Admit("g", 0, 1, {3}).message(), HasSubstr("but its last op is 2"));
  // Nobody admits the first: it gives up at its timeout, saying why, and the survivors go on.
  joiner.join();
  EXPECT_TRUE(first.status().IsTimeout()) << first.status().ToString();
  EXPECT_THAT(first.status().message(), HasSubstr("was not admitted within 3000 ms"));
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
}

TEST_F(ShrinkingGroupTest, AReplacementForAGroupBelowItsMinimumIsRefused) {
  Form(Shrink(/*min_ranks=*/3));
  ASSERT_TRUE(cluster_.registry("a").AcceptReplacements("g", 0).ok());
  Lose(3);
  Lose(2);
  EXPECT_TRUE(WaitFor(Submit(0, AllReduce(Tensor<float>({1})))).kind() == ErrorKind::kPeerLost);
  StatusOr<Membership> replacement = cluster_.Join("g", 3, kJoin, Shrink(3));
  EXPECT_TRUE(replacement.status().kind() == ErrorKind::kPeerLost)
      << replacement.status().ToString();
  EXPECT_THAT(replacement.status().message(), HasSubstr("cannot go on"));
}

TEST_F(ShrinkingGroupTest, OnceEveryRankLeftTheGroupsKeysAreGoneAndItCanBeCreatedAgain) {
  Form();
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  Lose(2);
  Lose(1);
  Lose(0);
  // Only the ranks' incarnation counters and the token commitment stay. The keys can go (from
  // one sidecar) before the other sidecar let go of its group: the next creation waits for both.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  auto released = [&] {
    return cluster_.store().NumKeys().value() == 5 && !cluster_.registry("a").Find("g") &&
           !cluster_.registry("b").Find("g");
  };
  while (!released() && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  EXPECT_EQ(cluster_.store().NumKeys().value(), 5);
  ASSERT_TRUE(released());
  Form();  // the next incarnation, every rank live again
  EXPECT_EQ(cluster_.registry("b").Find("g")->spec().epoch, 0);
  ForEachRank(4, [&](int r) { EXPECT_TRUE(cluster_.registry(SidecarOf(r)).Leave("g", r).ok()); });
}

TEST_F(ShrinkingGroupTest, AnAbortFailsTheGroupInWhateverEpochItIs) {
  Form();
  Lose(3);
  EXPECT_EQ(AllReduceOn({0, 1, 2}, 1), (std::vector<float>{4, 4, 4}));
  ASSERT_TRUE(cluster_.registry("a").FailGroup("g", Status::Aborted("operator abort")).ok());
  Status failed = WaitFor(Submit(0, AllReduce(Tensor<float>({1}))));
  EXPECT_EQ(failed.kind(), ErrorKind::kAborted) << failed.ToString();
  EXPECT_THAT(failed.message(), HasSubstr("operator abort"));
}

TEST_F(ShrinkingGroupTest, BelowItsMinimumTheGroupFails) {
  Form(Shrink(/*min_ranks=*/4));
  Lose(3);
  for (int r : {0, 2}) {
    Status failed = WaitFor(Submit(r, AllReduce(Tensor<float>({1}))));
    EXPECT_TRUE(failed.kind() == ErrorKind::kPeerLost) << failed.ToString();
    EXPECT_THAT(failed.message(), HasSubstr("fewer than its minimum of 4")) << failed.ToString();
  }
}

TEST_F(ShrinkingGroupTest, AFailFastGroupDoesNotShrink) {
  Form(FaultTolerance{});
  EXPECT_FALSE(cluster_.registry("a").Shrinks("g"));
  EXPECT_TRUE(
      cluster_.registry("b").LoseRank("g", 3, Status::PeerLost("lost")).IsInvalidArgument());
  ForEachRank(4, [&](int r) { EXPECT_TRUE(cluster_.registry(SidecarOf(r)).Leave("g", r).ok()); });
}

TEST(ShrinkingGroupOptionsTest, AMinimumOutsideTheGroupIsRefusedAtOnce) {
  RegistryCluster cluster({"a", "b"});
  StatusOr<Membership> refused = cluster.Join("g", 0, kJoin, Shrink(3));
  EXPECT_TRUE(refused.status().IsInvalidArgument());
  EXPECT_THAT(refused.status().message(), HasSubstr("outside [1, 2]"));
  EXPECT_EQ((FaultTolerance{FaultToleranceMode::kShrink, 2}).Encode(), "shrink:2");
  EXPECT_EQ(FaultTolerance{}.Encode(), "fail-fast");
}

}  // namespace
}  // namespace collectived
