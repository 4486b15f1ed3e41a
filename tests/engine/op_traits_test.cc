#include "engine/vocabulary/op_traits.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace collectived {
namespace {

std::vector<OpKind> AllKinds() {
  std::vector<OpKind> kinds;
  for (int32_t k = static_cast<int32_t>(kFirstOpKind); k <= static_cast<int32_t>(kLastOpKind); ++k)
    kinds.push_back(static_cast<OpKind>(k));
  return kinds;
}

// The kind whose name is `name`, or OpKind{0}.
OpKind KindNamed(std::string_view name) {
  for (const OpTraits& traits : kOpTraits) {
    if (traits.name == name) return traits.kind;
  }
  return OpKind{0};
}

// A float32 tensor of `count` elements (no memory: only its size matters here).
TensorView F32(size_t count) {
  TensorView t;
  t.dtype = DType::kFloat32;
  t.count = count;
  return t;
}

std::set<OpKind> KindsWhere(bool OpTraits::*flag) {
  std::set<OpKind> kinds;
  for (OpKind kind : AllKinds()) {
    if (TraitsOf(kind).*flag) kinds.insert(kind);
  }
  return kinds;
}

TEST(OpTraitsTest, EveryKindHasItsOwnRow) {
  EXPECT_EQ(kOpTraits.size(), AllKinds().size());
  EXPECT_EQ(AllKinds().size(), 16u);
  for (OpKind kind : AllKinds()) {
    EXPECT_TRUE(IsValidOpKind(kind)) << static_cast<int>(kind);
    EXPECT_EQ(TraitsOf(kind).kind, kind) << static_cast<int>(kind);
    EXPECT_NE(TraitsOf(kind).family, OpFamily::kNone) << TraitsOf(kind).name;
  }
  // The wire values of the kinds do not move.
  EXPECT_EQ(static_cast<int>(OpKind::kAllReduce), 1);
  EXPECT_EQ(static_cast<int>(OpKind::kAllToAllSingle), 11);
  EXPECT_EQ(static_cast<int>(OpKind::kRecv), 16);
}

TEST(OpTraitsTest, NamesAreTorchsAndRoundTrip) {
  const std::vector<std::pair<OpKind, std::string_view>> expected = {
      {OpKind::kAllReduce, "allreduce"},
      {OpKind::kAllReduceCoalesced, "allreduce_coalesced"},
      {OpKind::kBroadcast, "broadcast"},
      {OpKind::kReduce, "reduce"},
      {OpKind::kAllGather, "allgather"},
      {OpKind::kAllGatherIntoTensor, "allgather_into_tensor"},
      {OpKind::kAllGatherCoalesced, "allgather_coalesced"},
      {OpKind::kReduceScatter, "reduce_scatter"},
      {OpKind::kReduceScatterTensor, "reduce_scatter_tensor"},
      {OpKind::kAllToAll, "alltoall"},
      {OpKind::kAllToAllSingle, "alltoall_single"},
      {OpKind::kGather, "gather"},
      {OpKind::kScatter, "scatter"},
      {OpKind::kBarrier, "barrier"},
      {OpKind::kSend, "send"},
      {OpKind::kRecv, "recv"},
  };
  ASSERT_EQ(expected.size(), AllKinds().size());
  std::set<std::string_view> names;
  for (const auto& [kind, name] : expected) {
    EXPECT_EQ(TraitsOf(kind).name, name);
    EXPECT_EQ(OpKindName(kind), name);
    EXPECT_EQ(KindNamed(name), kind) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), expected.size()) << "names must be unique";
}

TEST(OpTraitsTest, KindsFromTheWireAreChecked) {
  for (int32_t bad : {0, -1, 17, 99}) {
    const auto kind = static_cast<OpKind>(bad);
    EXPECT_FALSE(IsValidOpKind(kind)) << bad;
    EXPECT_EQ(&TraitsOf(kind), &kUnknownOpTraits) << bad;
    EXPECT_EQ(OpKindName(kind), "unknown") << bad;
    EXPECT_FALSE(IsReducing(kind));
    EXPECT_FALSE(IsRooted(kind));
    EXPECT_FALSE(IsPointToPoint(kind));
    EXPECT_EQ(BusBandwidthFactor(kind, 4), 1.0);
  }
  EXPECT_EQ(KindNamed("unknown"), OpKind{0});
}

