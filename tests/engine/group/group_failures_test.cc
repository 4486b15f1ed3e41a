// Group over the in-process fabric: a peer's failure, Fail, AbortRank and Stop fail the pending
// ops with their reason, and a killed sidecar is PeerLost on the survivors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/core/group.h"
#include "tests/engine/group/group_cluster.h"

namespace collectived {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

using namespace group_testing;  // NOLINT: the helpers of this suite

// A peer's failure that comes with the last sequence number that peer completed lets an op up to
// that number finish here (the peer already did its part), then applies; an op after it, or a
// failure without the number, fails at once.
TEST(GroupTest, APeersFailureLetsTheOpItCompletedFinishFirst_TwoNodesOneRank) {
  Cluster cluster("spared", {"a", "b"});
  ASSERT_TRUE(cluster.fabric().DelayNode("spared", 1, milliseconds(300)).ok());
  TensorView t0 = Tensor<int64_t>({1});
  TensorView t1 = Tensor<int64_t>({2});
  auto w0 = cluster.Submit(0, AllReduce(t0));
  auto w1 = cluster.Submit(1, AllReduce(t1));
  // Node 1 is inside op 1 (held by its delay) when the peer's failure arrives.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
  while (SteadyClock::now() < deadline) {
    auto records = cluster.node(1).FlightRecords(0);
    if (!records.empty() && records.back().state == OpRecord::State::kRunning) break;
    std::this_thread::sleep_for(milliseconds(1));
  }
  cluster.node(1).Fail(Status::PeerLost("rank 0 left group 'spared' (it destroyed the group)"),
                       /*from_peer=*/true, /*peer_completed_through=*/1);
  EXPECT_TRUE(cluster.node(1).failure().ok()) << "deferred while op 1 runs";
  EXPECT_TRUE(WaitFor(w1).ok()) << w1->status().ToString();
  EXPECT_EQ(Values(t1), std::vector<int64_t>{3});
  EXPECT_TRUE(WaitFor(w0).ok()) << w0->status().ToString();
  // Once op 1 concluded, the failure applies to everything later.
  const auto applied = SteadyClock::now() + std::chrono::seconds(2);
  while (cluster.node(1).failure().ok() && SteadyClock::now() < applied)
    std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(cluster.node(1).failure().kind(), ErrorKind::kPeerLost);
  Status later = WaitFor(cluster.Submit(1, AllReduce(Zeros(1))));
  EXPECT_EQ(later.kind(), ErrorKind::kPeerLost) << later.ToString();
  EXPECT_THAT(later.message(), HasSubstr("it destroyed the group"));
}

TEST(GroupTest, APeersFailureFailsARunningOpThePeerDidNotComplete_TwoNodesOneRank) {
  Cluster cluster("unspared", {"a", "b"});
  ASSERT_TRUE(cluster.fabric().DelayNode("unspared", 1, milliseconds(300)).ok());
  auto w1 = cluster.Submit(1, AllReduce(Zeros(1)));
  const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
  while (SteadyClock::now() < deadline) {
    auto records = cluster.node(1).FlightRecords(0);
    if (!records.empty() && records.back().state == OpRecord::State::kRunning) break;
    std::this_thread::sleep_for(milliseconds(1));
  }
  const auto start = SteadyClock::now();
  cluster.node(1).Fail(Status::PeerLost("rank 0 was lost"), /*from_peer=*/true,
                       /*peer_completed_through=*/0);
  Status status = WaitFor(w1);
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.ToString();
  EXPECT_LT(SteadyClock::now() - start, milliseconds(250)) << "failed at once, not after the op";
}

// --- abort ---

TEST(GroupTest, FailFailsPendingOpsAndPeersLearnTheReasonThroughTheHooks_TwoNodesTwoRanks) {
  Cluster cluster("abort", {"a", "a", "b", "b"});
  auto pending_local = cluster.Submit(0, AllReduce(Zeros(1)));  // rank 1 never issues
  std::vector<std::shared_ptr<Work>> remote;
  for (int r : {2, 3}) remote.push_back(cluster.Submit(r, AllReduce(Zeros(1))));
  cluster.node(0).Fail(Status::Aborted("operator abort"));
  Status local = WaitFor(pending_local);
  EXPECT_EQ(local.kind(), ErrorKind::kAborted) << local.ToString();
  EXPECT_THAT(local.message(), HasSubstr("operator abort"));
  EXPECT_THAT(local.message(), HasSubstr("allreduce (seq 1) on group 'abort'"));
  for (auto& work : remote) {
    Status status = WaitFor(work);
    EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("operator abort"));
  }
  EXPECT_EQ(cluster.node(1).failure().kind(), ErrorKind::kAborted);
  // The first reason wins; later ops fail at once.
  cluster.node(0).Fail(Status::Internal("second"));
  EXPECT_THAT(cluster.node(0).failure().message(), HasSubstr("operator abort"));
  auto later = cluster.Submit(1, AllReduce(Zeros(1)));
  EXPECT_TRUE(later->IsCompleted());
  EXPECT_EQ(later->status().kind(), ErrorKind::kAborted);
}

