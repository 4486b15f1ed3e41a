// Group over the in-process fabric (ranks are threads, sidecars are simulated in this process):
// every collective exact over several topologies, issue order and sequence numbers, and the
// allreduce data paths (riding the signature exchange, split among threads, pipelined).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/core/group.h"
#include "tests/engine/group/group_test_helpers.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

using namespace group_testing;  // NOLINT: the helpers of this suite

// --- every collective, exact, over several topologies ---

struct Topology {
  std::string name;
  std::vector<std::string> sidecar_of_rank;
};

class CollectivesTest : public ::testing::TestWithParam<Topology> {};

TEST_P(CollectivesTest, EveryCollectiveIsExactOnEveryRank) {
  Cluster cluster("collectives", GetParam().sidecar_of_rank);
  const int n = cluster.size();
  ForEachRank(n, [&](int r) {
    // allreduce SUM (int64): rank r contributes r * 10 + i.
    TensorView sum = Tensor<int64_t>({r * 10 + 0, r * 10 + 1, r * 10 + 2});
    ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(sum))).ok());
    const int64_t base = 10 * n * (n - 1) / 2;
    EXPECT_EQ(Values(sum), (std::vector<int64_t>{base, base + n, base + 2 * n})) << "rank " << r;

    // allreduce AVG (float32) of r + 1: (n + 1) / 2, exact.
    TensorView avg = Tensor<float>({static_cast<float>(r + 1), 2.0f * (r + 1)});
    ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(avg, ReduceOp::Avg()))).ok());
    EXPECT_EQ(Values<float>(avg), (std::vector<float>{(n + 1) / 2.0f, (n + 1) * 1.0f}));

    // allreduce MAX.
    TensorView max = Tensor<int32_t>({r, -r});
    ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(max, ReduceOp::Max()))).ok());
    EXPECT_EQ(Values<int32_t>(max), (std::vector<int32_t>{n - 1, 0}));

    // broadcast from the last rank.
    OpRequest broadcast;
    broadcast.kind = OpKind::kBroadcast;
    broadcast.root = n - 1;
    TensorView broadcast_tensor =
        r == n - 1 ? Tensor<int64_t>({7, 8, 9}) : Tensor<int64_t>({0, 0, 0});
    broadcast.inputs = {broadcast_tensor};
    ASSERT_TRUE(WaitFor(cluster.Submit(r, broadcast)).ok());
    EXPECT_EQ(Values(broadcast_tensor), (std::vector<int64_t>{7, 8, 9}));

    // reduce SUM to rank 1.
    OpRequest reduce;
    reduce.kind = OpKind::kReduce;
    reduce.root = 1;
    TensorView reduce_tensor = Tensor<int64_t>({r + 1, 100});
    reduce.inputs = {reduce_tensor};
    ASSERT_TRUE(WaitFor(cluster.Submit(r, reduce)).ok());
    if (r == 1) {
      EXPECT_EQ(Values(reduce_tensor), (std::vector<int64_t>{n * (n + 1) / 2, 100 * n}));
    }

    // allgather: rank r contributes {r, r + 100}.
    OpRequest allgather;
    allgather.kind = OpKind::kAllGather;
    allgather.inputs = {Tensor<int64_t>({r, r + 100})};
    for (int j = 0; j < n; ++j) allgather.outputs.push_back(Zeros(2));
    ASSERT_TRUE(WaitFor(cluster.Submit(r, allgather)).ok());
    for (int j = 0; j < n; ++j)
      EXPECT_EQ(Values(allgather.outputs[j]), (std::vector<int64_t>{j, j + 100}));

    // allgather_into_tensor.
    OpRequest into;
    into.kind = OpKind::kAllGatherIntoTensor;
    into.inputs = {Tensor<int64_t>({r * 2, r * 2 + 1})};
    into.outputs = {Zeros(2 * n)};
    ASSERT_TRUE(WaitFor(cluster.Submit(r, into)).ok());
    std::vector<int64_t> expected_into(2 * n);
    for (int i = 0; i < 2 * n; ++i) expected_into[i] = i;
    EXPECT_EQ(Values(into.outputs[0]), expected_into);

    // reduce_scatter: rank r's input j is {r + 10 * j, 1}; rank r gets the sum of inputs r.
    OpRequest reduce_scatter;
    reduce_scatter.kind = OpKind::kReduceScatter;
    for (int j = 0; j < n; ++j) reduce_scatter.inputs.push_back(Tensor<int64_t>({r + 10 * j, 1}));
    reduce_scatter.outputs = {Zeros(2)};
    ASSERT_TRUE(WaitFor(cluster.Submit(r, reduce_scatter)).ok());
    EXPECT_EQ(Values(reduce_scatter.outputs[0]),
              (std::vector<int64_t>{n * (n - 1) / 2 + 10 * r * n, n}));

    // alltoall_single with uneven splits.
    OpRequest alltoall_single;
    const std::vector<int64_t> expected_single = UnevenAllToAllSingle(r, n, &alltoall_single);
    ASSERT_TRUE(WaitFor(cluster.Submit(r, alltoall_single)).ok());
    EXPECT_EQ(Values(alltoall_single.outputs[0]), expected_single);

    // alltoall (lists): out[j] on rank r = j * 10 + r.
    OpRequest alltoall;
    alltoall.kind = OpKind::kAllToAll;
    for (int j = 0; j < n; ++j) {
      alltoall.inputs.push_back(Tensor<int64_t>({r * 10 + j}));
      alltoall.outputs.push_back(Zeros(1));
    }
    ASSERT_TRUE(WaitFor(cluster.Submit(r, alltoall)).ok());
    for (int j = 0; j < n; ++j)
      EXPECT_EQ(Values(alltoall.outputs[j]), std::vector<int64_t>{j * 10 + r});

    // gather to rank 0.
    OpRequest gather;
    gather.kind = OpKind::kGather;
    gather.root = 0;
    gather.inputs = {Tensor<int64_t>({r, -r})};
    if (r == 0) {
      for (int j = 0; j < n; ++j) gather.outputs.push_back(Zeros(2));
    }
    ASSERT_TRUE(WaitFor(cluster.Submit(r, gather)).ok());
    if (r == 0) {
      for (int j = 0; j < n; ++j)
        EXPECT_EQ(Values(gather.outputs[j]), (std::vector<int64_t>{j, -j}));
    }

    // scatter from the last rank.
    OpRequest scatter;
    scatter.kind = OpKind::kScatter;
    scatter.root = n - 1;
    if (r == n - 1) {
      for (int j = 0; j < n; ++j) scatter.inputs.push_back(Tensor<int64_t>({j * 3, j * 3 + 1}));
    }
    scatter.outputs = {Zeros(2)};
    ASSERT_TRUE(WaitFor(cluster.Submit(r, scatter)).ok());
    EXPECT_EQ(Values(scatter.outputs[0]), (std::vector<int64_t>{r * 3, r * 3 + 1}));

    OpRequest barrier;
    barrier.kind = OpKind::kBarrier;
    ASSERT_TRUE(WaitFor(cluster.Submit(r, barrier)).ok());

    EXPECT_EQ(cluster.of(r).SequenceNumber(r), 13u);
  });
  for (int node = 0; node < cluster.node_count(); ++node) {
    EXPECT_EQ(cluster.node(node).SequenceNumber(), 13u);
    EXPECT_TRUE(cluster.node(node).failure().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, CollectivesTest,
    ::testing::Values(Topology{"TwoNodesTwoRanks", {"a", "a", "b", "b"}},
                      Topology{"OneNodeThreeRanks", {"a", "a", "a"}},
                      Topology{"ThreeNodesOneRank", {"a", "b", "c"}},
                      Topology{"TwoNodesInterleavedFiveRanks", {"a", "b", "a", "b", "b"}}),
    [](const ::testing::TestParamInfo<Topology>& info) { return info.param.name; });

// --- ordering and sequence numbers ---

TEST(GroupTest, OpsCompleteInIssueOrderWithEqualSequenceNumbers_TwoNodesTwoRanks) {
  Cluster cluster("ordering", {"a", "a", "b", "b"});
  constexpr int kOps = 20;
  std::mutex mutex;
  std::map<int, std::vector<uint64_t>> completed;  // by rank, sequence numbers in completion order
  ForEachRank(4, [&](int r) {
    std::vector<std::shared_ptr<Work>> works;
    std::vector<TensorView> tensors;
    for (int i = 0; i < kOps; ++i) {
      tensors.push_back(Tensor<int64_t>({i, r}));
      works.push_back(cluster.Submit(r, AllReduce(tensors.back())));
      works.back()->AddCallback([&, r, seq = works.back()->info().sequence_number](const Status&) {
        std::lock_guard<std::mutex> lock(mutex);
        completed[r].push_back(seq);
      });
    }
    for (int i = 0; i < kOps; ++i) {
      ASSERT_TRUE(WaitFor(works[i]).ok()) << works[i]->status().ToString();
      EXPECT_EQ(works[i]->info().sequence_number, static_cast<uint64_t>(i + 1));
      EXPECT_EQ(Values(tensors[i]), (std::vector<int64_t>{4 * i, 6}));
    }
    EXPECT_EQ(cluster.of(r).SequenceNumber(r), static_cast<uint64_t>(kOps));
  });
  // Waiters wake before the callbacks run: wait for the last ones.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
  auto all_called = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    size_t called = 0;
    for (const auto& [rank, seqs] : completed) called += seqs.size();
    return called == 4 * kOps;
  };
  while (!all_called() && SteadyClock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  std::vector<uint64_t> in_order(kOps);
  for (int i = 0; i < kOps; ++i) in_order[i] = i + 1;
  std::lock_guard<std::mutex> lock(mutex);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(completed[r], in_order) << "rank " << r;
  EXPECT_EQ(cluster.node(0).SequenceNumber(), static_cast<uint64_t>(kOps));
  EXPECT_EQ(cluster.node(1).SequenceNumber(), static_cast<uint64_t>(kOps));
}

TEST(GroupTest, SequenceNumberIsTheLargestOverLocalRanks_OneNodeTwoRanks) {
  Cluster cluster("seq", {"a", "a"});
  auto first = cluster.Submit(0, AllReduce(Zeros(1)));
  auto second = cluster.Submit(0, AllReduce(Zeros(1)));
  EXPECT_EQ(cluster.node(0).SequenceNumber(0), 2u);
  EXPECT_EQ(cluster.node(0).SequenceNumber(1), 0u);
  EXPECT_EQ(cluster.node(0).SequenceNumber(), 2u);
  EXPECT_EQ(second->info().sequence_number, 2u);
  cluster.Submit(1, AllReduce(Zeros(1)));
  cluster.Submit(1, AllReduce(Zeros(1)));
  EXPECT_TRUE(WaitFor(first).ok());
  EXPECT_TRUE(WaitFor(second).ok());
  // Invalid requests take no sequence number.
  auto invalid = cluster.Submit(0, AllReduce(TensorView{}));
  EXPECT_TRUE(invalid->status().IsInvalidArgument()) << invalid->status().ToString();
  EXPECT_EQ(cluster.node(0).SequenceNumber(0), 2u);
}

TEST(GroupTest, TensorOnAnotherDeviceKindIsRefusedWithoutASequenceNumber_OneNodeTwoRanks) {
  Cluster cluster("devices", {"a", "a"});
  TensorView on_gpu = Zeros(4);
  on_gpu.device = Device{DeviceKind::kCuda, 0};
  auto refused = cluster.Submit(1, AllReduce(on_gpu));
  EXPECT_TRUE(refused->status().IsInvalidArgument()) << refused->status().ToString();
  EXPECT_THAT(refused->status().message(),
              HasSubstr("allreduce on group 'devices' (rank 1): input tensor 0 is on cuda but "
                        "the group's tensors live on cpu"));
  EXPECT_EQ(cluster.node(0).SequenceNumber(1), 0u);
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

// Host memory is done when an op's calls return: no completion event to hand out, so a request's
// on_enqueued is never called and the op completes as any other (on one node and across two).
TEST(GroupTest, HostOpsNeverCallOnEnqueued_TwoNodesTwoRanks) {
  Cluster cluster("enqueued", {"a", "a", "b", "b"});
  std::atomic<int> calls{0};
  std::vector<TensorView> tensors(4);
  ForEachRank(4, [&](int r) {
    tensors[r] = Zeros(1024);
    OpRequest request = AllReduce(tensors[r]);
    request.on_enqueued = [&](const std::string&) { calls.fetch_add(1); };
    EXPECT_TRUE(WaitFor(cluster.Submit(r, std::move(request))).ok());
  });
  EXPECT_EQ(calls.load(), 0);
}

// Small allreduces travel with the signature exchange (one round across sidecars); larger ones
// take the data backend. Both sides of the threshold, every node's contribution combined in the
// same order, and a desync where only some nodes could piggyback.
TEST(GroupTest, SmallAllReducesRideTheSignatureExchangeAndLargerOnesDoNot_TwoNodesTwoRanks) {
  Cluster cluster("piggyback", {"a", "a", "b", "b"});
  const size_t fits = kPiggybackPayloadBytes / sizeof(int64_t);  // 31 x int64 = 248 bytes
  ForEachRank(4, [&](int r) {
    for (size_t count : {size_t{1}, fits, fits + 1, size_t{1000}}) {
      std::vector<int64_t> values(count);
      for (size_t i = 0; i < count; ++i) values[i] = static_cast<int64_t>(i) * (r + 1);
      TensorView t = Tensor<int64_t>(values);
      ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(t))).ok()) << count;
      std::vector<int64_t> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = static_cast<int64_t>(i) * 10;
      EXPECT_EQ(Values(t), want) << "count " << count << " rank " << r;
    }
    // PREMUL_SUM and AVG, as the data path computes them.
    TensorView premul = Tensor<float>({1.0f + static_cast<float>(r), 2.0f});
    Status premul_status = WaitFor(cluster.Submit(r, AllReduce(premul, ReduceOp::PremulSum(0.5))));
    ASSERT_TRUE(premul_status.ok()) << premul_status.ToString();
    EXPECT_EQ(Values<float>(premul), (std::vector<float>{5.0f, 4.0f}));
    TensorView avg = Tensor<float>({1.0f + static_cast<float>(r)});
    ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(avg, ReduceOp::Avg()))).ok());
    EXPECT_EQ(Values<float>(avg), (std::vector<float>{2.5f}));
  });
  // Node b's ranks issue a large op where node a's issue a small one: a desync on every rank,
  // never a mismatched exchange.
  std::vector<Status> results(4);
  ForEachRank(4, [&](int r) {
    results[r] = WaitFor(cluster.Submit(r, AllReduce(Zeros(r >= 2 ? 1000 : 2))));
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].kind(), ErrorKind::kDesync) << results[r].ToString();
  }
  ForEachRank(4, [&](int r) {
    TensorView t = Tensor<int64_t>({r});
    EXPECT_TRUE(WaitFor(cluster.Submit(r, AllReduce(t))).ok());
    EXPECT_EQ(Values(t), std::vector<int64_t>{6});
  });
}

