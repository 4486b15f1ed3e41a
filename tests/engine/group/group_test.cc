// Group over the in-process fabric: ranks are threads, sidecars are simulated in this process.
#include "engine/group/core/group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/group/transport/in_process/in_process_fabric.h"
#include "engine/store/counting_store.h"
#include "engine/store/memory_store.h"
#include "engine/vocabulary/stable_hash.h"
#include "tests/engine/group/group_cluster.h"

namespace collectived {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

using namespace group_testing;  // NOLINT: the helpers of this suite

// alltoall_single with uneven splits, on rank r of n: it sends j + 1 elements to rank j, valued
// r * 100 + j * 10 + k, and receives r + 1 from each. Returns what its output must hold.
std::vector<int64_t> UnevenAllToAllSingle(int r, int n, OpRequest* request) {
  request->kind = OpKind::kAllToAllSingle;
  std::vector<int64_t> send;
  for (int j = 0; j < n; ++j) {
    request->input_splits.push_back(j + 1);
    request->output_splits.push_back(r + 1);
    for (int k = 0; k <= j; ++k) send.push_back(r * 100 + j * 10 + k);
  }
  request->inputs = {Tensor(send)};
  request->outputs = {Zeros(n * (r + 1))};
  std::vector<int64_t> expected;
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k <= r; ++k) expected.push_back(j * 100 + r * 10 + k);
  }
  return expected;
}

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

// --- timeouts ---

// Timeouts run on a ManualClock: a 30-minute timeout passes in microseconds, and nothing fires
// a moment early or late because the machine is loaded.
Cluster::Options OnManualClock(ManualClock& clock) {
  Cluster::Options options;
  options.clock = &clock;
  return options;
}

constexpr std::chrono::minutes kHalfHour{30};

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
  // Node 0 failed the group and closed its connections: node 1 learns the reason.
  Status late = WaitReally(cluster.Submit(1, AllReduce(Zeros(2))));
  EXPECT_TRUE(late.IsTimeout()) << late.ToString();
  EXPECT_THAT(late.message(), HasSubstr("no answer from sidecar nodes [1]"));
}

// The stuck-op watchdog is the group's timer: an op in flight longer than the threshold is
// reported once, exactly when it passes (no periodic scan), whatever the op's state.
class StuckReports : public OpObserver {
 public:
  void OnOpFinished(const OpRecord&) override {}
  void OnOpStuck(const OpRecord& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    reported_.push_back(record.sequence_number);
  }
  void OnGroupGone(const std::string&) override {}
  void OnBackendAborted(const std::string&, DeviceKind, ErrorKind) override {}
  void OnBackendError(const std::string&, DeviceKind, ErrorKind) override {}
  std::vector<uint64_t> reported() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reported_;
  }

 private:
  std::mutex mutex_;
  std::vector<uint64_t> reported_;
};

TEST(GroupTest, AStuckOpIsReportedOnceWhenItsThresholdPasses_TwoNodesOneRank) {
  ManualClock clock;
  auto reports = std::make_shared<StuckReports>();
  Cluster::Options options = OnManualClock(clock);
  options.stuck_threshold = std::chrono::seconds(60);
  options.timeout = std::chrono::hours(1);
  options.observer = reports;
  Cluster cluster("stuck", {"a", "b"}, options);
  auto first = cluster.Submit(0, AllReduce(Zeros(2)));  // node 1's rank never issues it
  clock.Advance(std::chrono::seconds(30));
  auto second = cluster.Submit(0, AllReduce(Zeros(2)));  // waits behind the first
  clock.Advance(std::chrono::seconds(29));
  cluster.runtime(0).timers().Settle();
  EXPECT_TRUE(reports->reported().empty()) << "reported before its threshold";
  clock.Advance(std::chrono::seconds(1));  // the first op is 60 s old
  cluster.runtime(0).timers().Settle();
  EXPECT_EQ(reports->reported(), std::vector<uint64_t>{1});
  clock.Advance(std::chrono::seconds(29));
  cluster.runtime(0).timers().Settle();
  EXPECT_EQ(reports->reported(), std::vector<uint64_t>{1}) << "reported once";
  clock.Advance(std::chrono::seconds(1));  // the second is 60 s old
  cluster.runtime(0).timers().Settle();
  EXPECT_EQ(reports->reported(), (std::vector<uint64_t>{1, 2}));
  std::vector<OpRecord> flight = cluster.node(0).FlightRecords(0);
  ASSERT_EQ(flight.size(), 2u);
  EXPECT_EQ(flight[0].state, OpRecord::State::kRunning);
  EXPECT_EQ(flight[1].state, OpRecord::State::kWaitingForPeers);
  EXPECT_FALSE(first->IsCompleted());
  EXPECT_FALSE(second->IsCompleted());
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

// --- send / recv ---

TEST(GroupTest, SendRecvBetweenLocalRanksMatchInOrderPerTag_OneNodeTwoRanks) {
  Cluster cluster("p2p-local", {"a", "a"});
  // Two messages on tag 7 arrive in order; a recv on tag 2 posted first is independent.
  TensorView first = Zeros(2), second = Zeros(2), other_tag = Zeros(1);
  auto recv_other = cluster.Submit(1, PointToPointOp(OpKind::kRecv, other_tag, 0, 2));
  auto recv_first = cluster.Submit(1, PointToPointOp(OpKind::kRecv, first, 0, 7));
  auto recv_second = cluster.Submit(1, PointToPointOp(OpKind::kRecv, second, 0, 7));
  auto send_first = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({1, 2}), 1, 7));
  auto send_second =
      cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({3, 4}), 1, 7));
  EXPECT_FALSE(recv_other->IsCompleted());
  auto send_other = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({9}), 1, 2));
  for (auto& work : {recv_first, recv_second, send_first, send_second, recv_other, send_other})
    EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_EQ(Values(first), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Values(second), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Values(other_tag), std::vector<int64_t>{9});
  // Point-to-point ops take no sequence number.
  EXPECT_EQ(cluster.node(0).SequenceNumber(), 0u);
}

