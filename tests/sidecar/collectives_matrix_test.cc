// Every collective x dtype x ReduceOp x tensor placement, on the three topologies, against the
// reference of tests/sidecar/reference.h:
//   OneSidecarFourRanks             one collectived, ranks 0-3 attached to it
//   FourSidecarsOneRankEach         four collectived, one rank on each
//   TwoSidecarsTwoRanksInterleaved  sidecar A hosts ranks 0 and 2, sidecar B ranks 1 and 3
//   EightSidecarsSummaryAgreement   eight collectived, one rank each, agreeing through summaries
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

  Cluster* cluster_ = nullptr;
  TestGroup group_;
  uint64_t seed_ = 0;
};

TEST_P(CollectiveMatrix, MatchesReference) {
  const MatrixCase& c = GetParam();
  if (c.type == CollectiveType::kBarrier) {
    CheckCollective(group_, c.type, c.dtype, TensorKind::kShm, &seed_);
    return;
  }
  for (TensorKind kind : kAllTensorKinds) {
    SCOPED_TRACE("tensors: " + KindName(kind));
    CheckCollective(group_, c.type, c.dtype, kind, &seed_);
  }
}

INSTANTIATE_TEST_SUITE_P(OneSidecarFourRanks, CollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(OneSidecarFourRanks(), MatrixDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(FourSidecarsOneRankEach, CollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(FourSidecarsOneRankEach(),
                                                         MatrixDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(TwoSidecarsTwoRanksInterleaved, CollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(TwoSidecarsTwoRanksInterleaved(),
                                                         MatrixDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(EightSidecarsSummaryAgreement, CollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(EightSidecarsSummaryAgreement(),
                                                         MatrixDTypes())),
                         MatrixCaseName);

}  // namespace
}  // namespace collectived::sidecar_test