// Rank r's part of two allreduces of `count` elements over a group of three ranks: a SUM of
// i * (r + 1) and an AVG of 3 * (r + 1), every element of the result checked.
void LargeAllReducesOfThreeRanksAreExact(Cluster& cluster, int r, size_t count) {
  std::vector<int64_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<int64_t>(i) * (r + 1);
  TensorView t = Tensor<int64_t>(values);
  ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(t))).ok());
  const std::vector<int64_t> got = Values(t);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(got[i], static_cast<int64_t>(i) * 6) << "element " << i << " rank " << r;
  }
  TensorView avg = Tensor<float>(std::vector<float>(count, 3.0f * static_cast<float>(r + 1)));
  ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(avg, ReduceOp::Avg()))).ok());
  EXPECT_EQ(Values<float>(avg), std::vector<float>(count, 6.0f)) << "rank " << r;
}

// On one sidecar, the local passes over a large tensor run on several threads: every element is
// still combined exactly once and every rank gets the whole result.
TEST(GroupTest, LargeLocalAllReduceSplitAmongThreadsIsExact_OneNodeThreeRanks) {
  Cluster cluster("large-local", {"a", "a", "a"});
  const size_t count = (size_t{9} << 20) / sizeof(int64_t) + 3;  // 9 MiB and a partial chunk
  ForEachRank(3, [&](int r) {
    ASSERT_NO_FATAL_FAILURE(LargeAllReducesOfThreeRanksAreExact(cluster, r, count));
  });
}

