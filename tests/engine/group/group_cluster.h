// Test helpers for groups over the in-process fabric: tensors over heap memory, op requests,
// and Cluster, the sidecars of one group built by hand (ranks are threads, sidecars are
// simulated in this process, each on a runtime of its own).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/runtime.h"
#include "engine/group/core/group.h"
#include "engine/group/transport/in_process/in_process_fabric.h"

namespace collectived {
namespace group_testing {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kInt32;
  return DType::kInt64;
}

// A tensor over heap memory that the view owns, labelled as living on `device` (the simulated
// device of CUDA groups is host memory too).
template <typename T>
TensorView Tensor(std::vector<T> values, Device device = Device{}) {
  auto owner = std::make_shared<std::vector<T>>(std::move(values));
  return TensorView{DTypeOf<T>(), owner->size(), reinterpret_cast<std::byte*>(owner->data()),
                    owner,        device,        nullptr};
}

template <typename T = int64_t>
TensorView Zeros(size_t count) {
  return Tensor(std::vector<T>(count, 0));
}

template <typename T = int64_t>
std::vector<T> Values(const TensorView& tensor) {
  const T* data = reinterpret_cast<const T*>(tensor.data);
  return std::vector<T>(data, data + tensor.count);
}

// Runs fn(rank) on one thread per rank and joins them.
inline void ForEachRank(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) threads.emplace_back(fn, rank);
  for (auto& thread : threads) thread.join();
}

// Where a failed sidecar publishes its reason for the others (what the registry does through
// the rendezvous store).
struct FailureBoard {
  std::mutex mutex;
  std::optional<Status> failure;
};

// Polls `condition` (the test's own check of a result, not of the code under test's waits) for up
// to `limit`.
inline bool Eventually(const std::function<bool()>& condition,
                       milliseconds limit = milliseconds(10000)) {
  const auto deadline = SteadyClock::now() + limit;
  while (!condition()) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

// The sidecars of one group, built by hand: GroupTopology::FromSidecarIds, a concurrent Connect
// per sidecar through the fabric, then one Group per sidecar, each on a runtime of its own (its
// sidecar's threads and clock).
class Cluster {
 public:
  struct Options {
    milliseconds timeout{10000};
    bool publish_failures = true;  // hooks over a FailureBoard
    // Sidecar ids a roll call reports silent (none answers when empty: no roll call hook).
    std::vector<std::string> silent;
    std::shared_ptr<OpObserver> observer;  // every node's
    collectived::Clock* clock = nullptr;   // the fabric's and every node's runtime's (null: real)
    std::chrono::milliseconds stuck_threshold{0};
    DeviceKind device = DeviceKind::kCpu;  // kCuda: the fabric's simulated device
    size_t max_ops_in_flight = 16;
    int split_digest_above_ranks = GroupSpec{}.split_digest_above_ranks;
  };

  Cluster(std::string name, std::vector<std::string> sidecar_of_rank, Options options)
      : fabric_(InProcessFabric::Create(options.clock ? *options.clock : Clock::Real())),
        name_(std::move(name)) {
    std::vector<std::string> ids;
    for (const auto& id : sidecar_of_rank) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    std::vector<GroupTopology> topologies;
    for (const auto& id : ids) {
      StatusOr<GroupTopology> topology = GroupTopology::FromSidecarIds(sidecar_of_rank, id);
      EXPECT_TRUE(topology.ok()) << topology.status().ToString();
      topologies.push_back(*topology);
    }
    std::vector<std::optional<StatusOr<GroupTransport>>> transports(ids.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ids.size(); ++i) {
      threads.emplace_back([&, i] {
        ConnectRequest request{name_, options.device, topologies[i], nullptr, milliseconds(5000)};
        transports[i].emplace(fabric_->Connect(request));
      });
    }
    for (auto& thread : threads) thread.join();
    std::vector<int> members(sidecar_of_rank.size());
    for (size_t r = 0; r < members.size(); ++r) members[r] = static_cast<int>(r);
    nodes_.resize(ids.size());
    runtimes_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_TRUE(transports[i]->ok()) << transports[i]->status().ToString();
      const int node = topologies[i].my_node;
      Group::Hooks hooks;
      if (options.publish_failures) {
        hooks.publish_failure = [board = board_](const Status& reason, uint64_t) {
          std::lock_guard<std::mutex> lock(board->mutex);
          if (!board->failure) board->failure = reason;
        };
        hooks.lookup_failure = [board = board_]() {
          std::lock_guard<std::mutex> lock(board->mutex);
          return board->failure;
        };
      }
      if (!options.silent.empty()) {
        hooks.roll_call = [silent = options.silent](const std::vector<std::string>& peer_ids,
                                                    milliseconds) {
          std::vector<int> result;
          for (size_t p = 0; p < peer_ids.size(); ++p) {
            if (std::find(silent.begin(), silent.end(), peer_ids[p]) != silent.end())
              result.push_back(static_cast<int>(p));
          }
          return std::optional<std::vector<int>>(result);
        };
      }
      GroupSpec spec;
      spec.name = name_;
      spec.members = members;
      spec.timeout = options.timeout;
      spec.flight_recorder_size = 64;
      spec.observer = options.observer;
      spec.stuck_threshold = options.stuck_threshold;
      spec.device = options.device;
      spec.max_ops_in_flight = options.max_ops_in_flight;
      spec.split_digest_above_ranks = options.split_digest_above_ranks;
      // The whole suite runs a second time with every group agreeing through summaries
      // (ctest's *_summary_agreement variant).
      if (const char* from = std::getenv("COLLECTIVED_TEST_SUMMARY_AGREEMENT_FROM_NODES")) {
        spec.summary_agreement_from_nodes = std::atoi(from);
      }
      RuntimeOptions runtime_options;
      runtime_options.clock = options.clock;
      runtime_options.executor.threads = 2;
      StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create(runtime_options);
      EXPECT_TRUE(runtime.ok());
      runtimes_[node] = *runtime;
      nodes_[node] =
          std::make_unique<Group>(std::move(spec), topologies[i], std::move(**transports[i]),
                                  std::move(hooks), *runtimes_[node]);
    }
    node_of_rank_ = topologies[0].node_of_rank;
  }

  Cluster(std::string name, std::vector<std::string> sidecar_of_rank)
      : Cluster(std::move(name), std::move(sidecar_of_rank), Options()) {}

  ~Cluster() {
    for (auto& group : nodes_) group->Stop();
    for (auto& group : nodes_) {
      EXPECT_TRUE(Eventually([&] { return group->Quiescent(); }, milliseconds(5000)))
          << "work for the group still going on after Stop";
    }
    nodes_.clear();  // before their runtimes
  }

  int size() const { return static_cast<int>(node_of_rank_.size()); }
  int node_count() const { return static_cast<int>(nodes_.size()); }
  Group& node(int index) { return *nodes_[index]; }
  Group& of(int rank) { return *nodes_[node_of_rank_[rank]]; }
  std::shared_ptr<Work> Submit(int rank, OpRequest request) {
    return of(rank).Submit(rank, std::move(request));
  }
  InProcessFabric& fabric() { return *fabric_; }
  const std::string& name() const { return name_; }
  Runtime& runtime(int node) { return *runtimes_[node]; }

 private:
  std::shared_ptr<InProcessFabric> fabric_;
  std::string name_;
  std::shared_ptr<FailureBoard> board_ = std::make_shared<FailureBoard>();
  std::vector<std::shared_ptr<Runtime>> runtimes_;  // by node index; outlive the groups
  std::vector<std::unique_ptr<Group>> nodes_;       // by node index
  std::vector<int> node_of_rank_;
};

