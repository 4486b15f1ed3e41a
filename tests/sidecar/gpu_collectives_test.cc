// The GPU path end to end: real collectived sidecars built with the GPU backend, and trainers as
// Clients of this process passing CUDA tensors (each a cudaMalloc of its own with guard bytes,
// shared with the sidecar through CUDA IPC, ordered on the legacy default stream). Every
// collective x {float32, float16, bfloat16, int64} x every ReduceOp that applies, against the
// reference of tests/sidecar/reference.h, for:
//   OneSidecarOneRank              world size 1 (the sidecar's device kernels only)
//   OneSidecarTwoRanks             2 trainers sharing GPU 0, combined on it by their sidecar
//   OneSidecarFourRanks            4 trainers sharing GPU 0
//   TwoSidecarsOneGpu              2 sidecars sharing GPU 0, one trainer each: NCCL between the
//                                  sidecars, each given its own NCCL host identity
//                                  (--nccl-host-id), so NCCL carries the data over its socket
//                                  transport on loopback
//   TwoSidecarsTwoRanksEachOneGpu  the same with 2 trainers per sidecar (ranks interleaved)
//   TwoSidecarsTwoGpus             2 sidecars on GPUs 0 and 1 (NCCL's own intra-node transports;
//                                  skipped, saying so, with fewer than 2 GPUs)
// Then what surrounds the ops: allocations freed and made again (no stale mapping), a CPU tensor
// in a CUDA group refused, and an op in flight ended by an operator's abort, by the group's
// timeout and by a trainer whose session ends, after which the group is created again; across
// two sidecars on one GPU, NCCL ops in flight ended by an operator's abort (ncclCommAbort while
// the peer's NCCL call runs) and by the loss of the peer sidecar (SIGKILL); and a shrinking
// CUDA group of three sidecars on one GPU that loses one of them mid-ops and goes on (docs/
// fault-tolerance.md: kept outputs on the device, the commit, the re-run). Stream ordering
// against a kernel queued before the op is checked by tests/python/test_gpu_torch.py. Every test
// skips, printing why, where this process sees no GPU.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <ostream>
#include <thread>

#include "collectived/v1/admin.grpc.pb.h"
#include "engine/cuda/gpu_inventory.h"
#include "tests/sidecar/device_block.h"
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
const Topology& TwoSidecarsOneGpu() {
  static const Topology topology{"TwoSidecarsOneGpu", 2, {0, 1}, /*distinct_nccl_hosts=*/true};
  return topology;
}
const Topology& TwoSidecarsTwoRanksEachOneGpu() {
  static const Topology topology{"TwoSidecarsTwoRanksEachOneGpu",
                                 2,
                                 {0, 1, 0, 1},
                                 /*distinct_nccl_hosts=*/true};
  return topology;
}
const Topology& ThreeSidecarsOneGpu() {
  static const Topology topology{"ThreeSidecarsOneGpu", 3, {0, 1, 2}, /*distinct_nccl_hosts=*/true};
  return topology;
}
const Topology& TwoSidecarsTwoGpus() {
  static const Topology topology{"TwoSidecarsTwoGpus", 2, {0, 1}};
  return topology;
}

// The GPU of a sidecar: GPU 0 for all when NCCL is told they are different hosts, otherwise one
// GPU per sidecar (NCCL refuses two ranks of one communicator on one GPU of one host).
int GpuOfSidecar(const Topology& topology, int sidecar) {
  return topology.distinct_nccl_hosts ? 0 : sidecar;
}

// GPUs this process sees; when there are fewer than `topology` needs, why (for GTEST_SKIP).
std::string MissingGpus(const Topology& topology) {
  const size_t needed = topology.distinct_nccl_hosts ? 1 : static_cast<size_t>(topology.sidecars);
  const GpuInventory& gpus = ProbeGpus();
  if (gpus.devices.size() >= needed) return "";
  if (gpus.devices.empty()) return "no usable GPU here (" + gpus.Summary() + ")";
  return "needs " + std::to_string(needed) + " GPUs, this machine has " +
         std::to_string(gpus.devices.size()) +
         " (one GPU per sidecar; TwoSidecarsOneGpu covers NCCL between sidecars on one GPU)";
}