TEST(GroupTest, LocalSendRecvSizeMismatchNamesBothSizes_OneNodeTwoRanks) {
  Cluster cluster("p2p-mismatch", {"a", "a"});
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, 0));
  auto send = cluster.Submit(0, PointToPointOp(OpKind::kSend, Zeros(2), 1, 0));
  for (auto& work : {recv, send}) {
    Status status = WaitFor(work);
    EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
    EXPECT_THAT(status.message(),
                HasSubstr("the send has 16 bytes but the matching recv expects 8"));
  }
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, PendingSendsAndRecvsAreBoundedPerGroup_OneNodeTwoRanks) {
  Cluster cluster("p2p-bounded", {"a", "a"});
  std::vector<std::shared_ptr<Work>> pending;
  for (size_t i = 0; i < PointToPoint::kMaxPending; ++i) {
    pending.push_back(
        cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, static_cast<int64_t>(i))));
  }
  auto refused = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, -1));
  ASSERT_TRUE(refused->IsCompleted());
  EXPECT_EQ(refused->status().kind(), ErrorKind::kResourceExhausted)
      << refused->status().ToString();
  EXPECT_THAT(refused->status().message(),
              HasSubstr("recv (rank 1 from rank 0, tag -1) on group 'p2p-bounded': 4096 sends and "
                        "receives of this group are already pending on this sidecar"));
  // A matching send still completes a pending recv, and frees a place.
  TensorView value = Tensor<int64_t>({42});
  EXPECT_TRUE(WaitFor(cluster.Submit(0, PointToPointOp(OpKind::kSend, value, 1, 7))).ok());
  EXPECT_TRUE(WaitFor(pending[7]).ok());
  auto admitted = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, -2));
  EXPECT_FALSE(admitted->IsCompleted());
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, UnmatchedLocalRecvTimesOut_OneNodeTwoRanks) {
  ManualClock clock;
  Cluster cluster("p2p-unmatched", {"a", "a"}, OnManualClock(clock));
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, 3, kHalfHour));
  clock.Advance(kHalfHour - milliseconds(1));
  cluster.runtime(0).timers().Settle();
  EXPECT_FALSE(recv->IsCompleted()) << "a moment early";
  clock.Advance(milliseconds(1));
  Status status = WaitReally(recv);
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("recv (rank 1 from rank 0, tag 3) on group "
                                          "'p2p-unmatched'"));
  EXPECT_THAT(status.message(), HasSubstr(" Timed out after 1800000 ms"));
  // A local timeout does not fail the group.
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, AnySourceRecvTakesTheFirstSendAndNamesItsSender_OneNodeThreeRanks) {
  Cluster cluster("any-local", {"a", "a", "a"});
  // A recv posted first takes whichever rank sends first.
  TensorView first = Zeros(1);
  auto recv_first = cluster.Submit(0, PointToPointOp(OpKind::kRecv, first, kAnySource, 5));
  auto send_two = cluster.Submit(2, PointToPointOp(OpKind::kSend, Tensor<int64_t>({22}), 0, 5));
  ASSERT_TRUE(WaitFor(recv_first).ok()) << recv_first->status().ToString();
  EXPECT_TRUE(WaitFor(send_two).ok());
  EXPECT_EQ(recv_first->source_rank(), 2);
  EXPECT_EQ(Values(first), std::vector<int64_t>{22});
  // Sends waiting before the recv: the one issued first wins, the other waits for the next.
  auto send_one = cluster.Submit(1, PointToPointOp(OpKind::kSend, Tensor<int64_t>({11}), 0, 5));
  auto send_two_again =
      cluster.Submit(2, PointToPointOp(OpKind::kSend, Tensor<int64_t>({23}), 0, 5));
  TensorView second = Zeros(1), third = Zeros(1);
  auto recv_second = cluster.Submit(0, PointToPointOp(OpKind::kRecv, second, kAnySource, 5));
  auto recv_third = cluster.Submit(0, PointToPointOp(OpKind::kRecv, third, kAnySource, 5));
  for (auto& work : {send_one, send_two_again, recv_second, recv_third})
    EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_EQ(recv_second->source_rank(), 1);
  EXPECT_EQ(Values(second), std::vector<int64_t>{11});
  EXPECT_EQ(recv_third->source_rank(), 2);
  EXPECT_EQ(Values(third), std::vector<int64_t>{23});
  // Another tag is another mailbox.
  auto other_tag =
      cluster.Submit(0, PointToPointOp(OpKind::kRecv, Zeros(1), kAnySource, 6, milliseconds(200)));
  auto unmatched =
      cluster.Submit(1, PointToPointOp(OpKind::kSend, Zeros(1), 0, 7, milliseconds(200)));
  Status timed_out = WaitFor(other_tag);
  EXPECT_TRUE(timed_out.IsTimeout()) << timed_out.ToString();
  EXPECT_THAT(timed_out.message(),
              AllOf(HasSubstr("recv (rank 0 from any rank, tag 6) on group 'any-local'"),
                    HasSubstr(" Timed out after 200 ms")));
  EXPECT_TRUE(WaitFor(unmatched).IsTimeout());
  EXPECT_EQ(other_tag->source_rank(), -1);
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, AnySourceRecvAcrossSidecarsConsumesEachSendOnceInOrder_TwoNodesTwoRanks) {
  Cluster cluster("any-remote", {"a", "a", "b", "b"});
  // Rank 0 posts one recv named for rank 2, then five from any rank; ranks 1 (local), 2 and 3
  // (the other sidecar) send two messages each on one tag.
  TensorView named = Zeros(1);
  auto named_recv = cluster.Submit(0, PointToPointOp(OpKind::kRecv, named, 2, 9));
  std::vector<TensorView> received;
  std::vector<std::shared_ptr<Work>> recvs;
  for (int i = 0; i < 5; ++i) {
    received.push_back(Zeros(1));
    recvs.push_back(
        cluster.Submit(0, PointToPointOp(OpKind::kRecv, received.back(), kAnySource, 9)));
  }
  std::vector<std::shared_ptr<Work>> sends;
  for (int k = 0; k < 2; ++k) {
    for (int src : {3, 1, 2}) {
      sends.push_back(cluster.Submit(
          src, PointToPointOp(OpKind::kSend, Tensor<int64_t>({src * 10 + k}), 0, 9)));
    }
  }
  for (auto& work : sends) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  ASSERT_TRUE(WaitFor(named_recv).ok()) << named_recv->status().ToString();
  EXPECT_EQ(named_recv->source_rank(), 2);
  EXPECT_EQ(Values(named), std::vector<int64_t>{20});
  std::map<int, std::vector<int64_t>> by_sender;
  for (size_t i = 0; i < recvs.size(); ++i) {
    ASSERT_TRUE(WaitFor(recvs[i]).ok()) << recvs[i]->status().ToString();
    const int src = recvs[i]->source_rank();
    EXPECT_EQ(Values(received[i])[0] / 10, src) << "recv " << i;
    by_sender[src].push_back(Values(received[i])[0]);
  }
  EXPECT_EQ(by_sender[1], (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(by_sender[2], (std::vector<int64_t>{21}));
  EXPECT_EQ(by_sender[3], (std::vector<int64_t>{30, 31}));
  // A send announced before any recv waits for it; a recv from any rank then takes it.
  auto early = cluster.Submit(3, PointToPointOp(OpKind::kSend, Tensor<int64_t>({77}), 1, 4));
  std::this_thread::sleep_for(milliseconds(50));
  TensorView late = Zeros(1);
  auto late_recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, late, kAnySource, 4));
  EXPECT_TRUE(WaitFor(early).ok()) << early->status().ToString();
  ASSERT_TRUE(WaitFor(late_recv).ok()) << late_recv->status().ToString();
  EXPECT_EQ(late_recv->source_rank(), 3);
  EXPECT_EQ(Values(late), std::vector<int64_t>{77});
  EXPECT_TRUE(cluster.node(0).failure().ok());
  EXPECT_TRUE(cluster.node(1).failure().ok());
}