inline OpRequest AllReduce(TensorView tensor, ReduceOp op = ReduceOp::Sum(),
                           milliseconds timeout = kUseGroupTimeout) {
  OpRequest request;
  request.kind = OpKind::kAllReduce;
  request.reduce_op = op;
  request.inputs = {std::move(tensor)};
  request.timeout = timeout;
  return request;
}

inline OpRequest PointToPointOp(OpKind kind, TensorView tensor, int peer, int64_t tag,
                                milliseconds timeout = kUseGroupTimeout) {
  OpRequest request;
  request.kind = kind;
  request.peer = peer;
  request.tag = tag;
  (kind == OpKind::kSend ? request.inputs : request.outputs) = {std::move(tensor)};
  request.timeout = timeout;
  return request;
}

inline Status WaitFor(const std::shared_ptr<Work>& work) {
  return work->Wait(milliseconds(10000));
}

// Waits for `work` at most `limit` of real time, whatever clock the group runs on (with a
// ManualClock, Work::Wait's own timeout would never pass); Timeout if it did not complete.
inline Status WaitReally(const std::shared_ptr<Work>& work,
                         milliseconds limit = milliseconds(20000)) {
  (void)work->future().WaitUntil(SteadyClock::now() + limit);
  if (!work->IsCompleted()) {
    return Status::Timeout("the test's bound: " + work->info().Describe() +
                           " did not complete within " + std::to_string(limit.count()) +
                           " ms of real time");
  }
  return work->status();
}

// On a cluster of two sidecars with one rank each: rank 0 sends 2 elements (on `device`) where
// rank 1 receives 1. The recv fails naming both sizes; the bytes are taken and dropped, so the
// send completes and the pair's stream stays in step (the next recv gets the next send's bytes);
// neither sidecar fails its group.
inline void ExpectARemoteSizeMismatchKeepsTheStreamInStep(Cluster& cluster, Device device) {
  auto send =
      cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({0, 0}, device), 1, 0));
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Tensor<int64_t>({0}, device), 0, 0));
  Status status = WaitFor(recv);
  EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  EXPECT_NE(status.message().find("has 16 bytes but the matching recv expects 8"),
            std::string::npos)
      << status.message();
  EXPECT_TRUE(WaitFor(send).ok()) << send->status().ToString();
  TensorView next = Tensor<int64_t>({0}, device);
  auto next_recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, next, 0, 0));
  EXPECT_TRUE(
      WaitFor(cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({8}, device), 1, 0)))
          .ok());
  EXPECT_TRUE(WaitFor(next_recv).ok()) << next_recv->status().ToString();
  EXPECT_EQ(Values(next), std::vector<int64_t>{8});
  EXPECT_TRUE(cluster.node(0).failure().ok());
  EXPECT_TRUE(cluster.node(1).failure().ok());
}

}  // namespace group_testing
}  // namespace collectived