TEST(OpTraitsTest, InPlaceRootedReducingAndPointToPointSets) {
  EXPECT_EQ(KindsWhere(&OpTraits::in_place),
            (std::set<OpKind>{OpKind::kAllReduce, OpKind::kAllReduceCoalesced, OpKind::kBroadcast,
                              OpKind::kReduce}));
  EXPECT_EQ(KindsWhere(&OpTraits::rooted), (std::set<OpKind>{OpKind::kBroadcast, OpKind::kReduce,
                                                             OpKind::kGather, OpKind::kScatter}));
  EXPECT_EQ(KindsWhere(&OpTraits::reduces),
            (std::set<OpKind>{OpKind::kAllReduce, OpKind::kAllReduceCoalesced, OpKind::kReduce,
                              OpKind::kReduceScatter, OpKind::kReduceScatterTensor}));
  EXPECT_EQ(KindsWhere(&OpTraits::point_to_point),
            (std::set<OpKind>{OpKind::kSend, OpKind::kRecv}));
  for (OpKind kind : AllKinds()) {
    EXPECT_EQ(IsReducing(kind), TraitsOf(kind).reduces);
    EXPECT_EQ(IsRooted(kind), TraitsOf(kind).rooted);
    EXPECT_EQ(IsPointToPoint(kind), TraitsOf(kind).point_to_point);
    EXPECT_EQ(TraitsOf(kind).point_to_point, TraitsOf(kind).family == OpFamily::kPointToPoint);
    // In-place ops have their tensors as inputs and no outputs.
    if (TraitsOf(kind).in_place) {
      EXPECT_EQ(TraitsOf(kind).outputs, TensorLayout::kNone) << OpKindName(kind);
    }
  }
}

// nccl-tests (doc/PERFORMANCE.md): allreduce 2(n-1)/n; allgather, reduce_scatter and alltoall
// (n-1)/n; broadcast, reduce (and gather, scatter, send/recv, barrier) 1. A group of one rank
// moves nothing over a bus: allreduce's factor is 0 there, and the (n-1)/n ops keep 1.
double NcclTestsFactor(OpKind kind, int n) {
  switch (kind) {
    case OpKind::kAllReduce:
    case OpKind::kAllReduceCoalesced:
      return n <= 1 ? 0.0 : 2.0 * (n - 1) / n;
    case OpKind::kAllGather:
    case OpKind::kAllGatherIntoTensor:
    case OpKind::kAllGatherCoalesced:
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterTensor:
    case OpKind::kAllToAll:
    case OpKind::kAllToAllSingle:
      return n <= 1 ? 1.0 : static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}

TEST(OpTraitsTest, BusFactorsAreNcclTests) {
  for (OpKind kind : AllKinds()) {
    for (int n : {1, 2, 4, 8}) {
      EXPECT_DOUBLE_EQ(BusBandwidthFactor(kind, n), NcclTestsFactor(kind, n))
          << OpKindName(kind) << " n=" << n;
    }
  }
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(OpKind::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(OpKind::kAllGather, 8), 0.875);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(OpKind::kBroadcast, 8), 1.0);
  static_assert(BusBandwidthFactor(OpKind::kAllReduce, 2) == 1.0);
}

TEST(OpTraitsTest, LayoutsMatchTheRequestShapes) {
  auto layout = [](OpKind kind) {
    return std::make_pair(TraitsOf(kind).inputs, TraitsOf(kind).outputs);
  };
  using L = TensorLayout;
  EXPECT_EQ(layout(OpKind::kAllReduce), std::make_pair(L::kOne, L::kNone));
  EXPECT_EQ(layout(OpKind::kAllReduceCoalesced), std::make_pair(L::kList, L::kNone));
  EXPECT_EQ(layout(OpKind::kAllGather), std::make_pair(L::kOne, L::kOnePerRank));
  EXPECT_EQ(layout(OpKind::kAllGatherIntoTensor), std::make_pair(L::kOne, L::kOneOfGroupSize));
  EXPECT_EQ(layout(OpKind::kAllGatherCoalesced), std::make_pair(L::kList, L::kListTimesGroupSize));
  EXPECT_EQ(layout(OpKind::kReduceScatter), std::make_pair(L::kOnePerRank, L::kOne));
  EXPECT_EQ(layout(OpKind::kReduceScatterTensor), std::make_pair(L::kOneOfGroupSize, L::kOne));
  EXPECT_EQ(layout(OpKind::kAllToAll), std::make_pair(L::kOnePerRank, L::kOnePerRank));
  EXPECT_EQ(layout(OpKind::kAllToAllSingle), std::make_pair(L::kOneSplit, L::kOneSplit));
  EXPECT_EQ(layout(OpKind::kGather), std::make_pair(L::kOne, L::kOnePerRankOnRoot));
  EXPECT_EQ(layout(OpKind::kScatter), std::make_pair(L::kOnePerRankOnRoot, L::kOne));
  EXPECT_EQ(layout(OpKind::kBarrier), std::make_pair(L::kNone, L::kNone));
  EXPECT_EQ(layout(OpKind::kSend), std::make_pair(L::kOne, L::kNone));
  EXPECT_EQ(layout(OpKind::kRecv), std::make_pair(L::kNone, L::kOne));
}