TEST(GroupTest, SendRecvBetweenSidecarsMatchInOrderPerTag_TwoNodesTwoRanks) {
  Cluster cluster("p2p-remote", {"a", "a", "b", "b"});
  TensorView first = Zeros(2), second = Zeros(2), other_tag = Zeros(1), back = Zeros(3);
  auto send_first = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({1, 2}), 3, 7));
  auto send_second =
      cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({3, 4}), 3, 7));
  auto recv_other = cluster.Submit(3, PointToPointOp(OpKind::kRecv, other_tag, 0, 8));
  auto recv_first = cluster.Submit(3, PointToPointOp(OpKind::kRecv, first, 0, 7));
  auto recv_second = cluster.Submit(3, PointToPointOp(OpKind::kRecv, second, 0, 7));
  auto send_other = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({9}), 3, 8));
  auto recv_back = cluster.Submit(1, PointToPointOp(OpKind::kRecv, back, 2, 7));
  auto send_back =
      cluster.Submit(2, PointToPointOp(OpKind::kSend, Tensor<int64_t>({5, 6, 7}), 1, 7));
  for (auto& work : {send_first, send_second, recv_other, recv_first, recv_second, send_other,
                     recv_back, send_back})
    EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_EQ(Values(first), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Values(second), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Values(other_tag), std::vector<int64_t>{9});
  EXPECT_EQ(Values(back), (std::vector<int64_t>{5, 6, 7}));
  // Collectives still run after (and independently of) point-to-point traffic.
  ForEachRank(4, [&](int r) { EXPECT_TRUE(WaitFor(cluster.Submit(r, AllReduce(Zeros(1)))).ok()); });
  EXPECT_EQ(cluster.node(0).SequenceNumber(), 1u);
}

// Streams are matched by their exact (source, destination, tag): many tags between one pair and
// one tag between many pairs, sends and recvs interleaved in different orders, each recv gets its
// own message. Tags 1 and 2^32 once shared a slot (a 32-bit hash of the tag, h ^ h >> 32), as did
// t and t + 2^32.
TEST(GroupTest, SendRecvKeepEveryPairAndTagApart_TwoNodesTwoRanks) {
  Cluster cluster("p2p-keys", {"a", "a", "b", "b"});
  constexpr int64_t kHigh = int64_t{1} << 32;
  const std::vector<int64_t> tags = {0, 1,         kHigh,     kHigh + 1, -1,        -kHigh,
                                     7, 7 + kHigh, 7 - kHigh, INT64_MAX, INT64_MIN, 0x7fffffff};
  // Local (0 -> 1, 3 -> 2) and across the sidecars (0 -> 3, 2 -> 1, 1 -> 2, 3 -> 0).
  const std::vector<std::pair<int, int>> pairs = {{0, 1}, {3, 2}, {0, 3}, {2, 1}, {1, 2}, {3, 0}};
  auto value = [&](size_t pair, size_t tag) { return static_cast<int64_t>(1000 * pair + tag); };
  std::map<std::pair<size_t, size_t>, TensorView> received;
  std::map<std::pair<size_t, size_t>, std::shared_ptr<Work>> recvs;
  std::vector<std::shared_ptr<Work>> sends;
  auto post_recv = [&](size_t p, size_t t) {
    received[{p, t}] = Zeros(1);
    recvs[{p, t}] = cluster.Submit(
        pairs[p].second, PointToPointOp(OpKind::kRecv, received[{p, t}], pairs[p].first, tags[t]));
  };
  // Recvs of the even tags first, newest pair and tag first; then the sends, pair by pair within
  // each tag; then the recvs of the odd tags.
  for (size_t t = tags.size(); t-- > 0;) {
    for (size_t p = pairs.size(); p-- > 0;) {
      if (t % 2 == 0) post_recv(p, t);
    }
  }
  for (size_t t = 0; t < tags.size(); ++t) {
    for (size_t p = 0; p < pairs.size(); ++p) {
      sends.push_back(cluster.Submit(
          pairs[p].first,
          PointToPointOp(OpKind::kSend, Tensor<int64_t>({value(p, t)}), pairs[p].second, tags[t])));
    }
  }
  for (size_t t = 0; t < tags.size(); ++t) {
    for (size_t p = 0; p < pairs.size(); ++p) {
      if (t % 2 == 1) post_recv(p, t);
    }
  }
  for (auto& work : sends) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  for (auto& [key, work] : recvs) {
    const auto [p, t] = key;
    ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
    EXPECT_EQ(work->source_rank(), pairs[p].first);
    EXPECT_EQ(Values(received[key]), std::vector<int64_t>{value(p, t)})
        << "rank " << pairs[p].first << " to rank " << pairs[p].second << ", tag " << tags[t];
  }
  EXPECT_TRUE(cluster.node(0).failure().ok());
  EXPECT_TRUE(cluster.node(1).failure().ok());
}

TEST(GroupTest, RemoteSendRecvSizeMismatchNamesBothSizes_TwoNodesOneRank) {
  // The receiving sidecar knows the size from the envelope: the recv fails naming both sizes;
  // the bytes were taken (and dropped, into scratch memory), so the stream stays in step.
  Cluster cluster("p2p-remote-mismatch", {"a", "b"});
  ExpectARemoteSizeMismatchKeepsTheStreamInStep(cluster, Device{});
}

TEST(GroupTest, UnmatchedRemoteRecvTimesOutWithoutFailingTheGroup_TwoNodesOneRank) {
  ManualClock clock;
  Cluster cluster("p2p-remote-unmatched", {"a", "b"}, OnManualClock(clock));
  auto unmatched = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, 4, kHalfHour));
  clock.Advance(kHalfHour);
  Status status = WaitReally(unmatched);
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("recv (rank 1 from rank 0, tag 4) on group "
                                          "'p2p-remote-unmatched'"));
  EXPECT_THAT(status.message(), HasSubstr(" Timed out after 1800000 ms"));
  // No send was announced, so no transfer was started: the recv waited here and its timeout
  // leaves the group working.
  EXPECT_TRUE(cluster.node(1).failure().ok());
  TensorView value = Zeros(1);
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, value, 0, 4));
  EXPECT_TRUE(
      WaitReally(cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({5}), 1, 4)))
          .ok());
  EXPECT_TRUE(WaitReally(recv).ok()) << recv->status().ToString();
  EXPECT_EQ(Values(value), std::vector<int64_t>{5});
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

