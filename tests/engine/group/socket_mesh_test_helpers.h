// Helpers of the files of socket_mesh_test: SocketMeshTest, which forms the connections of a
// mesh over real loopback TCP (meeting through one MemoryStore) and runs them on one Reactor, and
// the outcome of a callback, the test's own polling, and the blocks nodes contribute.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "engine/concurrency/runtime.h"
#include "engine/group/core/op_tags.h"
#include "engine/group/transport/socket/socket_handshake.h"
#include "engine/group/transport/socket/socket_mesh.h"
#include "engine/store/memory_store.h"

namespace collectived {
namespace socket_mesh_testing {

using std::chrono::milliseconds;
using Meshes = std::vector<std::shared_ptr<SocketMesh>>;

inline uint32_t ControlTag(uint64_t sequence) {
  return OpTags(sequence).Control<OpTags::kSignatures>();
}

class SocketMeshTest : public ::testing::Test {
 protected:
  SocketMeshTest() {
    StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create();
    EXPECT_TRUE(runtime.ok());
    runtime_ = std::move(*runtime);
  }
  // The meshes go before the runtime they run on.
  ~SocketMeshTest() override { meshes_.clear(); }

  // Forms the connections of `nodes` nodes (concurrently, as sidecars do) and runs them.
  Meshes& ConnectAll(int nodes) {
    std::vector<std::future<StatusOr<MeshConnections>>> pending;
    for (int node = 0; node < nodes; ++node) {
      pending.push_back(std::async(std::launch::async, [this, node, nodes] {
        return ConnectSocketMesh("g", "127.0.0.1", store_, node, nodes, milliseconds(10000));
      }));
    }
    for (int node = 0; node < nodes; ++node) {
      StatusOr<MeshConnections> fds = pending[node].get();
      EXPECT_TRUE(fds.ok()) << fds.status().message();
      if (!fds.ok()) continue;
      StatusOr<std::shared_ptr<SocketMesh>> mesh =
          SocketMesh::Start("g", node, std::move(*fds), *runtime_);
      EXPECT_TRUE(mesh.ok()) << mesh.status().message();
      if (mesh.ok()) meshes_.push_back(*mesh);
    }
    return meshes_;
  }

  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
  std::shared_ptr<Runtime> runtime_;
  Meshes meshes_;
};

// A callback's outcome, waited for with a bound (a hang fails the test instead of blocking it).
class Outcome {
 public:
  ControlChannel::Done Callback() {
    return [this](const Status& status) { promise_.set_value(status); };
  }
  bool Arrives(milliseconds within = milliseconds(20000)) {
    return future_.wait_for(within) == std::future_status::ready;
  }
  Status Get() {
    EXPECT_TRUE(Arrives()) << "no completion";
    return future_.get();
  }

 private:
  std::promise<Status> promise_;
  std::shared_future<Status> future_ = promise_.get_future().share();
};

// Polls `condition` (the test's own check, with a bound) for up to ten seconds.
inline bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

// Node n contributes sizes[n] bytes, byte i of which is (n * 31 + i) % 251.
inline std::vector<std::byte> Block(int node, size_t bytes) {
  std::vector<std::byte> block(bytes);
  for (size_t i = 0; i < bytes; ++i) block[i] = std::byte((node * 31 + i) % 251);
  return block;
}

}  // namespace socket_mesh_testing
}  // namespace collectived
