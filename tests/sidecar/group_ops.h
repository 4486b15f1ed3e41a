// Driving one group of a Cluster from the test: where each rank's tensors live (shared memory,
// inline, or a mix), issuing an op on every rank at once, and one checker per collective that
// runs it and compares every rank's result with the reference (tests/sidecar/reference.h).
//
// The checkers report through GoogleTest (ADD_FAILURE) and never hang: every wait is bounded.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "clients/cpp/client.h"
#include "tests/sidecar/device_block.h"
#include "tests/sidecar/reference.h"
#include "tests/sidecar/sidecar_cluster.h"

namespace collectived::sidecar_test {

// Where a rank's tensors live: its registered shared memory, inline in the request, a mix, or
// (in the GPU tests, with a TestGroup of a CUDA device) CUDA device memory.
enum class TensorKind { kShm, kInline, kMixed, kCuda };
std::string KindName(TensorKind kind);
inline constexpr TensorKind kAllTensorKinds[] = {TensorKind::kShm, TensorKind::kInline,
                                                 TensorKind::kMixed};
// Whether tensor `index` of group rank `rank` lives in shared memory: always for kShm, never
// for kInline, alternating over ranks and tensors for kMixed.
bool UseShm(TensorKind kind, int rank, size_t index);

// Tensor memory for one rank and one op: shared-memory tensors in [begin, end) of the rank's
// registered buffer, inline tensors in host memory. Every tensor is surrounded by guard bytes,
// and tensors without initial data are filled with a sentinel, so writes outside a tensor and
// outputs that were never written are both caught.
class Arena {
 public:
  Arena(const RegisteredBuffer* buffer, size_t begin, size_t end)
      : buffer_(buffer), next_(begin), end_(end) {}
  // Every tensor in CUDA device memory of `cuda_device`, a cudaMalloc of its own (with guards).
  explicit Arena(int cuda_device) : buffer_(nullptr), next_(0), end_(0), device_(cuda_device) {}

  // A tensor of `count` elements holding `init` (or the sentinel when `init` is empty).
  ClientTensor Make(DType dtype, size_t count, bool in_shm, const std::vector<std::byte>& init);
  ClientTensor Make(DType dtype, const std::vector<Value>& values, bool in_shm) {
    return Make(dtype, values.size(), in_shm, Encode(dtype, values));
  }
  // The tensor's current bytes.
  static std::vector<std::byte> Bytes(const ClientTensor& tensor);
  static std::vector<Value> Values(const ClientTensor& tensor) {
    return Decode(tensor.dtype, Bytes(tensor));
  }
  // "" when every guard is intact, else which tensor's guard was overwritten.
  std::string CheckGuards() const;

 private:
  struct Region {
    std::byte* data;  // host, shared or device memory (device_ >= 0)
    size_t bytes;
  };
  ClientTensor MakeOnDevice(DType dtype, size_t count, const std::vector<std::byte>& init);

  const RegisteredBuffer* buffer_;
  size_t next_;
  size_t end_;
  int device_ = -1;
  std::deque<std::vector<std::byte>> host_;
  std::vector<std::shared_ptr<DeviceBlock>> blocks_;
  std::vector<Region> regions_;
};

// One group of a cluster, as its members (sorted global ranks) see it.
class TestGroup {
 public:
  TestGroup() = default;
  // `slot` picks which quarter of each rank's registered buffer this group's tensors use, so
  // several groups can run ops at once on the same ranks.
  TestGroup(Cluster* cluster, std::string name, std::vector<int> members, int slot = 0)
      : cluster_(cluster), name_(std::move(name)), members_(std::move(members)), slot_(slot) {}
  // A CUDA group: group rank g's tensors in device memory of CUDA device `devices[g]`.
  static TestGroup Cuda(Cluster* cluster, std::string name, std::vector<int> members,
                        std::vector<int> devices) {
    TestGroup group(cluster, std::move(name), std::move(members));
    group.cuda_devices_ = std::move(devices);
    return group;
  }

  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }
  int global_rank(int group_rank) const { return members_[group_rank]; }
  Client& client(int group_rank) const { return cluster_->client(members_[group_rank]); }
  Cluster& cluster() const { return *cluster_; }