// Admin.AbortGroup on `sidecar` with the tests' admin token.
grpc::Status AbortAsOperator(SidecarProcess& sidecar, const std::string& group,
                             const std::string& reason) {
  auto admin = v1::Admin::NewStub(sidecar.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  context.AddMetadata("authorization", std::string("Bearer ") + kTestAdminToken);
  v1::AbortGroupRequest request;
  request.set_group(group);
  request.set_reason(reason);
  v1::AbortGroupResponse response;
  return admin->AbortGroup(&context, request, &response);
}

// The GPU of a rank: its sidecar's.
std::function<int(int)> DeviceOfRank(const Topology& topology) {
  return [&topology](int rank) { return GpuOfSidecar(topology, topology.sidecar_of_rank[rank]); };
}

// The CUDA group of all ranks of the running cluster, created on first use and again after a
// failed test (which may have left ops pending).
class GpuClusterTest {
 protected:
  // Starts (or reuses) the cluster of `topology` and its CUDA group; returns "" or why the test
  // must skip. Fails the test when the sidecars or the group cannot start.
  std::string Prepare(const Topology& topology) {
    std::string missing = MissingGpus(topology);
    if (!missing.empty()) return missing;
    Status error;
    cluster_ = SharedCluster(topology, &error);
    if (cluster_ == nullptr) {
      ADD_FAILURE() << "cannot start " << topology.name << ": " << error.ToString();
      return "";
    }
    static std::map<uint64_t, std::string> groups;  // by Cluster::serial()
    std::string& name = groups[cluster_->serial()];
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
      devices.push_back(DeviceOfRank(topology)(rank));
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
INSTANTIATE_TEST_SUITE_P(TwoSidecarsOneGpu, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(TwoSidecarsOneGpu(), GpuDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(TwoSidecarsTwoRanksEachOneGpu, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(TwoSidecarsTwoRanksEachOneGpu(),
                                                         GpuDTypes())),
                         MatrixCaseName);
INSTANTIATE_TEST_SUITE_P(TwoSidecarsTwoGpus, GpuCollectiveMatrix,
                         ::testing::ValuesIn(MatrixCases(TwoSidecarsTwoGpus(), GpuDTypes())),
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

// Float32 device memory on GPU 0, every element `value`.
std::shared_ptr<DeviceBlock> DeviceFloats(size_t count, float value) {
  std::vector<float> init(count, value);
  auto block = DeviceBlock::Allocate(0, count * sizeof(float), init.data());
  EXPECT_TRUE(block.ok()) << block.status().ToString();
  return block.ok() ? *block : nullptr;
}

// The first element of a float32 device block.
float FirstFloat(const DeviceBlock& block) {
  float value = 0;
  EXPECT_TRUE(CopyFromDevice(block.device(), block.data(), &value, sizeof(value)).ok());
  return value;
}

// WaitStream orders the caller's stream after the op (the sidecar's completion event) instead of
// waiting for the op to complete: what the device reads next is the op's result.
TEST_F(GpuGroup, WaitStreamOrdersTheCallersStreamAfterTheOp) {
  const std::string skip = Prepare(OneSidecarTwoRanks());
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());
  constexpr size_t kCount = 1 << 20;
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::shared_ptr<DeviceBlock>> tensors;
    std::vector<std::shared_ptr<ClientWork>> works;
    for (int rank = 0; rank < 2; ++rank) {
      tensors.push_back(DeviceFloats(kCount, static_cast<float>(rank + 1)));
      ASSERT_NE(tensors.back(), nullptr);
      works.push_back(group_.client(rank).AllReduce(
          group_.name(), ClientTensor::Cuda(tensors.back()->data(), 0, DType::kFloat32, kCount)));
    }
    for (int rank = 0; rank < 2; ++rank) {
      const Status ordered = works[rank]->WaitStream(nullptr, milliseconds(30000));
      ASSERT_TRUE(ordered.ok()) << ordered.ToString();
      EXPECT_EQ(FirstFloat(*tensors[rank]), 3.0f);  // synchronizes the device, then reads
    }
    for (const auto& work : works) {
      const Status completed = work->Wait(milliseconds(30000));
      EXPECT_TRUE(completed.ok()) << completed.ToString();
    }
  }
}

// Creates the 2-rank CUDA group `name` on GPU 0 of the clients `rank0` and `rank1` (of any
// sidecars), both joining at once; the first error, or OK.
Status CreateCudaGroupOfTwo(const std::string& name, Client& rank0, Client& rank1) {
  std::vector<Status> created(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GroupOptions options;
      options.name = name;
      options.rank = rank;
      options.world_size = 2;
      options.timeout = milliseconds(60000);
      options.cuda_device = 0;
      auto info = (rank == 0 ? rank0 : rank1).CreateGroup(options);
      created[rank] = info.ok() ? Status::Ok() : info.status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return created[0].ok() ? created[1] : created[0];
}

// With stream signals (ClientOptions::stream_signals) WaitStream makes the stream wait on the
// op's word, which the sidecar's stream writes: no response awaited. More rounds than a group has
// words (256), so every word is reused.
TEST_F(GpuGroup, WaitStreamOnSignalWordsOrdersTheCallersStreamAfterTheOp) {
  const std::string skip = Prepare(OneSidecarTwoRanks());
  if (!skip.empty()) GTEST_SKIP() << skip;
  ClientOptions options;
  options.address = cluster_->sidecar(0).unix_address();
  options.stream_signals = true;
  std::vector<std::unique_ptr<Client>> clients;
  for (int rank = 0; rank < 2; ++rank) {
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    clients.push_back(std::move(*client));
  }
  const std::string name = cluster_->UniqueName("gpu-signals");
  const Status created = CreateCudaGroupOfTwo(name, *clients[0], *clients[1]);
  ASSERT_TRUE(created.ok()) << created.ToString();
  // A stream per trainer: on one stream, rank 1's ready event would queue behind rank 0's wait
  // for the op that needs it (so would two ranks of one NCCL communicator on one stream).
  std::vector<std::unique_ptr<DeviceStream>> streams;
  for (int rank = 0; rank < 2; ++rank) {
    auto stream = DeviceStream::Create(0);
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    streams.push_back(std::move(*stream));
  }
  constexpr size_t kCount = 1 << 16;
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::shared_ptr<DeviceBlock>> tensors;
    for (int rank = 0; rank < 2; ++rank) {
      tensors.push_back(DeviceFloats(kCount, static_cast<float>(rank + round)));
      ASSERT_NE(tensors.back(), nullptr);
    }
    auto issue = [&](int rank) {
      return clients[rank]->AllReduce(
          name, ClientTensor::Cuda(tensors[rank]->data(), 0, DType::kFloat32, kCount,
                                   streams[rank]->get()));
    };
    // Rank 0 waits on its stream before rank 1 has issued the op: the wait is queued on the
    // word (no CPU wait, no early response), and only rank 1's op lets the stream go on.
    std::vector<std::shared_ptr<ClientWork>> works{issue(0)};
    ASSERT_TRUE(works[0]->has_stream_signal()) << "the op took the event path";
    const Status queued = works[0]->WaitStream(streams[0]->get(), milliseconds(30000));
    ASSERT_TRUE(queued.ok()) << queued.ToString();
    EXPECT_FALSE(works[0]->IsCompleted()) << "WaitStream waited on the CPU";
    works.push_back(issue(1));
    ASSERT_TRUE(works[1]->WaitStream(streams[1]->get(), milliseconds(30000)).ok());
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(FirstFloat(*tensors[rank]), static_cast<float>(1 + 2 * round));
    }
    for (const auto& work : works) {
      const Status completed = work->Wait(milliseconds(30000));
      ASSERT_TRUE(completed.ok()) << completed.ToString();
    }
  }
  for (auto& client : clients) EXPECT_TRUE(client->DestroyGroup(name).ok());
}

// Rank 0 allreduces a CUDA tensor in a group of two trainers sharing GPU 0; rank 1 never joins
// the op. `end_it` ends the op somehow; every test then checks the sidecar still serves the
// shared CUDA group.
class GpuOpInFlight : public ::testing::Test, protected GpuClusterTest {
 protected:
  void TearDown() override { Forget(HasFailure()); }

  // Creates a new CUDA group of ranks 0 and 1 with `timeout`; returns its name ("" on failure).
  std::string NewGroup(const std::string& stem, milliseconds timeout) {
    const std::string name = cluster_->UniqueName(stem);
    auto infos = cluster_->CreateGroup(name, {}, timeout, DeviceOfRank(OneSidecarTwoRanks()));
    if (!infos.ok()) {
      ADD_FAILURE() << infos.status().ToString();
      return "";
    }
    return name;
  }

  // Issues rank 0's allreduce of 1 Mi floats of 1 and checks it is still pending after 200 ms.
  std::shared_ptr<ClientWork> IssueAlone(const std::string& group) {
    tensor_ = DeviceFloats(1 << 20, 1.0f);
    if (tensor_ == nullptr) return nullptr;
    auto work = cluster_->client(0).AllReduce(
        group, ClientTensor::Cuda(tensor_->data(), 0, DType::kFloat32, 1 << 20));
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_FALSE(work->IsCompleted()) << work->status().ToString();
    return work;
  }

  // The failed op left the trainer's tensor as it was, and the shared group still works.
  void ExpectTheSidecarGoesOn() {
    EXPECT_EQ(FirstFloat(*tensor_), 1.0f);
    const std::string skip = Prepare(OneSidecarTwoRanks());
    ASSERT_TRUE(skip.empty()) << skip;
    CheckAllReduce(group_, DType::kFloat32, ReduceOp::Sum(), TensorKind::kCuda, seed_ += 1000);
  }

  std::shared_ptr<DeviceBlock> tensor_;
};

TEST_F(GpuOpInFlight, AnOperatorsAbortFailsItAndTheGroupIsCreatedAgain) {
  const std::string skip = Prepare(OneSidecarTwoRanks());
  if (!skip.empty()) GTEST_SKIP() << skip;
  const std::string name = NewGroup("gpu-abort", milliseconds(60000));
  ASSERT_FALSE(name.empty());
  auto work = IssueAlone(name);
  ASSERT_NE(work, nullptr);

  const grpc::Status rpc = AbortAsOperator(cluster_->sidecar(0), name, "gpu test abort");
  ASSERT_TRUE(rpc.ok()) << rpc.error_message();
  const Status status = work->Wait(milliseconds(5000));
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_NE(status.message().find("aborted by an operator: gpu test abort"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("'" + name + "'"), std::string::npos) << status.ToString();

  ASSERT_TRUE(cluster_->DestroyGroup(name, {0, 1}).ok());
  ASSERT_TRUE(
      cluster_->CreateGroup(name, {}, milliseconds(60000), DeviceOfRank(OneSidecarTwoRanks()))
          .ok());
  TestGroup again = TestGroup::Cuda(cluster_, name, AllRanks(2), {0, 0});
  CheckAllReduce(again, DType::kFloat32, ReduceOp::Sum(), TensorKind::kCuda, seed_ += 1000);
  EXPECT_TRUE(cluster_->DestroyGroup(name, {0, 1}).ok());
  ExpectTheSidecarGoesOn();
}

TEST_F(GpuOpInFlight, TheGroupsTimeoutFailsItNamingGroupOpAndSequence) {
  const std::string skip = Prepare(OneSidecarTwoRanks());
  if (!skip.empty()) GTEST_SKIP() << skip;
  const milliseconds timeout(1500);
  const std::string name = NewGroup("gpu-timeout", timeout);
  ASSERT_FALSE(name.empty());
  const auto start = std::chrono::steady_clock::now();
  auto work = IssueAlone(name);
  ASSERT_NE(work, nullptr);
  const Status status = work->Wait(timeout + milliseconds(5000));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  for (const std::string& part :
       {std::string("'") + name + "'", std::string("allreduce"), std::string("seq 1")}) {
    EXPECT_NE(status.message().find(part), std::string::npos) << part << ": " << status.ToString();
  }
  EXPECT_GE(elapsed, timeout);
  EXPECT_LT(elapsed, timeout + milliseconds(4000));
  (void)cluster_->DestroyGroup(name, {0, 1});
  ExpectTheSidecarGoesOn();
}

// A trainer of its own (not one of the cluster's) joins a CUDA group with rank 0's client and
// goes away while rank 0 waits in an allreduce it never issued.
TEST_F(GpuOpInFlight, ATrainerWhoseSessionEndsFailsItAsPeerLost) {
  const std::string skip = Prepare(OneSidecarTwoRanks());
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto leaver = Client::Connect(cluster_->sidecar(0).unix_address());
  ASSERT_TRUE(leaver.ok()) << leaver.status().ToString();
  const std::string name = cluster_->UniqueName("gpu-leaver");
  const Status created = CreateCudaGroupOfTwo(name, cluster_->client(0), **leaver);
  ASSERT_TRUE(created.ok()) << created.ToString();
  auto work = IssueAlone(name);
  ASSERT_NE(work, nullptr);

  leaver->reset();  // the session ends
  const Status status = work->Wait(milliseconds(10000));
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.ToString();
  EXPECT_NE(status.message().find("'" + name + "'"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("lost"), std::string::npos) << status.ToString();
  (void)cluster_->client(0).DestroyGroup(name);
  ExpectTheSidecarGoesOn();
}

// NCCL ops in flight between two sidecars sharing GPU 0: each of the two ranks (one per sidecar)
// issues kQueued allreduces of 256 MiB on one tensor, enough NCCL work over the socket transport
// that the later ones are still queued or running when the test ends them.
class GpuAcrossSidecars : public ::testing::Test, protected GpuClusterTest {
 protected:
  static constexpr int kQueued = 8;
  static constexpr size_t kCount = size_t{64} << 20;

  void TearDown() override { Forget(HasFailure()); }

  // Issues the ops of both ranks of `group` in `cluster`; the tensors stay in tensors_.
  std::vector<std::vector<std::shared_ptr<ClientWork>>> IssueQueued(Cluster& cluster,
                                                                    const std::string& group) {
    std::vector<std::vector<std::shared_ptr<ClientWork>>> works(2);
    for (int rank = 0; rank < 2; ++rank) {
      tensors_.push_back(DeviceFloats(kCount, 1.0f));
      if (tensors_.back() == nullptr) return {};
    }
    for (int op = 0; op < kQueued; ++op) {
      for (int rank = 0; rank < 2; ++rank) {
        works[rank].push_back(cluster.client(rank).AllReduce(
            group, ClientTensor::Cuda(tensors_[rank]->data(), 0, DType::kFloat32, kCount)));
      }
    }
    return works;
  }

  // Every op of `works` ended within `bound`, the last one with an error naming `group`;
  // returns the last op's status.
  Status ExpectTheLastFailed(const std::vector<std::shared_ptr<ClientWork>>& works,
                             const std::string& group, milliseconds bound) {
    const std::vector<Status> statuses = WaitAll(works, bound);
    for (const auto& work : works) {
      EXPECT_TRUE(work->IsCompleted()) << "an op did not end within " << bound.count() << " ms";
    }
    const Status& last = statuses.back();
    EXPECT_FALSE(last.ok()) << "the last of " << kQueued << " queued ops completed";
    EXPECT_NE(last.message().find("'" + group + "'"), std::string::npos) << last.ToString();
    return last;
  }

  std::vector<std::shared_ptr<DeviceBlock>> tensors_;
};

// An operator aborts the group on sidecar A while NCCL ops run: A aborts its communicator, B's
// NCCL calls (whose peer is gone) are aborted too, every op ends, and the group is created again
// and works.
TEST_F(GpuAcrossSidecars, AnOperatorsAbortEndsNcclOpsOnBothSidecars) {
  const std::string skip = Prepare(TwoSidecarsOneGpu());
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFailure());
  const std::string name = cluster_->UniqueName("gpu-nccl-abort");
  ASSERT_TRUE(
      cluster_->CreateGroup(name, {}, milliseconds(60000), DeviceOfRank(TwoSidecarsOneGpu())).ok());
  auto works = IssueQueued(*cluster_, name);
  ASSERT_EQ(works.size(), 2u);
  std::this_thread::sleep_for(milliseconds(20));

  const grpc::Status rpc =
      AbortAsOperator(cluster_->sidecar(0), name, "gpu test abort across sidecars");
  ASSERT_TRUE(rpc.ok()) << rpc.error_message();

  const Status on_a = ExpectTheLastFailed(works[0], name, milliseconds(30000));
  EXPECT_EQ(on_a.kind(), ErrorKind::kAborted) << on_a.ToString();
  const Status on_b = ExpectTheLastFailed(works[1], name, milliseconds(30000));
  EXPECT_TRUE(on_b.kind() == ErrorKind::kPeerLost || on_b.kind() == ErrorKind::kAborted)
      << on_b.ToString();

  (void)cluster_->DestroyGroup(name);
  ASSERT_TRUE(
      cluster_->CreateGroup(name, {}, milliseconds(60000), DeviceOfRank(TwoSidecarsOneGpu())).ok());
  TestGroup again = TestGroup::Cuda(cluster_, name, AllRanks(2), {0, 0});
  CheckAllReduce(again, DType::kFloat32, ReduceOp::Sum(), TensorKind::kCuda, seed_ += 1000);
  EXPECT_TRUE(cluster_->DestroyGroup(name).ok());
}

// Sidecar B is killed (SIGKILL) while NCCL ops run: rank 0's ops end as PEER_LOST naming the
// group well within its timeout, and sidecar A serves CUDA groups on.
TEST_F(GpuAcrossSidecars, APeerSidecarKilledMidOpEndsNcclOpsAsPeerLost) {
  const std::string skip = MissingGpus(TwoSidecarsOneGpu());
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto started = Cluster::Start(TwoSidecarsOneGpu());  // its own: this test kills a sidecar
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& cluster = **started;
  const std::string name = cluster.UniqueName("gpu-nccl-peer-loss");
  const milliseconds timeout(60000);
  ASSERT_TRUE(cluster.CreateGroup(name, {}, timeout, DeviceOfRank(TwoSidecarsOneGpu())).ok())
      << cluster.Logs();
  auto works = IssueQueued(cluster, name);
  ASSERT_EQ(works.size(), 2u);
  std::this_thread::sleep_for(milliseconds(20));
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(cluster.sidecar(1).process().SignalAndWait(SIGKILL, milliseconds(5000)).ok());

  const Status last = ExpectTheLastFailed(works[0], name, milliseconds(30000));
  EXPECT_EQ(last.kind(), ErrorKind::kPeerLost) << last.ToString() << "\n" << cluster.Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, timeout / 2);
  (void)WaitAll(works[1], milliseconds(10000));  // the dead sidecar's clients

  const std::string alone = cluster.UniqueName("gpu-after-peer-loss");
  ASSERT_TRUE(cluster.CreateGroup(alone, {0}, milliseconds(30000), [](int) { return 0; }).ok())
      << cluster.Logs();
  TestGroup survivor = TestGroup::Cuda(&cluster, alone, {0}, {0});
  CheckAllReduce(survivor, DType::kFloat32, ReduceOp::Sum(), TensorKind::kCuda, seed_ += 1000);
}

// Creates the shrinking CUDA group `name` on GPU 0 of `clients` (rank i joins through
// clients[i]), meeting in the store at `store_address`, all joining at once; the first error, or
// OK.
Status CreateShrinkingCudaGroup(const std::string& name, const std::vector<Client*>& clients,
                                const std::string& store_address) {
  std::vector<Status> created(clients.size());
  std::vector<std::thread> joining;
  for (size_t rank = 0; rank < clients.size(); ++rank) {
    joining.emplace_back([&, rank] {
      GroupOptions options;
      options.name = name;
      options.rank = static_cast<int>(rank);
      options.world_size = static_cast<int>(clients.size());
      options.store_address = store_address;
      options.timeout = milliseconds(60000);
      options.cuda_device = 0;
      options.shrink = true;
      auto info = clients[rank]->CreateGroup(options);
      created[rank] = info.ok() ? Status::Ok() : info.status();
    });
  }
  for (std::thread& thread : joining) thread.join();
  for (const Status& status : created) {
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

// Every rank of `clients` allreduces a float32 tensor of `count` elements holding rank + 1 on
// GPU 0; the first element of each result, or NaN for a rank whose op failed (ADD_FAILURE).
std::vector<float> AllReduceOnGpu(const std::string& group, const std::vector<Client*>& clients,
                                  size_t count) {
  std::vector<std::shared_ptr<DeviceBlock>> tensors;
  std::vector<std::shared_ptr<ClientWork>> works;
  for (size_t rank = 0; rank < clients.size(); ++rank) {
    tensors.push_back(DeviceFloats(count, static_cast<float>(rank + 1)));
    if (tensors.back() == nullptr) return {};
    works.push_back(clients[rank]->AllReduce(
        group, ClientTensor::Cuda(tensors.back()->data(), 0, DType::kFloat32, count)));
  }
  std::vector<float> firsts;
  for (size_t rank = 0; rank < clients.size(); ++rank) {
    const Status status = works[rank]->Wait(milliseconds(30000));
    EXPECT_TRUE(status.ok()) << "rank " << rank << ": " << status.ToString();
    firsts.push_back(status.ok() ? FirstFloat(*tensors[rank]) : std::nanf(""));
  }
  return firsts;
}

// A shrinking CUDA group of three ranks on two sidecars sharing GPU 0 (rank 2 a trainer of its
// own on sidecar 1) loses rank 2's trainer: the others go on in epoch 1, a new NCCL
// communicator between the two sidecars, with the survivors' sum rescaled by 3 / 2.
TEST(GpuShrinkingGroup, ALostTrainerLeavesTheOthersGoingOnWithANewCommunicator) {
  const std::string skip = MissingGpus(TwoSidecarsOneGpu());
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto started = Cluster::Start(TwoSidecarsOneGpu());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& cluster = **started;
  auto leaver = Client::Connect(cluster.sidecar(1).unix_address());
  ASSERT_TRUE(leaver.ok()) << leaver.status().ToString();
  const std::string name = cluster.UniqueName("gpu-shrink-trainer");
  const Status created = CreateShrinkingCudaGroup(
      name, {&cluster.client(0), &cluster.client(1), leaver->get()}, cluster.store_address());
  ASSERT_TRUE(created.ok()) << created.ToString() << "\n" << cluster.Logs();
  EXPECT_EQ(AllReduceOnGpu(name, {&cluster.client(0), &cluster.client(1), leaver->get()}, 1 << 20),
            (std::vector<float>{6, 6, 6}));
  leaver->reset();  // its session ends: the trainer is lost
  EXPECT_EQ(AllReduceOnGpu(name, {&cluster.client(0), &cluster.client(1)}, 1 << 20),
            (std::vector<float>{4.5f, 4.5f}))
      << cluster.Logs();
  EXPECT_EQ(AllReduceOnGpu(name, {&cluster.client(0), &cluster.client(1)}, 1 << 20),
            (std::vector<float>{4.5f, 4.5f}));
}

// A shrinking CUDA group of one rank on each of three sidecars sharing GPU 0; rank r contributes
// r + 1 to a SUM: 6 over the three, and 3 over ranks 0 and 1, rescaled by 3 / 2 to 4.5 once
// sidecar 2 is lost. Sidecar 2 is SIGKILLed while ops of 64 MiB run (NCCL over its socket
// transport): on ranks 0 and 1 every op completes, the same on both, with the whole group's sum
// up to some op and the survivors' after it (run again from the outputs kept on the device),
// and the group goes on in epoch 1.
TEST(GpuShrinkingGroup, APeerSidecarKilledMidOpsLeavesTheOthersGoingOnWithOneOutcomePerOp) {
  const std::string skip = MissingGpus(ThreeSidecarsOneGpu());
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto started = Cluster::Start(ThreeSidecarsOneGpu());  // its own: this test kills a sidecar
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& cluster = **started;
  const std::string name = cluster.UniqueName("gpu-shrink");
  const Status created = CreateShrinkingCudaGroup(
      name, {&cluster.client(0), &cluster.client(1), &cluster.client(2)}, cluster.store_address());
  ASSERT_TRUE(created.ok()) << created.ToString() << "\n" << cluster.Logs();

  constexpr int kOps = 12;
  constexpr size_t kCount = size_t{16} << 20;
  std::vector<std::vector<std::shared_ptr<DeviceBlock>>> tensors(3);
  std::vector<std::vector<std::shared_ptr<ClientWork>>> works(3);
  for (int op = 0; op < kOps; ++op) {
    for (int rank = 0; rank < 3; ++rank) {
      tensors[rank].push_back(DeviceFloats(kCount, static_cast<float>(rank + 1)));
      ASSERT_NE(tensors[rank].back(), nullptr);
      works[rank].push_back(cluster.client(rank).AllReduce(
          name, ClientTensor::Cuda(tensors[rank].back()->data(), 0, DType::kFloat32, kCount)));
    }
  }
  std::this_thread::sleep_for(milliseconds(50));
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(cluster.sidecar(2).process().SignalAndWait(SIGKILL, milliseconds(5000)).ok());
  (void)WaitAll(works[2], milliseconds(10000));  // the dead sidecar's clients
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<Status> statuses = WaitAll(works[rank], milliseconds(60000));
    for (int op = 0; op < kOps; ++op) {
      ASSERT_TRUE(statuses[op].ok())
          << "rank " << rank << " op " << op << ": " << statuses[op].ToString() << "\n"
          << cluster.Logs();
    }
  }
  std::cout << "the survivors' ops completed "
            << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() -
                                                        killed_at)
                   .count()
            << " ms after the SIGKILL" << std::endl;
  int cut = 0;
  for (int op = 0; op < kOps; ++op) {
    SCOPED_TRACE("op " + std::to_string(op));
    const float first = FirstFloat(*tensors[0][op]);
    if (first == 6.0f) {
      EXPECT_EQ(cut, op) << "an op with the whole group's sum after one with the survivors'";
      cut = op + 1;
    } else {
      EXPECT_EQ(first, 4.5f);
    }
    float last = 0;
    ASSERT_TRUE(CopyFromDevice(0, tensors[1][op]->data() + (kCount - 1) * sizeof(float), &last,
                               sizeof(last))
                    .ok());
    EXPECT_EQ(last, first) << "rank 1's last element against rank 0's first";
  }
  std::cout << cut << " of " << kOps << " ops ran before the cut" << std::endl;
  // The group goes on among the survivors.
  EXPECT_EQ(AllReduceOnGpu(name, {&cluster.client(0), &cluster.client(1)}, 1024),
            (std::vector<float>{4.5f, 4.5f}));
}

}  // namespace
}  // namespace collectived::sidecar_test
