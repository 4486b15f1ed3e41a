// Group over the in-process fabric: ranks that issue different ops for one sequence number get a
// Desync on every rank (and the group stays usable), and requests out of bounds are refused
// before anything runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "engine/group/core/group.h"
#include "tests/engine/group/group_test_helpers.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

using namespace group_testing;  // NOLINT: the helpers of this suite

// --- desync ---

TEST(GroupTest, DifferentCountsForOneSequenceNumberAreADesyncOnEveryRank_TwoNodesTwoRanks) {
  Cluster cluster("desync", {"a", "a", "b", "b"});
  std::vector<Status> results(4);
  ForEachRank(
      4, [&](int r) { results[r] = WaitFor(cluster.Submit(r, AllReduce(Zeros(r == 3 ? 4 : 8)))); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
    EXPECT_THAT(results[r].message(),
                HasSubstr("ranks issued different ops for sequence number 1 of group 'desync': "
                          "ranks [3] issued allreduce(int64, count=4, SUM); ranks [0, 1, 2] "
                          "issued allreduce(int64, count=8, SUM)"));
  }
  // The group stays usable: every sidecar saw the same desync.
  ForEachRank(4, [&](int r) {
    TensorView t = Tensor<int64_t>({r});
    EXPECT_TRUE(WaitFor(cluster.Submit(r, AllReduce(t))).ok());
    EXPECT_EQ(Values(t), std::vector<int64_t>{6});
  });
}

TEST(GroupTest, DifferentOpsForOneSequenceNumberAreADesync_ThreeNodesOneRank) {
  Cluster cluster("desync-ops", {"a", "b", "c"});
  std::vector<Status> results(3);
  ForEachRank(3, [&](int r) {
    OpRequest barrier;
    barrier.kind = OpKind::kBarrier;
    results[r] = WaitFor(cluster.Submit(r, r == 1 ? barrier : AllReduce(Zeros(2))));
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("ranks [0, 2] issued allreduce(int64, count=2, "
                                                "SUM); ranks [1] issued barrier(count=0)"));
  }
}

// Same total and tensor count, different per-tensor sizes: without the sizes in the signature
// the elements would be combined across tensors (a silent wrong result).
TEST(GroupTest, CoalescedTensorSizesThatDisagreeAreADesync_TwoNodesOneRank) {
  Cluster cluster("desync-coalesced", {"a", "b"});
  std::vector<Status> results(2);
  ForEachRank(2, [&](int r) {
    OpRequest request = AllReduce(Zeros(r == 0 ? 2 : 1));
    request.kind = OpKind::kAllReduceCoalesced;
    request.inputs.push_back(Zeros(r == 0 ? 2 : 3));
    results[r] = WaitFor(cluster.Submit(r, request));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
    EXPECT_THAT(results[r].message(),
                HasSubstr("ranks [0] issued allreduce_coalesced(int64, count=4, tensors=2, SUM) "
                          "with tensor sizes [2, 2]"));
    EXPECT_THAT(results[r].message(),
                HasSubstr("ranks [1] issued allreduce_coalesced(int64, count=4, tensors=2, SUM) "
                          "with tensor sizes [1, 3]"));
  }
}

TEST(GroupTest, CoalescedSizesBeyondTheShownOnesStillDisagree_OneNodeTwoRanks) {
  Cluster cluster("desync-many", {"a", "a"});
  std::vector<Status> results(2);
  ForEachRank(2, [&](int r) {
    OpRequest request = AllReduce(Zeros(1));
    request.kind = OpKind::kAllReduceCoalesced;
    for (int i = 1; i < 10; ++i) request.inputs.push_back(Zeros(1));
    request.inputs[8] = Zeros(r == 0 ? 1 : 2);  // the ninth tensor: not among the sizes shown
    request.inputs[9] = Zeros(r == 0 ? 2 : 1);
    results[r] = WaitFor(cluster.Submit(r, request));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("with tensor sizes [1, 1, 1, 1, 1, 1, 1, 1, ..."));
  }
}

TEST(GroupTest, AbsurdTimeoutsAndOverflowingSplitsAreRefusedBeforeAnythingRuns_OneNodeTwoRanks) {
  Cluster cluster("bounds", {"a", "a"});
  auto forever = cluster.Submit(0, AllReduce(Zeros(1), ReduceOp::Sum(), milliseconds::max()));
  EXPECT_TRUE(forever->status().IsInvalidArgument()) << forever->status().ToString();
  EXPECT_THAT(forever->status().message(),
              HasSubstr("is longer than the longest accepted, 604800000 ms (7 days)"));

  OpRequest request;
  request.kind = OpKind::kAllToAllSingle;
  request.inputs = {Zeros(4)};
  request.outputs = {Zeros(4)};
  request.input_splits = {std::numeric_limits<uint64_t>::max() - 1, 6};  // wraps around to 4
  auto wrapped = cluster.Submit(0, request);
  EXPECT_TRUE(wrapped->status().IsInvalidArgument()) << wrapped->status().ToString();
  EXPECT_THAT(wrapped->status().message(),
              HasSubstr("input split sizes add up to more than 2^64 elements (the tensor has 4)"));
  EXPECT_EQ(cluster.node(0).SequenceNumber(0), 0u);
}

TEST(GroupTest, AllToAllBlockSizesThatDisagreeAreADesync_TwoNodesOneRank) {
  Cluster cluster("desync-alltoall", {"a", "b"});
  std::vector<Status> results(2);
  ForEachRank(2, [&](int r) {
    OpRequest request;
    request.kind = OpKind::kAllToAllSingle;
    request.inputs = {Zeros(4)};
    request.outputs = {Zeros(4)};
    request.input_splits = {2, 2};
    request.output_splits = r == 1 ? std::vector<uint64_t>{3, 1} : std::vector<uint64_t>{2, 2};
    results[r] = WaitFor(cluster.Submit(r, request));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
    EXPECT_THAT(results[r].message(),
                HasSubstr("rank 0 sends 2 elements to rank 1 but rank 1 expects 3 from rank 0"));
  }
}

// Above GroupSpec::split_digest_above_ranks the split sizes are checked through digests: uneven
// splits that agree run, and ones that disagree are a Desync that says so without naming a pair.
TEST(GroupTest, AllToAllSplitsAreCheckedThroughDigestsInLargeGroups_TwoNodesThreeRanks) {
  Cluster::Options options;
  options.split_digest_above_ranks = 2;
  Cluster cluster("digest-alltoall", {"a", "a", "b"}, options);
  constexpr int n = 3;
  ForEachRank(n, [&](int r) {
    OpRequest request;
    const std::vector<int64_t> expected = UnevenAllToAllSingle(r, n, &request);
    ASSERT_TRUE(WaitFor(cluster.Submit(r, request)).ok());
    EXPECT_EQ(Values(request.outputs[0]), expected);
  });
  // Rank 0 sends 2 elements to rank 1, which expects 1, and rank 2 expects 2 from rank 0, which
  // sends it 1: every rank's tensors match its own splits, only pairs disagree.
  std::vector<Status> results(n);
  ForEachRank(n, [&](int r) {
    OpRequest request;
    request.kind = OpKind::kAllToAllSingle;
    request.input_splits = {1, 1, 1};
    request.output_splits = {1, 1, 1};
    if (r == 0) request.input_splits = {1, 2, 1};
    if (r == 2) request.output_splits = {2, 1, 1};
    int64_t in = 0, out = 0;
    for (uint64_t s : request.input_splits) in += static_cast<int64_t>(s);
    for (uint64_t s : request.output_splits) out += static_cast<int64_t>(s);
    request.inputs = {Zeros(in)};
    request.outputs = {Zeros(out)};
    results[r] = WaitFor(cluster.Submit(r, request));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("the ranks' split sizes disagree"));
    EXPECT_THAT(results[r].message(), HasSubstr("(seq 2) on group 'digest-alltoall'"));
  }
}

}  // namespace
}  // namespace collectived