TEST(GroupTest, FailWithoutPublishedReasonIsPeerLostForThePeers_TwoNodesOneRank) {
  Cluster::Options options;
  options.publish_failures = false;
  Cluster cluster("abort-silent", {"a", "b"}, options);
  auto remote = cluster.Submit(1, AllReduce(Zeros(1)));
  cluster.node(0).Fail(Status::Aborted("operator abort"));
  Status status = WaitFor(remote);
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.ToString();
  EXPECT_THAT(status.message(),
              HasSubstr("lost the connection to a peer sidecar of group 'abort-silent' (peers: "
                        "sidecar a (ranks [0]))"));
  EXPECT_THAT(status.message(), HasSubstr("sidecar node 0 closed its connections"));
}

TEST(GroupTest, AbortRankFailsOnlyThatRanksPendingOps_OneNodeTwoRanks) {
  Cluster cluster("abort-rank", {"a", "a"});
  auto collective = cluster.Submit(0, AllReduce(Zeros(1)));
  auto recv = cluster.Submit(0, PointToPointOp(OpKind::kRecv, Zeros(1), 1, 5));
  cluster.node(0).AbortRank(0, Status::Aborted("rank 0 left"));
  for (auto& work : {collective, recv}) {
    Status status = WaitFor(work);
    EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("rank 0 left"));
  }
  EXPECT_THAT(collective->status().message(), HasSubstr("allreduce (seq 1) on group 'abort-rank'"));
  EXPECT_TRUE(cluster.node(0).failure().ok());
  cluster.node(0).AbortRank(7, Status::Aborted("not local"));  // not a rank here: ignored
}

TEST(GroupTest, StopFailsEverythingAndThreadsExit_TwoNodesOneRank) {
  auto cluster = std::make_unique<Cluster>("stop", std::vector<std::string>{"a", "b"});
  auto pending = cluster->Submit(0, AllReduce(Zeros(1)));
  auto remote_recv = cluster->Submit(0, PointToPointOp(OpKind::kRecv, Zeros(1), 1, 0));
  cluster->node(0).Stop();
  for (auto& work : {pending, remote_recv}) {
    Status status = WaitFor(work);
    EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("group 'stop' was destroyed"));
  }
  EXPECT_TRUE(Eventually([&] { return cluster->node(0).Quiescent(); }, milliseconds(2000)));
  auto later = cluster->Submit(0, AllReduce(Zeros(1)));
  EXPECT_TRUE(later->IsCompleted());
  EXPECT_EQ(later->status().kind(), ErrorKind::kAborted);
  cluster.reset();  // stops node 1 and checks that its threads exit too
}

// --- a sidecar dies ---

TEST(GroupTest, KilledSidecarIsPeerLostOnTheSurvivors_ThreeNodesOneRank) {
  Cluster::Options options;
  options.publish_failures = false;
  options.silent = {"c"};
  Cluster cluster("killed", {"a", "b", "c"}, options);
  std::vector<std::shared_ptr<Work>> works;
  for (int r : {0, 1}) works.push_back(cluster.Submit(r, AllReduce(Zeros(1))));
  auto recv = cluster.Submit(0, PointToPointOp(OpKind::kRecv, Zeros(1), 2, 0));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(works[0]->IsCompleted());
  const auto start = SteadyClock::now();
  ASSERT_TRUE(cluster.fabric().KillNode("killed", 2).ok());
  for (auto& work : works) {
    Status status = WaitFor(work);
    EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.ToString();
    EXPECT_THAT(status.message(),
                HasSubstr("lost sidecar c (ranks [2]): the connection broke and it did not "
                          "answer within 750 ms (the other peers did)"));
    // Its own connection to node 2 broke; with summary agreements (a tree rooted at node 0)
    // node 1 learns it from node 0, which failed first and closed its connections.
    EXPECT_THAT(status.message(), AnyOf(HasSubstr("sidecar node 2 was killed"),
                                        HasSubstr("sidecar node 0 closed its connections")));
  }
  EXPECT_LT(SteadyClock::now() - start, milliseconds(2000));
  EXPECT_EQ(WaitFor(recv).kind(), ErrorKind::kPeerLost) << recv->status().ToString();
  EXPECT_EQ(cluster.fabric().KillNode("killed", 3).kind(), ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace collectived