// --- what the metrics are told about the data backend ---

// Counts the backend reports of every node, as "abort:<kind>" and "error:<kind>".
class BackendReports : public OpObserver {
 public:
  void OnOpFinished(const OpRecord&) override {}
  void OnOpStuck(const OpRecord&) override {}
  void OnGroupGone(const std::string&) override {}
  void OnBackendAborted(const std::string& group, DeviceKind device, ErrorKind reason) override {
    Add(group, device, "abort:" + std::string(ErrorKindName(reason)));
  }
  void OnBackendError(const std::string& group, DeviceKind device, ErrorKind kind) override {
    Add(group, device, "error:" + std::string(ErrorKindName(kind)));
  }
  std::map<std::string, int> Counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  void Add(const std::string& group, DeviceKind device, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counts_[group + " " + std::string(DeviceKindName(device)) + " " + what];
  }
  std::mutex mutex_;
  std::map<std::string, int> counts_;
};

TEST(GroupTest, BackendAbortsAreReportedOncePerNodeAndNotForAnIdleTeardown_TwoNodesTwoRanks) {
  auto reports = std::make_shared<BackendReports>();
  Cluster::Options options;
  options.observer = reports;
  {
    Cluster idle("idle", {"a", "a", "b", "b"}, options);
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < 4; ++r) works.push_back(idle.Submit(r, AllReduce(Zeros(4))));
    for (auto& work : works) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  }  // every node stopped, none in use
  EXPECT_TRUE(reports->Counts().empty());

  Cluster cluster("aborted", {"a", "a", "b", "b"}, options);
  auto pending = cluster.Submit(0, AllReduce(Zeros(1)));  // rank 1 never issues
  std::vector<std::shared_ptr<Work>> remote;
  for (int r : {2, 3}) remote.push_back(cluster.Submit(r, AllReduce(Zeros(1))));
  cluster.node(0).Fail(Status::Aborted("operator abort"));
  cluster.node(0).Fail(Status::Internal("second"));  // the first reason wins: no new report
  EXPECT_EQ(WaitFor(pending).kind(), ErrorKind::kAborted);
  for (auto& work : remote) EXPECT_EQ(WaitFor(work).kind(), ErrorKind::kAborted);
  const auto deadline = SteadyClock::now() + std::chrono::seconds(5);
  while (reports->Counts()["aborted cpu abort:aborted"] < 2 && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(reports->Counts(), (std::map<std::string, int>{{"aborted cpu abort:aborted", 2}}));
}

TEST(GroupTest, APeerKilledDuringTheDataPhaseIsABackendError_TwoNodesOneRank) {
  auto reports = std::make_shared<BackendReports>();
  Cluster::Options options;
  options.observer = reports;
  options.publish_failures = false;
  Cluster cluster("data-phase", {"a", "b"}, options);
  // Node 1 is slow: its signature exchange ends after 1 s, then node 0 waits in the allreduce
  // itself for another second; node 1 dies half way through that wait.
  ASSERT_TRUE(cluster.fabric().DelayNode("data-phase", 1, milliseconds(1000)).ok());
  auto survivor = cluster.Submit(0, AllReduce(Zeros(1 << 16)));
  auto victim = cluster.Submit(1, AllReduce(Zeros(1 << 16)));
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_TRUE(cluster.fabric().KillNode("data-phase", 1).ok());
  EXPECT_EQ(WaitFor(survivor).kind(), ErrorKind::kPeerLost) << survivor->status().ToString();
  EXPECT_FALSE(WaitFor(victim).ok());
  // Both nodes' backend calls failed (in process, the killed node's own calls fail too).
  EXPECT_EQ(reports->Counts(), (std::map<std::string, int>{{"data-phase cpu error:peer_lost", 2},
                                                           {"data-phase cpu abort:peer_lost", 2}}));
}

// --- what an operator sees ---

TEST(GroupTest, InFlightAndFlightRecordsShowPendingOps_OneNodeTwoRanks) {
  Cluster cluster("flight", {"a", "a"});
  auto first = cluster.Submit(0, AllReduce(Tensor<float>({1, 2, 3})));
  std::vector<InFlightOp> in_flight = cluster.node(0).InFlight();
  ASSERT_EQ(in_flight.size(), 1u);
  EXPECT_EQ(in_flight[0].sequence_number, 1u);
  EXPECT_EQ(in_flight[0].op, "allreduce");
  EXPECT_EQ(in_flight[0].arrived_local_ranks, std::vector<int>{0});
  EXPECT_EQ(in_flight[0].missing_local_ranks, std::vector<int>{1});
  std::vector<OpRecord> records = cluster.node(0).FlightRecords(0);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, OpRecord::State::kWaitingForPeers);
  EXPECT_EQ(records[0].sequence_number, 1u);
  EXPECT_EQ(records[0].kind, OpKind::kAllReduce);
  EXPECT_EQ(records[0].dtype, DType::kFloat32);
  EXPECT_EQ(records[0].count, 3u);
  EXPECT_EQ(records[0].missing_ranks, std::vector<int>{1});

  auto second = cluster.Submit(1, AllReduce(Tensor<float>({1, 2, 3})));
  ASSERT_TRUE(WaitFor(first).ok());
  ASSERT_TRUE(WaitFor(second).ok());
  EXPECT_TRUE(cluster.node(0).InFlight().empty());
  records = cluster.node(0).FlightRecords(0);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, OpRecord::State::kCompleted);
  EXPECT_TRUE(records[0].status.ok());
  EXPECT_EQ(records[0].last_rank, 1);
}

// --- through the registry: one GroupRegistry per sidecar, one shared store ---

