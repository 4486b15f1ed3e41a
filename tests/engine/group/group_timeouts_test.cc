// Group over the in-process fabric: ops that a local rank or a remote sidecar never issues time
// out on the clock, naming who is missing, and a delayed sidecar within or beyond the timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "engine/group/core/group.h"
#include "tests/engine/group/group_test_helpers.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

using namespace group_testing;  // NOLINT: the helpers of this suite

// --- timeouts ---

TEST(GroupTest, LocalRankThatNeverIssuesTimesOutNamingIt_TwoNodesTwoRanks) {
  ManualClock clock;
  Cluster cluster("local-timeout", {"a", "a", "b", "b"}, OnManualClock(clock));
  std::vector<std::shared_ptr<Work>> works;
  for (int r : {0, 1, 2})
    works.push_back(cluster.Submit(r, AllReduce(Zeros(2), ReduceOp::Sum(), kHalfHour)));
  clock.Advance(kHalfHour - milliseconds(1));
  for (int node = 0; node < 2; ++node) cluster.runtime(node).timers().Settle();
  for (auto& work : works) EXPECT_FALSE(work->IsCompleted()) << "a moment early";
  clock.Advance(milliseconds(1));
  for (auto& work : works) {
    Status status = WaitReally(work);
    EXPECT_TRUE(status.IsTimeout()) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("allreduce (seq 1) on group 'local-timeout'"));
  }
  // Node 1 (ranks 2, 3) names its missing rank; node 0 learns it through the published reason
  // or times out itself waiting for node 1.
  EXPECT_THAT(works[2]->status().message(),
              HasSubstr(" Timed out after 1800000 ms: ranks [3] never issued it"));
  EXPECT_TRUE(cluster.node(1).failure().IsTimeout());
  // The group is failed: later ops fail at once with the reason.
  auto later = cluster.Submit(3, AllReduce(Zeros(2)));
  EXPECT_TRUE(later->IsCompleted());
  EXPECT_THAT(later->status().message(), HasSubstr("ranks [3] never issued it"));
}

TEST(GroupTest, ASoonerDeadlineIsWatchedAfterALaterOne_OneNodeTwoRanks) {
  // The group's timer is armed for the deadline it last saw (here a day away, left armed by ops
  // that completed); an op with a sooner deadline must move it.
  ManualClock clock;
  Cluster cluster("sooner-deadline", {"a", "a"}, OnManualClock(clock));
  const milliseconds day = std::chrono::hours(24);
  for (int op = 0; op < 3; ++op) {
    auto first = cluster.Submit(0, AllReduce(Zeros(2), ReduceOp::Sum(), day));
    auto last = cluster.Submit(1, AllReduce(Zeros(2), ReduceOp::Sum(), day));
    ASSERT_TRUE(WaitReally(first).ok());
    ASSERT_TRUE(WaitReally(last).ok());
  }
  auto lonely = cluster.Submit(0, AllReduce(Zeros(2), ReduceOp::Sum(), kHalfHour));
  clock.Advance(kHalfHour);
  Status status = WaitReally(lonely);
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("allreduce (seq 4) on group 'sooner-deadline'"));
  EXPECT_THAT(status.message(), HasSubstr("ranks [1] never issued it"));
}

TEST(GroupTest, RemoteSidecarThatNeverIssuesTimesOut_TwoNodesOneRank) {
  ManualClock clock;
  Cluster cluster("remote-timeout", {"a", "b"}, OnManualClock(clock));
  auto work = cluster.Submit(0, AllReduce(Zeros(2), ReduceOp::Sum(), kHalfHour));
  clock.Advance(kHalfHour - milliseconds(1));
  cluster.runtime(0).timers().Settle();
  EXPECT_FALSE(work->IsCompleted()) << "a moment early";
  clock.Advance(milliseconds(1));
  Status status = WaitReally(work);
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("allreduce (seq 1) on group 'remote-timeout'"));
  EXPECT_THAT(status.message(), HasSubstr("no answer from sidecar nodes [1]"));
  // c10d's wording, and the ranks that may be missing (those of the other sidecar).
  EXPECT_THAT(status.message(), HasSubstr(" Timed out after 1800000 ms waiting for ranks [1]"));
  // Node 0 failed the group and closed its connections. Its part of op 1 went out before (the
  // agreement's messages are sent at once, as on a socket, whose bytes arrive before its end of
  // stream): node 1's op 1 completes with it if node 1 takes it before it hears of the close,
  // else it fails with node 0's reason. Either way node 1 learns the reason by its next op.
  TensorView late_tensor = Tensor<int64_t>({5, 6});
  Status late = WaitReally(cluster.Submit(1, AllReduce(late_tensor)));
  if (late.ok()) {
    EXPECT_EQ(Values(late_tensor), (std::vector<int64_t>{5, 6})) << "node 0 contributed zeros";
  } else {
    EXPECT_TRUE(late.IsTimeout()) << late.ToString();
    EXPECT_THAT(late.message(), HasSubstr("no answer from sidecar nodes [1]"));
  }
  Status next = WaitReally(cluster.Submit(1, AllReduce(Zeros(2))));
  EXPECT_TRUE(next.IsTimeout()) << next.ToString();
  EXPECT_THAT(next.message(), HasSubstr("no answer from sidecar nodes [1]"));
}

TEST(GroupTest, DelayedSidecarWithinTheTimeoutSucceedsAndBeyondItTimesOut_TwoNodesOneRank) {
  Cluster cluster("delayed", {"a", "b"});
  ASSERT_TRUE(cluster.fabric().DelayNode("delayed", 1, milliseconds(100)).ok());
  ForEachRank(2, [&](int r) {
    TensorView t = Tensor<int64_t>({r + 1});
    EXPECT_TRUE(WaitFor(cluster.Submit(r, AllReduce(t, ReduceOp::Sum(), milliseconds(2000)))).ok());
    EXPECT_EQ(Values(t), std::vector<int64_t>{3});
  });
  ASSERT_TRUE(cluster.fabric().DelayNode("delayed", 1, milliseconds(600)).ok());
  std::vector<Status> results(2);
  ForEachRank(2, [&](int r) {
    results[r] =
        WaitFor(cluster.Submit(r, AllReduce(Zeros(1), ReduceOp::Sum(), milliseconds(200))));
  });
  EXPECT_TRUE(results[0].IsTimeout()) << results[0].ToString();
  EXPECT_THAT(results[0].message(), HasSubstr("allreduce (seq 2) on group 'delayed'"));
  // The slow sidecar finds node 0's connections closed once its delay is over, and reports the
  // reason node 0 published.
  EXPECT_TRUE(results[1].IsTimeout()) << results[1].ToString();
  EXPECT_EQ(cluster.fabric().DelayNode("unknown", 0, milliseconds(1)).kind(), ErrorKind::kNotFound);
  EXPECT_TRUE(cluster.fabric().DelayNode("delayed", 2, milliseconds(1)).IsInvalidArgument());
}

}  // namespace
}  // namespace collectived