// Across nodes, with two ranks on a node, a large allreduce is pipelined: chunk by chunk the
// network reduces while the node combines the next chunk and copies back the last. Every element
// is still combined once, on every rank, whatever the reduction; ops before and after are
// unaffected (the chunks' network calls have tags of their own).
TEST(GroupTest, LargeAllReducePipelinedAcrossNodesIsExact_TwoNodesThreeRanks) {
  Cluster cluster("pipelined", {"a", "a", "b"});
  const size_t count = (size_t{17} << 20) / sizeof(int64_t) + 3;  // five chunks, the last partial
  ForEachRank(3, [&](int r) {
    ASSERT_NO_FATAL_FAILURE(LargeAllReducesOfThreeRanksAreExact(cluster, r, count));
    TensorView premul = Tensor<float>(std::vector<float>(count, 2.0f));
    ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(premul, ReduceOp::PremulSum(0.25)))).ok());
    EXPECT_EQ(Values<float>(premul), std::vector<float>(count, 1.5f)) << "rank " << r;
    TensorView small = Tensor<int64_t>({r});
    ASSERT_TRUE(WaitFor(cluster.Submit(r, AllReduce(small))).ok());
    EXPECT_EQ(Values(small), std::vector<int64_t>{3});
  });
}

}  // namespace
}  // namespace collectived