class RegistryCluster {
 public:
  explicit RegistryCluster(std::vector<std::string> sidecar_of_rank)
      : sidecar_of_rank_(std::move(sidecar_of_rank)) {
    for (const auto& id : sidecar_of_rank_) {
      if (registries_.count(id)) continue;
      GroupRegistryOptions options;
      options.sidecar_id = id;
      options.transports = fabric_;
      registries_[id] = std::make_unique<GroupRegistry>(options);
    }
  }
  // The registries reap the groups that left only once their threads have exited: wait for
  // that, so none is left running at the registry's destruction.
  ~RegistryCluster() {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
    for (const auto& weak : joined_) {
      while (SteadyClock::now() < deadline) {
        std::shared_ptr<Group> group = weak.lock();
        if (!group || group->Quiescent()) break;
        group.reset();
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
    registries_.clear();
  }

  StatusOr<Membership> Join(const std::string& name, int rank, milliseconds timeout) {
    JoinRequest request;
    request.name = name;
    request.rank = rank;
    request.world_size = static_cast<int>(sidecar_of_rank_.size());
    request.store = store_;
    request.store_prefix = "test";
    request.timeout = timeout;
    StatusOr<Membership> membership = registries_[sidecar_of_rank_[rank]]->Join(request);
    if (membership.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      joined_.push_back(membership->group);
    }
    return membership;
  }
  GroupRegistry& registry(const std::string& id) { return *registries_[id]; }
  InProcessFabric& fabric() { return *fabric_; }
  CountingStore& store() { return *store_; }

 private:
  std::vector<std::string> sidecar_of_rank_;
  std::shared_ptr<InProcessFabric> fabric_ = InProcessFabric::Create();
  std::shared_ptr<CountingStore> store_ =
      std::make_shared<CountingStore>(std::make_shared<MemoryStore>());
  std::map<std::string, std::unique_ptr<GroupRegistry>> registries_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<Group>> joined_;  // guarded by mutex_
};

// Formation costs the store a fixed number of calls per rank and keys named per rank, whatever
// the group's size: no rank waits on every rank's key (which made the store's work grow as R^2).
TEST(GroupRegistryOverFabricTest, FormationCostsTheStoreTheSameForEveryRankWhateverTheSize) {
  std::vector<CountingStore::Counts> per_size;
  for (int ranks : {8, 64}) {
    std::vector<std::string> sidecar_of_rank;
    for (int r = 0; r < ranks; ++r) sidecar_of_rank.push_back("s" + std::to_string(r % 4));
    RegistryCluster cluster(sidecar_of_rank);
    std::vector<Status> results(ranks);
    ForEachRank(
        ranks, [&](int r) { results[r] = cluster.Join("sized", r, milliseconds(20000)).status(); });
    for (int r = 0; r < ranks; ++r) ASSERT_TRUE(results[r].ok()) << results[r].ToString();
    per_size.push_back(cluster.store().counts());
    const CountingStore::Counts& c = per_size.back();
    std::printf("%d ranks over 4 sidecars: %.2f store calls, %.2f keys per rank\n", ranks,
                static_cast<double>(c.calls) / ranks, static_cast<double>(c.keys) / ranks);
  }
  // Per rank: the token, its incarnation, its announcement, the arrivals, the count, the
  // membership; per sidecar: one read of the membership; once: the assembler's reads of the R
  // announcements. So calls per rank are the same for 8 and 64 ranks, give or take the once.
  const double calls8 = static_cast<double>(per_size[0].calls) / 8;
  const double calls64 = static_cast<double>(per_size[1].calls) / 64;
  EXPECT_LE(calls64, calls8 + 0.5);
  EXPECT_LE(calls64, 9.0);
  // Keys named per rank grow by at most the assembler's one read of R keys (1 per rank).
  const double keys8 = static_cast<double>(per_size[0].keys) / 8;
  const double keys64 = static_cast<double>(per_size[1].keys) / 64;
  EXPECT_LE(keys64, keys8 + 1.5);
}

// Ranks that never join are named, the first few and then how many more: the message stays
// short for a group of thousands.
TEST(GroupRegistryOverFabricTest, RanksThatNeverJoinAreNamedInBoundedText) {
  std::vector<std::string> sidecar_of_rank;
  for (int r = 0; r < 200; ++r) sidecar_of_rank.push_back("s" + std::to_string(r % 2));
  RegistryCluster cluster(sidecar_of_rank);
  // Ranks 0..9 come; 10..199 never do.
  std::vector<Status> results(10);
  ForEachRank(10,
              [&](int r) { results[r] = cluster.Join("partial", r, milliseconds(500)).status(); });
  for (const Status& status : results) {
    EXPECT_TRUE(status.IsTimeout()) << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr("190 of 200 group ranks [10, 11, 12,"),
                                        HasSubstr("... and 174 more] (global ranks [10, 11,"),
                                        HasSubstr("never joined")));
    EXPECT_LT(status.message().size(), 400u) << status.message();
  }
}

// The same with a job token: the arrivals list is read beneath the group's signed records.
TEST(GroupRegistryOverFabricTest, RanksThatNeverJoinAreNamedWhenTheGroupHasAJobToken) {
  RegistryCluster cluster({"a", "b", "b"});
  JoinRequest request;
  request.name = "tokened";
  request.rank = 0;
  request.world_size = 3;
  request.store = std::make_shared<MemoryStore>();
  request.timeout = milliseconds(300);
  request.job_token = "secret-token";
  Status status = cluster.registry("a").Join(request).status();
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("2 of 3 group ranks [1, 2] (global ranks [1, 2]) never "
                                          "joined"));
}

TEST(GroupRegistryOverFabricTest, JoinRunLeaveAndJoinAgain_TwoNodesTwoRanks) {
  RegistryCluster cluster({"a", "a", "b", "b"});
  for (int incarnation = 0; incarnation < 2; ++incarnation) {
    ForEachRank(4, [&](int r) {
      StatusOr<Membership> membership = cluster.Join("g", r, milliseconds(5000));
      ASSERT_TRUE(membership.ok()) << membership.status().ToString();
      EXPECT_EQ(membership->group_rank, r);
      EXPECT_EQ(membership->group->topology().node_count(), 2);
      TensorView t = Tensor<int64_t>({r, 1});
      EXPECT_TRUE(WaitFor(membership->group->Submit(r, AllReduce(t))).ok());
      EXPECT_EQ(Values(t), (std::vector<int64_t>{6, 4}));
      EXPECT_EQ(membership->group->SequenceNumber(r), 1u);
    });
    ForEachRank(
        4, [&](int r) { EXPECT_TRUE(cluster.registry(r < 2 ? "a" : "b").Leave("g", r).ok()); });
    // The last sidecar to leave removes the incarnation's keys (on its watchdog thread): only
    // the 4 ranks' incarnation counters and the token commitment stay.
    const auto deadline = SteadyClock::now() + std::chrono::seconds(5);
    while (cluster.store().NumKeys().value() != 5 && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));
    }
    EXPECT_EQ(cluster.store().NumKeys().value(), 5) << "incarnation " << incarnation;
    EXPECT_FALSE(*cluster.store().Check({GroupKeys("test", "g", incarnation + 1).Rank(0)}));
  }
}

TEST(GroupRegistryOverFabricTest, FailGroupReachesThePeerSidecarThroughTheStore_TwoNodesOneRank) {
  RegistryCluster cluster({"a", "b"});
  std::vector<std::shared_ptr<Group>> groups(2);
  ForEachRank(2, [&](int r) {
    StatusOr<Membership> membership = cluster.Join("g", r, milliseconds(5000));
    ASSERT_TRUE(membership.ok()) << membership.status().ToString();
    groups[r] = membership->group;
  });
  ASSERT_TRUE(groups[0] && groups[1]);
  auto pending = groups[1]->Submit(1, AllReduce(Zeros(1)));
  ASSERT_TRUE(cluster.registry("a").FailGroup("g", Status::Aborted("operator abort")).ok());
  Status status = WaitFor(pending);
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("operator abort"));
  const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
  while (groups[1]->failure().ok() && SteadyClock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(groups[1]->failure().kind(), ErrorKind::kAborted);
  groups.clear();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(cluster.registry(r == 0 ? "a" : "b").Leave("g", r).ok());
}

