// The GPU path end to end: real collectived sidecars built with the GPU backend, and trainers as
// Clients of this process passing CUDA tensors (each a cudaMalloc of its own with guard bytes,
// shared with the sidecar through CUDA IPC, ordered on the legacy default stream). Every
// collective x {float32, float16, bfloat16, int64} x every ReduceOp that applies, against the
// reference of tests/sidecar/reference.h, for:
//   OneSidecarOneRank        world size 1 (the sidecar's device kernels only)
//   OneSidecarTwoRanks       2 trainers sharing GPU 0, combined on it by their sidecar
//   OneSidecarFourRanks      4 trainers sharing GPU 0
//   TwoSidecarsOneRankEach   2 sidecars, GPUs 0 and 1 (NCCL refuses two ranks of one
//                            communicator on one GPU: skipped with one GPU)
// Then what surrounds the ops: a tensor written by a kernel queued just before the op on the
// same stream, allocations freed and made again (no stale mapping), a CPU tensor in a CUDA group
// refused. Every test skips, printing why, where this process sees no GPU.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <ostream>

#include "engine/cuda/gpu_inventory.h"
#include "tests/sidecar/group_ops.h"

namespace collectived::sidecar_test {
namespace {

const std::vector<DType>& GpuDTypes() {
  static const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                            DType::kInt64};
  return dtypes;
}

const Topology& OneSidecarOneRank() {
  static const Topology topology{"OneSidecarOneRank", 1, {0}};
  return topology;
}
const Topology& OneSidecarTwoRanks() {
  static const Topology topology{"OneSidecarTwoRanks", 1, {0, 0}};
  return topology;
}
const Topology& TwoSidecarsOneRankEach() {
  static const Topology topology{"TwoSidecarsOneRankEach", 2, {0, 1}};
  return topology;
}

// GPUs this process sees; when there are fewer than `needed`, why (for GTEST_SKIP).
std::string MissingGpus(size_t needed) {
  const GpuInventory& gpus = ProbeGpus();
  if (gpus.devices.size() >= needed) return "";
  if (gpus.devices.empty()) return "no usable GPU here (" + gpus.Summary() + ")";
  return "needs " + std::to_string(needed) + " GPUs, this machine has " +
         std::to_string(gpus.devices.size()) +
         " (NCCL refuses two ranks of one communicator on one GPU)";
}

// The GPU of a rank: the index of its sidecar (one sidecar per GPU, its trainers share it).
std::function<int(int)> DeviceOfRank(const Topology& topology) {
  return [&topology](int rank) { return topology.sidecar_of_rank[rank]; };
}

// The CUDA group of all ranks of the running cluster, created on first use and again after a
// failed test (which may have left ops pending).
class GpuClusterTest {
 protected:
  // Starts (or reuses) the cluster of `topology` and its CUDA group; returns "" or why the test
  // must skip. Fails the test when the sidecars or the group cannot start.
  std::string Prepare(const Topology& topology) {
    std::string missing = MissingGpus(static_cast<size_t>(topology.sidecars));
    if (!missing.empty()) return missing;
    Status error;
    cluster_ = SharedCluster(topology, &error);
    if (cluster_ == nullptr) {
      ADD_FAILURE() << "cannot start " << topology.name << ": " << error.ToString();
      return "";
    }
    static std::map<const Cluster*, std::string> groups;
    std::string& name = groups[cluster_];
    if (name.empty()) {
      name = cluster_->UniqueName("gpu-world");
      auto infos = cluster_->CreateGroup(name, {}, milliseconds(60000), DeviceOfRank(topology));
      if (!infos.ok()) {
        ADD_FAILURE() << infos.status().ToString() << "\n" << cluster_->Logs();
        name.clear();
        return "";
      }
    }
    name_ = &name;
    std::vector<int> devices;
    for (int rank = 0; rank < topology.world_size(); ++rank) {
      devices.push_back(topology.sidecar_of_rank[rank]);
    }
    group_ = TestGroup::Cuda(cluster_, name, AllRanks(topology.world_size()), devices);
    return "";
  }

  void Forget(bool failed) {
    if (!failed || cluster_ == nullptr || name_ == nullptr) return;
    std::cerr << cluster_->Logs();
    (void)cluster_->DestroyGroup(*name_);
    name_->clear();
  }

  Cluster* cluster_ = nullptr;
  std::string* name_ = nullptr;
  TestGroup group_;
  uint64_t seed_ = 0;
};

class GpuCollectiveMatrix : public ::testing::TestWithParam<MatrixCase>, protected GpuClusterTest {
 protected:
  void TearDown() override { Forget(HasFailure()); }
};

TEST_P(GpuCollectiveMatrix, MatchesReference) {
  const MatrixCase& c = GetParam();
  const std::string skip = Prepare(c.topology);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());
  CheckCollective(group_, c.type, c.dtype, TensorKind::kCuda, &seed_);
}

INSTANTIATE_TEST_SUITE_P(OneSidecarOneRank, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(OneSidecarOneRank(), GpuDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(OneSidecarTwoRanks, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(OneSidecarTwoRanks(), GpuDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(OneSidecarFourRanks, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(OneSidecarFourRanks(), GpuDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(TwoSidecarsOneRankEach, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(TwoSidecarsOneRankEach(), GpuDTypes())),
                         MatrixCaseName);

class GpuGroup : public ::testing::Test, protected GpuClusterTest {
 protected:
  void TearDown() override { Forget(HasFailure()); }
};

// Freed allocations and new ones (often at the same addresses): every op sees its own tensors,
// never a mapping the sidecar kept of an earlier allocation.
TEST_F(GpuGroup, AllocationsFreedAndMadeAgainNeverAliasAStaleMapping) {
  const std::string skip = Prepare(OneSidecarTwoRanks());
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    CheckAllReduce(group_, DType::kFloat32, ReduceOp::Sum(), TensorKind::kCuda, seed_ += 1000);
    if (HasFailure()) return;
  }
}

// A CPU tensor in a CUDA group is refused on every rank, naming the device kinds, and the
// group goes on.
TEST_F(GpuGroup, AHostTensorInACudaGroupIsRefusedAndTheGroupGoesOn) {
  const std::string skip = Prepare(OneSidecarOneRank());
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());
  float host[4] = {1, 2, 3, 4};
  Status refused = group_.client(0)
                       .AllReduce(group_.name(), ClientTensor::Inline(host, DType::kFloat32, 4))
                       ->Wait(milliseconds(30000));
  EXPECT_TRUE(refused.IsInvalidArgument()) << refused.ToString();
  EXPECT_NE(refused.message().find("cuda"), std::string::npos) << refused.ToString();
  CheckAllReduce(group_, DType::kFloat32, ReduceOp::Sum(), TensorKind::kCuda, seed_ += 1000);
}

}  // namespace
}  // namespace collectived::sidecar_test