  // Fresh tensor memory for one op, one Arena per group rank.
  std::vector<Arena> Arenas() const;
  // Calls `submit(group_rank)` for every group rank in order (every call returns at once).
  std::vector<std::shared_ptr<ClientWork>> Issue(
      const std::function<std::shared_ptr<ClientWork>(int)>& submit) const;

 private:
  Cluster* cluster_ = nullptr;
  std::string name_;
  std::vector<int> members_;
  int slot_ = 0;
  std::vector<int> cuda_devices_;  // by group rank; empty for a CPU group
};

// Waits for `works`; reports every failure (naming `what` and the group rank) and returns
// whether all succeeded. For collectives (`same_sequence`), also checks that every rank got
// the same, non-zero sequence number.
bool ExpectAllOk(const std::vector<std::shared_ptr<ClientWork>>& works, const std::string& what,
                 bool same_sequence = true);
// Reports a failure naming `what` when `tensor` does not hold `expected`.
void ExpectValues(const ClientTensor& tensor, const std::vector<Value>& expected,
                  const std::string& what);
void ExpectGuards(const std::vector<Arena>& arenas, const std::string& what);

// One checker per collective: runs the op once on every rank of `group` (rooted ops: once per
// root; send/recv: a pattern of messages with several tags) with fresh data derived from
// `seed`, and compares every rank's outputs with the reference. Reducing ops take the op.
void CheckAllReduce(const TestGroup& group, DType dtype, const ReduceOp& op, TensorKind kind,
                    uint64_t seed);
void CheckAllReduceCoalesced(const TestGroup& group, DType dtype, const ReduceOp& op,
                             TensorKind kind, uint64_t seed);
void CheckBroadcast(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
void CheckReduce(const TestGroup& group, DType dtype, const ReduceOp& op, int root, TensorKind kind,
                 uint64_t seed);
void CheckAllGather(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
void CheckAllGatherIntoTensor(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
void CheckAllGatherCoalesced(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
void CheckReduceScatter(const TestGroup& group, DType dtype, const ReduceOp& op, TensorKind kind,
                        uint64_t seed);
void CheckReduceScatterTensor(const TestGroup& group, DType dtype, const ReduceOp& op,
                              TensorKind kind, uint64_t seed);
void CheckAllToAll(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
// Uneven split sizes (some of them 0), then equal splits given as empty split lists.
void CheckAllToAllSingle(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
void CheckGather(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
void CheckScatter(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
// No rank leaves the barrier before the last one has entered it.
void CheckBarrier(const TestGroup& group);
// Every rank sends to the next rank (tags 7 and 8, received in the opposite order) and, in
// groups of more than two, to the one after (tag 9); receives are posted before the sends.
void CheckSendRecv(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);
// Every other rank sends two messages with one tag to rank 0, which posts one recv from the
// last rank and then recvs from any rank: each send is received exactly once, each sender's
// messages in order, and every recv names its sender (the named recv gets the last rank's
// first message).
void CheckAnySourceRecv(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);

// Every collective once (reducing ones with SUM) on `group`, for the subgroup tests.
void CheckEveryCollective(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed);

// The collectives the matrices check (kSend stands for send and recv together).
inline constexpr CollectiveType kCheckedCollectives[] = {
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
    CollectiveType::kSend,
};

// One test of a collective matrix: a collective on a topology with one dtype.
struct MatrixCase {
  Topology topology;
  CollectiveType type;
  DType dtype;  // kUnspecified for barrier
};
void PrintTo(const MatrixCase& c, std::ostream* os);
// Every checked collective with each of `dtypes` (barrier once) on `topology`.
std::vector<MatrixCase> MatrixCases(const Topology& topology, const std::vector<DType>& dtypes);
// "<collective>_<dtype>" ("send_recv_float32", "barrier"): the test's name in ctest.
std::string MatrixCaseName(const ::testing::TestParamInfo<MatrixCase>& info);

// Whether `type` takes a ReduceOp.
bool IsReducingType(CollectiveType type);

// Checks collective `type` on `group` with tensors of `kind`: reducing collectives once per
// ReduceOp that applies to `dtype` (reduce with the root moving over the ranks), kSend as
// send/recv and any-source recv, kBarrier as three barriers (dtype and kind unused). `seed`
// advances for every op, so each gets distinct data.
void CheckCollective(const TestGroup& group, CollectiveType type, DType dtype, TensorKind kind,
                     uint64_t* seed);

}  // namespace collectived::sidecar_test