TEST(GroupRegistryOverFabricTest, AbsurdWorldSizesMembersAndTimeoutsAreRefusedAtOnce) {
  RegistryCluster cluster({"a"});
  JoinRequest request;
  request.name = "huge";
  request.rank = 0;
  request.world_size = std::numeric_limits<int>::max();
  request.store = std::make_shared<MemoryStore>();
  StatusOr<Membership> huge = cluster.registry("a").Join(request);
  EXPECT_TRUE(huge.status().IsInvalidArgument()) << huge.status().ToString();
  EXPECT_THAT(huge.status().message(),
              HasSubstr("world size 2147483647 is larger than 131072, the most this sidecar "
                        "accepts"));

  request.world_size = 2;
  request.members = {0, 1, 1};
  StatusOr<Membership> members = cluster.registry("a").Join(request);
  EXPECT_THAT(members.status().message(), HasSubstr("3 members listed for world size 2"));

  request.members = {};
  request.world_size = 1;
  request.timeout = milliseconds::max();
  StatusOr<Membership> forever = cluster.registry("a").Join(request);
  EXPECT_TRUE(forever.status().IsInvalidArgument()) << forever.status().ToString();
  EXPECT_THAT(forever.status().message(), HasSubstr("longer than the longest accepted"));
}

TEST(GroupRecordsTest, AnnouncementsCarryAFixedSizeMembersDigestAndRoundTrip) {
  std::vector<int> many(1024);
  for (int r = 0; r < 1024; ++r) many[r] = r;
  const RankAnnouncement announced{
      "sidecar-7", 2048,           MembersDigest(many), JobTokenCommitment("t", "scope"),
      "cuda:3",    "10.0.0.7:7490"};
  const std::string record = EncodeAnnouncement(announced);
  EXPECT_LT(record.size(), 160u);  // whatever the number of members
  StatusOr<RankAnnouncement> decoded = DecodeAnnouncement(record);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->sidecar_id, "sidecar-7");
  EXPECT_EQ(decoded->world_size, 2048);
  EXPECT_TRUE(decoded->SameGroupAs(announced));
  EXPECT_EQ(decoded->device, "cuda:3");
  EXPECT_EQ(decoded->admin_address, "10.0.0.7:7490");

  std::vector<int> other = many;
  other.back() = 1500;
  EXPECT_NE(MembersDigest(other), MembersDigest(many));
  EXPECT_NE(MembersDigest({0, 1}), MembersDigest({0, 1, 2}));
  EXPECT_EQ(MembersDigest({0, 1}), MembersDigest({0, 1}));

  // A record of the earlier format (the members listed) is refused by name, not half-read.
  StatusOr<RankAnnouncement> old = DecodeAnnouncement("cd11:a1:23:0,11:x");
  EXPECT_TRUE(old.status().IsInvalidArgument());
  EXPECT_THAT(old.status().message(), HasSubstr("rank announcement record is malformed: unknown "
                                                "version"));
}

TEST(GroupRecordsTest, MembershipNamesEachSidecarOnceAndRoundTrips) {
  std::vector<std::string> announcements;
  for (int r = 0; r < 6; ++r) {
    const std::string sidecar = r % 3 == 0 ? "a" : (r % 3 == 1 ? "b" : "c");
    announcements.push_back(EncodeAnnouncement(
        {sidecar, 6, MembersDigest({0, 1, 2, 3, 4, 5}), "none", "cpu", sidecar + ":7490"}));
  }
  GroupMembership membership = AssembleMembership("m", announcements);
  ASSERT_TRUE(membership.refusal.ok()) << membership.refusal.ToString();
  EXPECT_EQ(membership.sidecar_ids, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(membership.admin_addresses, (std::vector<std::string>{"a:7490", "b:7490", "c:7490"}));
  EXPECT_EQ(membership.sidecar_of_rank, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  const std::string record = EncodeMembership(membership);
  EXPECT_EQ(record, "cm11:00:1:31:a6:a:74901:b6:b:74901:c6:c:749012:0,1,2,0,1,2,");
  StatusOr<GroupMembership> decoded = DecodeMembership(record);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->sidecar_ids, membership.sidecar_ids);
  EXPECT_EQ(decoded->admin_addresses, membership.admin_addresses);
  EXPECT_EQ(decoded->sidecar_of_rank, membership.sidecar_of_rank);

  // A record that is not one, or that points outside its sidecars, is refused by name.
  for (const char* bad : {"cm11:00:1:12:a1:x2:5,", "cm11:00:1:12:a1:x0:", "cd11:00:", "cm11:00:1:-",
                          "cm11:00:1:12:a1:x2:0,1"}) {
    StatusOr<GroupMembership> refused = DecodeMembership(bad);
    EXPECT_TRUE(refused.status().IsInvalidArgument()) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("membership record is malformed")) << bad;
  }
}

TEST(GroupRecordsTest, MembershipRefusalsNameTheRanksThatDisagree) {
  const std::string digest = MembersDigest({0, 1, 2});
  auto announce = [&](const std::string& sidecar, const std::string& members_digest,
                      const std::string& token, const std::string& device) {
    return EncodeAnnouncement({sidecar, 3, members_digest, token, device, ""});
  };
  struct Case {
    std::vector<std::string> announcements;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{announce("a", digest, "t", "cpu"), announce("b", MembersDigest({0, 2}), "t", "cpu"),
        announce("b", digest, "t", "cpu")},
       "group rank 1 named different members or world size than group rank 0"},
      {{announce("a", digest, "t", "cpu"), announce("b", digest, "t", "cpu"),
        announce("b", digest, "u", "cpu")},
       "group rank 2 presented a different job token than group rank 0"},
      {{announce("a", digest, "t", "cuda:0"), announce("b", digest, "t", "cpu"),
        announce("b", digest, "t", "cpu")},
       "a group's tensors must all live on one kind of device"},
      {{announce("a", digest, "t", "cuda:0"), announce("b", digest, "t", "cuda:0"),
        announce("b", digest, "t", "cuda:1")},
       "the ranks of a group on one sidecar must share one GPU"},
      {{announce("a", digest, "t", "cpu"), "garbage", announce("b", digest, "t", "cpu")},
       "group 'g': group rank 1"},
  };
  for (const Case& c : cases) {
    GroupMembership refused = AssembleMembership("g", c.announcements);
    EXPECT_TRUE(refused.refusal.IsInvalidArgument()) << c.expected;
    EXPECT_THAT(refused.refusal.message(), HasSubstr(c.expected));
    // Every rank reads the same refusal from the record.
    StatusOr<GroupMembership> decoded = DecodeMembership(EncodeMembership(refused));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->refusal.ToString(), refused.refusal.ToString());
  }
}

