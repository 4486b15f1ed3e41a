// Every collective x dtype x ReduceOp x tensor placement, on the three topologies, against the
// reference of tests/sidecar/reference.h:
//   OneSidecarFourRanks             one collectived, ranks 0-3 attached to it
//   FourSidecarsOneRankEach         four collectived, one rank on each
//   TwoSidecarsTwoRanksInterleaved  sidecar A hosts ranks 0 and 2, sidecar B ranks 1 and 3
// One test per (topology, collective, dtype), named "<Topology>/CollectiveMatrix.
// MatchesReference/<collective>_<dtype>"; inside it, every ReduceOp that applies to the dtype
// (reducing collectives) and each tensor placement: all shared memory (zero-copy), all inline,
// and mixed (shm and inline alternating over ranks and tensors). The sidecars, the rank
// clients and the group of all ranks are shared by the tests of a topology.
#include <gtest/gtest.h>

#include <ostream>

#include "tests/sidecar/group_ops.h"

namespace collectived::sidecar_test {
namespace {

struct MatrixCase {
  Topology topology;
  CollectiveType type;
  DType dtype;  // kUnspecified for barrier
};

void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << c.topology.name << " " << OpKindName(c.type) << " " << DTypeName(c.dtype);
}

bool IsReducingType(CollectiveType type) {
  return type == CollectiveType::kAllReduce || type == CollectiveType::kAllReduceCoalesced ||
         type == CollectiveType::kReduce || type == CollectiveType::kReduceScatter ||
         type == CollectiveType::kReduceScatterTensor;
}

constexpr CollectiveType kMatrixTypes[] = {
    CollectiveType::kAllReduce,
    CollectiveType::kAllReduceCoalesced,
    CollectiveType::kBroadcast,
    CollectiveType::kReduce,
    CollectiveType::kAllGather,
    CollectiveType::kAllGatherIntoTensor,
    CollectiveType::kAllGatherCoalesced,
    CollectiveType::kReduceScatter,
    CollectiveType::kReduceScatterTensor,
    CollectiveType::kAllToAll,
    CollectiveType::kAllToAllSingle,
    CollectiveType::kGather,
    CollectiveType::kScatter,
    CollectiveType::kBarrier,
    CollectiveType::kSend,  // send and recv together
};

std::vector<MatrixCase> Cases(const Topology& topology) {
  std::vector<MatrixCase> cases;
  for (CollectiveType type : kMatrixTypes) {
    if (type == CollectiveType::kBarrier) {
      cases.push_back({topology, type, DType::kUnspecified});
      continue;
    }
    for (DType dtype : MatrixDTypes()) cases.push_back({topology, type, dtype});
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<MatrixCase>& info) {
  std::string name = info.param.type == CollectiveType::kSend
                         ? "send_recv"
                         : std::string(OpKindName(info.param.type));
  if (info.param.dtype != DType::kUnspecified)
    name += "_" + std::string(DTypeName(info.param.dtype));
  return name;
}

// The group of all ranks, shared by the tests of one cluster; created again after a test
// failed (it may have left ops pending).
struct SharedWorld {
  Cluster* cluster = nullptr;
  std::string name;
};

SharedWorld& World() {
  static SharedWorld world;
  return world;
}

class CollectiveMatrix : public ::testing::TestWithParam<MatrixCase> {
 protected:
  void SetUp() override {
    Status error;
    cluster_ = SharedCluster(GetParam().topology, &error);
    ASSERT_NE(cluster_, nullptr) << "cannot start " << GetParam().topology.name << ": "
                                 << error.ToString();
    SharedWorld& world = World();
    if (world.cluster != cluster_ || world.name.empty()) {
      world.cluster = cluster_;
      world.name = cluster_->UniqueName("world");
      auto infos = cluster_->CreateGroup(world.name);
      if (!infos.ok()) world.name.clear();
      ASSERT_TRUE(infos.ok()) << infos.status().ToString() << "\n" << cluster_->Logs();
    }
    group_ = TestGroup(cluster_, world.name, AllRanks(cluster_->world_size()));
  }

  void TearDown() override {
    if (HasFailure() && cluster_ != nullptr) {
      std::cerr << cluster_->Logs();
      // Leave the shared group behind: the next test creates a fresh one.
      (void)cluster_->DestroyGroup(World().name);
      World().name.clear();
    }
  }

  // Distinct data for every op of the run.
  uint64_t NextSeed() { return seed_ += 1000; }

  Cluster* cluster_ = nullptr;
  TestGroup group_;
  uint64_t seed_ = 0;
};

TEST_P(CollectiveMatrix, MatchesReference) {
  const MatrixCase& c = GetParam();
  const int n = group_.size();
  if (c.type == CollectiveType::kBarrier) {
    for (int i = 0; i < 3; ++i) CheckBarrier(group_);
    return;
  }
  for (TensorKind kind : kAllTensorKinds) {
    SCOPED_TRACE("tensors: " + KindName(kind));
    if (IsReducingType(c.type)) {
      const std::vector<ReduceOp> ops = ApplicableOps(c.dtype);
      for (size_t i = 0; i < ops.size(); ++i) {
        const ReduceOp& op = ops[i];
        SCOPED_TRACE("op: " + OpName(op));
        switch (c.type) {
          case CollectiveType::kAllReduce:
            CheckAllReduce(group_, c.dtype, op, kind, NextSeed());
            break;
          case CollectiveType::kAllReduceCoalesced:
            CheckAllReduceCoalesced(group_, c.dtype, op, kind, NextSeed());
            break;
          case CollectiveType::kReduce:
            CheckReduce(group_, c.dtype, op, static_cast<int>(i) % n, kind, NextSeed());
            break;
          case CollectiveType::kReduceScatter:
            CheckReduceScatter(group_, c.dtype, op, kind, NextSeed());
            break;
          default:
            CheckReduceScatterTensor(group_, c.dtype, op, kind, NextSeed());
        }
      }
      continue;
    }
    switch (c.type) {
      case CollectiveType::kBroadcast:
        CheckBroadcast(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kAllGather:
        CheckAllGather(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kAllGatherIntoTensor:
        CheckAllGatherIntoTensor(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kAllGatherCoalesced:
        CheckAllGatherCoalesced(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kAllToAll:
        CheckAllToAll(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kAllToAllSingle:
        CheckAllToAllSingle(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kGather:
        CheckGather(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kScatter:
        CheckScatter(group_, c.dtype, kind, NextSeed());
        break;
      case CollectiveType::kSend:
        CheckSendRecv(group_, c.dtype, kind, NextSeed());
        CheckAnySourceRecv(group_, c.dtype, kind, NextSeed());
        break;
      default:
        FAIL() << "unhandled collective " << OpKindName(c.type);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OneSidecarFourRanks, CollectiveMatrix,
                         ::testing::ValuesIn(Cases(OneSidecarFourRanks())), CaseName);
INSTANTIATE_TEST_SUITE_P(FourSidecarsOneRankEach, CollectiveMatrix,
                         ::testing::ValuesIn(Cases(FourSidecarsOneRankEach())), CaseName);
INSTANTIATE_TEST_SUITE_P(TwoSidecarsTwoRanksInterleaved, CollectiveMatrix,
                         ::testing::ValuesIn(Cases(TwoSidecarsTwoRanksInterleaved())), CaseName);

}  // namespace
}  // namespace collectived::sidecar_test