TEST(OpTraitsTest, FamiliesRunTheKinds) {
  EXPECT_EQ(TraitsOf(OpKind::kAllReduceCoalesced).family, OpFamily::kAllReduce);
  EXPECT_EQ(TraitsOf(OpKind::kAllGatherCoalesced).family, OpFamily::kAllGather);
  EXPECT_EQ(TraitsOf(OpKind::kReduceScatterTensor).family, OpFamily::kReduceScatter);
  for (OpKind kind :
       {OpKind::kAllToAll, OpKind::kAllToAllSingle, OpKind::kGather, OpKind::kScatter}) {
    EXPECT_EQ(TraitsOf(kind).family, OpFamily::kAllToAll) << OpKindName(kind);
  }
  EXPECT_EQ(TraitsOf(OpKind::kBarrier).family, OpFamily::kBarrier);
}

// nccl-tests' sizes: the gathered buffer for allgather and gather, the scattered one for
// reduce_scatter and scatter, what this rank sends otherwise (what it receives for recv).
TEST(OpTraitsTest, AlgorithmBytesCountLikeNcclTests) {
  const TensorView in = F32(8);    // 32 bytes
  const TensorView out = F32(8);   // 32 bytes
  const TensorView big = F32(32);  // 128 bytes
  const int n = 4;
  auto bytes = [&](OpKind kind, std::vector<TensorView> inputs, std::vector<TensorView> outputs) {
    OpRequest r;
    r.kind = kind;
    r.inputs = std::move(inputs);
    r.outputs = std::move(outputs);
    return AlgorithmBytes(r, n);
  };
  EXPECT_EQ(bytes(OpKind::kAllReduce, {in}, {}), 32u);
  EXPECT_EQ(bytes(OpKind::kAllReduceCoalesced, {in, in}, {}), 64u);
  EXPECT_EQ(bytes(OpKind::kBroadcast, {in}, {}), 32u);
  EXPECT_EQ(bytes(OpKind::kAllGather, {in}, {out, out, out, out}), 128u);
  EXPECT_EQ(bytes(OpKind::kAllGatherIntoTensor, {in}, {big}), 128u);
  EXPECT_EQ(bytes(OpKind::kReduceScatter, {in, in, in, in}, {out}), 128u);
  EXPECT_EQ(bytes(OpKind::kReduceScatterTensor, {big}, {out}), 128u);
  EXPECT_EQ(bytes(OpKind::kAllToAll, {in, in, in, in}, {out, out, out, out}), 128u);
  EXPECT_EQ(bytes(OpKind::kAllToAllSingle, {big}, {big}), 128u);
  EXPECT_EQ(bytes(OpKind::kGather, {in}, {}), 128u);
  EXPECT_EQ(bytes(OpKind::kScatter, {}, {out}), 128u);
  EXPECT_EQ(bytes(OpKind::kBarrier, {}, {}), 0u);
  EXPECT_EQ(bytes(OpKind::kSend, {in}, {}), 32u);
  EXPECT_EQ(bytes(OpKind::kRecv, {}, {out}), 32u);
}

TEST(OpTraitsTest, SignatureCountsWhatRanksMustAgreeOn) {
  OpRequest r;
  r.kind = OpKind::kReduceScatterTensor;
  r.inputs = {F32(8)};
  r.outputs = {F32(2)};
  EXPECT_EQ(MakeSignature(r, 1).count, 2);
  r.kind = OpKind::kAllGatherCoalesced;
  r.inputs = {F32(3), F32(5)};
  OpSignature coalesced = MakeSignature(r, 2);
  EXPECT_EQ(coalesced.count, 8);
  EXPECT_EQ(coalesced.num_tensors, 2);
  r.kind = OpKind::kAllToAllSingle;
  EXPECT_EQ(MakeSignature(r, 3).count, 0);
}

}  // namespace
}  // namespace collectived