// A membership's placement becomes the topology every sidecar builds alike; one that lists a
// sidecar with no rank, or places a rank outside its sidecars, is refused.
TEST(GroupRecordsTest, TopologyFromAMembershipsPlacement) {
  StatusOr<GroupTopology> topology = GroupTopology::FromNodeOfRank({0, 1, 0, 1}, {"a", "b"}, "b");
  ASSERT_TRUE(topology.ok()) << topology.status().ToString();
  EXPECT_EQ(topology->my_node, 1);
  EXPECT_EQ(topology->ranks_of_node, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(topology->node_major_position, (std::vector<int>{0, 2, 1, 3}));
  StatusOr<GroupTopology> by_ids = GroupTopology::FromSidecarIds({"a", "b", "a", "b"}, "b");
  ASSERT_TRUE(by_ids.ok());
  EXPECT_EQ(by_ids->ranks_of_node, topology->ranks_of_node);
  EXPECT_EQ(by_ids->node_ids, topology->node_ids);

  EXPECT_THAT(GroupTopology::FromNodeOfRank({0, 0}, {"a", "b"}, "a").status().message(),
              HasSubstr("sidecar b is listed but hosts no rank"));
  EXPECT_TRUE(GroupTopology::FromNodeOfRank({0, 2}, {"a", "b"}, "a").status().IsInvalidArgument());
  EXPECT_THAT(GroupTopology::FromNodeOfRank({0, 1}, {"a", "b"}, "c").status().message(),
              HasSubstr("sidecar c hosts no rank"));
}

TEST(GroupRecordsTest, RankListsInMessagesAreBounded) {
  EXPECT_EQ(FormatRanksBounded({1, 3}), "[1, 3]");
  std::vector<int> many(1000);
  for (int r = 0; r < 1000; ++r) many[r] = r * 2;
  EXPECT_EQ(FormatRanksBounded(many, 3), "[0, 2, 4, ... and 997 more]");
  EXPECT_LT(FormatRanksBounded(many).size(), 120u);
}

// FNV-1a 64's published test vectors (http://www.isthe.com/chongo/tech/comp/fnv/).
TEST(GroupRecordsTest, Fnv1a64GivesItsKnownAnswers) {
  static_assert(Fnv1a64("") == 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
  // Bytes over 0x7f are taken unsigned, whatever the signedness of char.
  EXPECT_EQ(Fnv1a64("\xff"), (0xcbf29ce484222325ull ^ 0xffull) * 0x100000001b3ull);
}

// The digest is part of the records sidecars of different builds exchange: a change of its
// scheme must change the announcement version, and this test says so.
TEST(GroupRecordsTest, MembersDigestOfAFixedMembershipIsAFixedString) {
  EXPECT_EQ(MembersDigest({0, 1, 2, 3}), "4:26d7e95ec6a0944d");  // FNV-1a 64 of "0,1,2,3,"
  EXPECT_EQ(MembersDigest({0, 2, 5, 7}), "4:9867d00f4c1742b5");
  EXPECT_EQ(MembersDigest({}), "0:cbf29ce484222325");
  const RankAnnouncement announced{"s", 4, MembersDigest({0, 1, 2, 3}), "t", "cpu", "h:1"};
  EXPECT_EQ(EncodeAnnouncement(announced), "cd51:s1:418:4:26d7e95ec6a0944d1:t3:cpu3:h:1");
  // An announcement of the std::hash era (version 3), or of version 4 (no listener address), is
  // refused by its version, not read as members that disagree.
  for (const char* older_record :
       {"cd31:s1:412:4:12345678901:t3:cpu", "cd41:s1:418:4:26d7e95ec6a0944d1:t3:cpu"}) {
    StatusOr<RankAnnouncement> older = DecodeAnnouncement(older_record);
    EXPECT_THAT(older.status().message(), HasSubstr("unknown version"));
  }
}

// Ranks announce a digest of the members they name, not the list: ranks that disagree about the
// members (or the job token) are still refused when the group is formed, on every sidecar.
TEST(GroupRegistryOverFabricTest, RanksThatDisagreeOnMembersOrTokenAreRefused_TwoNodesOneRank) {
  RegistryCluster cluster({"a", "b", "b"});
  auto store = std::make_shared<MemoryStore>();
  // Global ranks 0 and 2 are group ranks 0 and 1 of a group of 2 in both lists, so they meet
  // under the same keys, but they name different members.
  std::vector<JoinRequest> requests(2);
  for (int r = 0; r < 2; ++r) {
    requests[r].name = "disagree";
    requests[r].world_size = 3;
    requests[r].store = store;
    requests[r].timeout = milliseconds(5000);
  }
  requests[0].rank = 0;
  requests[0].members = {0, 2};
  requests[1].rank = 2;
  requests[1].members = {1, 2};
  std::vector<Status> results(2);
  ForEachRank(2, [&](int r) {
    results[r] = cluster.registry(r == 0 ? "a" : "b").Join(requests[r]).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r].IsInvalidArgument()) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("named different members or world size"));
  }
}

// Naming no members means the whole world: such ranks meet ranks that list every rank, and a
// sidecar that computed the whole world's digest for one size does not reuse it for another.
TEST(GroupRegistryOverFabricTest, RanksNamingNoMembersMeetRanksListingTheWholeWorld) {
  RegistryCluster cluster({"a", "a", "b"});
  auto store = std::make_shared<MemoryStore>();
  auto join_all = [&](const std::string& name, const std::vector<std::string>& sidecars,
                      const std::vector<std::vector<int>>& members) {
    const int ranks = static_cast<int>(sidecars.size());
    std::vector<StatusOr<Membership>> results(ranks, Status::Unavailable("not run"));
    ForEachRank(ranks, [&](int r) {
      JoinRequest request;
      request.name = name;
      request.rank = r;
      request.world_size = ranks;
      request.members = members[r];
      request.store = store;
      request.timeout = milliseconds(5000);
      results[r] = cluster.registry(sidecars[r]).Join(request);
    });
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(results[r].ok())
          << name << " rank " << r << ": " << results[r].status().ToString();
      EXPECT_EQ(results[r]->group_rank, r);
      EXPECT_EQ(results[r]->group->topology().group_size, ranks);
      (void)cluster.registry(sidecars[r]).Leave(name, r);
    }
  };
  join_all("world-of-3", {"a", "a", "b"}, {{}, {0, 1, 2}, {}});
  join_all("world-of-2", {"a", "b"}, {{}, {0, 1}});
  join_all("world-of-2-again", {"b", "a"}, {{0, 1}, {}});
}

// The job token is fixed by group rank 0; a joiner presenting another one (or none) is refused
// alone, before it takes an incarnation, and the rightful ranks still form the group.
TEST(GroupRegistryOverFabricTest, WrongJobTokenIsRefusedAloneAndTheRightfulRanksFormTheGroup) {
  RegistryCluster cluster({"a", "b"});
  auto store = std::make_shared<MemoryStore>();
  auto request = [&](int rank, std::string token) {
    JoinRequest join;
    join.name = "tokens";
    join.rank = rank;
    join.world_size = 2;
    join.store = store;
    join.timeout = milliseconds(20000);
    join.job_token = std::move(token);
    return join;
  };
  StatusOr<Membership> rank0 = Status::Internal("not run");
  std::thread first([&] { rank0 = cluster.registry("a").Join(request(0, "job-secret")); });
  // Intruders on the other sidecar, while rank 0 waits: a wrong token, and no token.
  Status wrong = cluster.registry("b").Join(request(1, "guess")).status();
  EXPECT_EQ(wrong.kind(), ErrorKind::kPermissionDenied) << wrong.ToString();
  EXPECT_THAT(wrong.message(),
              HasSubstr("the job token presented is not the one the group was created with"));
  EXPECT_THAT(wrong.message(), Not(HasSubstr("guess")));
  EXPECT_THAT(wrong.message(), Not(HasSubstr("job-secret")));
  Status huge = cluster.registry("b").Join(request(1, std::string(5000, 'x'))).status();
  EXPECT_TRUE(huge.IsInvalidArgument()) << huge.ToString();
  EXPECT_THAT(huge.message(), HasSubstr("the job token has 5000 bytes"));
  Status none = cluster.registry("b").Join(request(1, "")).status();
  EXPECT_EQ(none.kind(), ErrorKind::kPermissionDenied) << none.ToString();
  EXPECT_THAT(none.message(), HasSubstr("created with a job token and this rank presented none"));

  StatusOr<Membership> rank1 = cluster.registry("b").Join(request(1, "job-secret"));
  first.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status().ToString();
  ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
  EXPECT_TRUE(rank0->group->AcceptsJobToken("job-secret"));
  EXPECT_FALSE(rank0->group->AcceptsJobToken("job-secreT"));
  EXPECT_FALSE(rank0->group->AcceptsJobToken(""));

  // The store holds a keyed commitment: neither the token nor a plain hash of it.
  StatusOr<std::string> commitment = store->Get(GroupKeys::TokenCommitment("", "tokens"));
  ASSERT_TRUE(commitment.ok());
  EXPECT_EQ(commitment->size(), 64u);
  EXPECT_EQ(commitment->find("job-secret"), std::string::npos);
  EXPECT_EQ(*commitment, JobTokenCommitment("job-secret", GroupKeys::TokenScope("", "tokens")));
  EXPECT_NE(*commitment, JobTokenCommitment("job-secret", GroupKeys::TokenScope("", "other")));

  // A failure record forged in the store (by anything without the token, even a sidecar) is
  // not believed: the group goes on.
  ASSERT_TRUE(
      store->Set(GroupKeys("", "tokens", 1).Failed(), EncodeFailure(Status::Aborted("forged")))
          .ok());
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(rank0->group->failure().ok()) << rank0->group->failure().ToString();
  EXPECT_TRUE(rank1->group->failure().ok()) << rank1->group->failure().ToString();
  std::vector<Membership> members = {*rank0, *rank1};
  ForEachRank(2, [&](int r) {
    TensorView t = Tensor<int64_t>({r + 1});
    EXPECT_TRUE(WaitFor(members[r].group->Submit(r, AllReduce(t))).ok());
    EXPECT_EQ(Values(t), (std::vector<int64_t>{3}));
  });
  EXPECT_TRUE(cluster.registry("a").Leave("tokens", 0).ok());
  EXPECT_TRUE(cluster.registry("b").Leave("tokens", 1).ok());

  // A group created without a token refuses a joiner that presents one.
  StatusOr<Membership> open0 = Status::Internal("not run");
  auto open_request = [&](int rank, std::string token) {
    JoinRequest join = request(rank, std::move(token));
    join.name = "open";
    return join;
  };
  std::thread open_first([&] { open0 = cluster.registry("a").Join(open_request(0, "")); });
  Status tokened = cluster.registry("b").Join(open_request(1, "job-secret")).status();
  EXPECT_EQ(tokened.kind(), ErrorKind::kPermissionDenied) << tokened.ToString();
  EXPECT_THAT(tokened.message(), HasSubstr("created without a job token"));
  StatusOr<Membership> open1 = cluster.registry("b").Join(open_request(1, ""));
  open_first.join();
  ASSERT_TRUE(open0.ok()) << open0.status().ToString();
  ASSERT_TRUE(open1.ok()) << open1.status().ToString();
  EXPECT_FALSE(open0->group->has_job_token());
  EXPECT_FALSE(open0->group->AcceptsJobToken(""));
}

TEST(JobTokenTest, CommitmentIsKeyedByTheTokenAndBoundToTheScope) {
  EXPECT_EQ(JobTokenCommitment("", "scope"), "none");
  const std::string a = JobTokenCommitment("token", "scope");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, JobTokenCommitment("token", "scope"));
  EXPECT_NE(a, JobTokenCommitment("token2", "scope"));
  EXPECT_NE(a, JobTokenCommitment("token", "scope2"));
  EXPECT_TRUE(JobTokenMatches("token", "scope", a));
  EXPECT_FALSE(JobTokenMatches("token", "scope2", a));
  EXPECT_FALSE(JobTokenMatches("", "scope", a));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

TEST(GroupRegistryOverFabricTest, MissingSidecarIsUnavailableFromConnect) {
  auto fabric = InProcessFabric::Create();
  StatusOr<GroupTopology> topology = GroupTopology::FromSidecarIds({"a", "b"}, "a");
  ASSERT_TRUE(topology.ok());
  const auto start = SteadyClock::now();
  StatusOr<GroupTransport> transport = fabric->Connect(
      ConnectRequest{"lonely", DeviceKind::kCpu, *topology, nullptr, milliseconds(100)});
  EXPECT_GE(SteadyClock::now() - start, milliseconds(95));
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(transport.status().message(),
              HasSubstr("group 'lonely': sidecar nodes [1] never connected within 100 ms"));
  // CUDA groups get the fabric's simulated device, and wait for their peers the same way.
  StatusOr<GroupTransport> cuda = fabric->Connect(
      ConnectRequest{"gpu", DeviceKind::kCuda, *topology, nullptr, milliseconds(100)});
  EXPECT_EQ(cuda.status().kind(), ErrorKind::kUnavailable) << cuda.status().ToString();
}

}  // namespace
}  // namespace collectived
