// SocketMesh over real loopback TCP, each node's connections formed on a thread of its own
// (ConnectSocketMesh, meeting through one MemoryStore) and then run by one Reactor: the mesh
// forms (and refuses a stray connection), allgathers of any sizes (large ones included, which
// need both directions to move at once) arrive intact in node order, an exchange waits for its
// peer as state, not as a thread, point-to-point transfers meet by key in order and move only
// into a receive's buffer, and a closed mesh, a vanished peer and a mismatched message each give
// their error.
#include "engine/group/transport/socket/socket_mesh.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/group/core/op_tags.h"
#include "engine/group/transport/socket/socket_handshake.h"
#include "engine/store/memory_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using Meshes = std::vector<std::shared_ptr<SocketMesh>>;

uint32_t ControlTag(uint64_t sequence) {
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
bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

// Node n contributes sizes[n] bytes, byte i of which is (n * 31 + i) % 251.
std::vector<std::byte> Block(int node, size_t bytes) {
  std::vector<std::byte> block(bytes);
  for (size_t i = 0; i < bytes; ++i) block[i] = std::byte((node * 31 + i) % 251);
  return block;
}

TEST_F(SocketMeshTest, AllGathersEverySizeInNodeOrder) {
  Meshes& meshes = ConnectAll(3);
  ASSERT_EQ(meshes.size(), 3u);
  const std::vector<std::vector<size_t>> rounds = {
      {40, 40, 40}, {0, 16, 0}, {8 << 20, 3 << 20, 1}, {1, 2, 3}};
  for (size_t round = 0; round < rounds.size(); ++round) {
    const std::vector<size_t>& sizes = rounds[round];
    size_t total = 0;
    for (size_t bytes : sizes) total += bytes;
    std::vector<std::vector<std::byte>> all(3, std::vector<std::byte>(total));
    std::vector<Outcome> outcomes(3);
    for (int node = 0; node < 3; ++node) {
      std::vector<std::byte> mine = Block(node, sizes[node]);  // copied by the call
      meshes[node]->StartAllGather(mine.data(), all[node].data(), sizes, ControlTag(round + 1),
                                   outcomes[node].Callback());
    }
    std::vector<std::byte> expected;
    for (int node = 0; node < 3; ++node) {
      std::vector<std::byte> block = Block(node, sizes[node]);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    for (int node = 0; node < 3; ++node) {
      Status status = outcomes[node].Get();
      ASSERT_TRUE(status.ok()) << "round " << round << " node " << node << ": " << status.message();
      EXPECT_TRUE(all[node] == expected) << "round " << round << " node " << node;
    }
  }
  EXPECT_TRUE(Eventually([&] { return meshes[0]->Idle() && meshes[1]->Idle(); }));
}

TEST(DisseminationPeersTest, AtMostTwoPerDoublingAndSymmetric) {
  for (int count : {1, 2, 3, 5, 8, 13, 64, 100, 1024}) {
    int rounds = 0;
    while ((1 << rounds) < count) ++rounds;
    for (int node = 0; node < count; ++node) {
      std::vector<int> peers = DisseminationPeers(node, count);
      EXPECT_LE(peers.size(), static_cast<size_t>(2 * rounds)) << count;
      for (int peer : peers) {
        ASSERT_NE(peer, node);
        std::vector<int> back = DisseminationPeers(peer, count);
        // A connection is made by both ends: each must count the other among its peers.
        EXPECT_TRUE(std::binary_search(back.begin(), back.end(), node))
            << node << " and " << peer << " of " << count;
      }
    }
  }
  EXPECT_EQ(DisseminationPeers(0, 8), (std::vector<int>{1, 2, 4, 6, 7}));
  EXPECT_EQ(DisseminationPeers(3, 1024).size(), 19u);  // ±512 is one node
}

// Sizes that are not powers of two take a last round that passes fewer parts; every part still
// arrives in node order, and each node holds connections to its dissemination peers only.
TEST_F(SocketMeshTest, AllGathersOverDisseminationPeersOnlyAtAnySize) {
  for (int nodes : {5, 8, 13}) {
    meshes_.clear();
    store_ = std::make_shared<MemoryStore>();  // each group meets under keys of its own
    Meshes& meshes = ConnectAll(nodes);
    ASSERT_EQ(meshes.size(), static_cast<size_t>(nodes));
    for (int node = 0; node < nodes; ++node) {
      EXPECT_EQ(meshes[node]->connections(),
                static_cast<int>(DisseminationPeers(node, nodes).size()))
          << node << " of " << nodes;
    }
    for (uint64_t round = 1; round <= 3; ++round) {
      std::vector<size_t> sizes;
      for (int node = 0; node < nodes; ++node) sizes.push_back((node * 7 + round * 3) % 11);
      size_t total = 0;
      for (size_t bytes : sizes) total += bytes;
      std::vector<std::vector<std::byte>> all(nodes, std::vector<std::byte>(total));
      std::vector<Outcome> outcomes(nodes);
      for (int node = nodes; node-- > 0;) {  // the last node first: rounds wait as state
        std::vector<std::byte> mine = Block(node, sizes[node]);
        meshes[node]->StartAllGather(mine.data(), all[node].data(), sizes, ControlTag(round),
                                     outcomes[node].Callback());
      }
      std::vector<std::byte> expected;
      for (int node = 0; node < nodes; ++node) {
        std::vector<std::byte> block = Block(node, sizes[node]);
        expected.insert(expected.end(), block.begin(), block.end());
      }
      for (int node = 0; node < nodes; ++node) {
        Status status = outcomes[node].Get();
        ASSERT_TRUE(status.ok()) << nodes << " nodes, node " << node << ": " << status.message();
        EXPECT_TRUE(all[node] == expected)
            << nodes << " nodes, round " << round << ", node " << node;
      }
    }
  }
}

// A summary of a range of nodes: which ones, and their sum. Combining checks that the ranges
// follow each other, so the result shows both the order and that no node counted twice.
struct RangeSum {
  int32_t first = 0;
  int32_t last = 0;
  int32_t out_of_order = 0;
  int32_t pad = 0;
  int64_t sum = 0;
};

ControlChannel::Combine CombineRanges() {
  return [](std::byte* acc_bytes, const std::byte* later_bytes) {
    RangeSum acc, later;
    std::memcpy(&acc, acc_bytes, sizeof(acc));
    std::memcpy(&later, later_bytes, sizeof(later));
    acc.out_of_order |= later.out_of_order | (later.first != acc.last + 1 ? 1 : 0);
    acc.last = later.last;
    acc.sum += later.sum;
    std::memcpy(acc_bytes, &acc, sizeof(acc));
  };
}

TEST_F(SocketMeshTest, AllReducesSummariesInNodeOrderUpAndDownTheTree) {
  for (int nodes : {1, 2, 5, 8, 13}) {
    meshes_.clear();
    store_ = std::make_shared<MemoryStore>();
    Meshes& meshes = ConnectAll(nodes);
    ASSERT_EQ(meshes.size(), static_cast<size_t>(nodes));
    for (uint64_t round = 1; round <= 3; ++round) {
      std::vector<RangeSum> in(nodes), out(nodes);
      std::vector<Outcome> outcomes(nodes);
      int64_t expected = 0;
      for (int node = nodes; node-- > 0;) {
        in[node] = RangeSum{node, node, 0, 0, node * 100 + static_cast<int64_t>(round)};
        expected += in[node].sum;
        meshes[node]->StartAllReduce(&in[node], &out[node], sizeof(RangeSum), CombineRanges(),
                                     ControlTag(round), outcomes[node].Callback());
      }
      for (int node = 0; node < nodes; ++node) {
        Status status = outcomes[node].Get();
        ASSERT_TRUE(status.ok()) << nodes << " nodes, node " << node << ": " << status.message();
        EXPECT_EQ(out[node].first, 0);
        EXPECT_EQ(out[node].last, nodes - 1);
        EXPECT_EQ(out[node].out_of_order, 0) << nodes << " nodes, node " << node;
        EXPECT_EQ(out[node].sum, expected) << nodes << " nodes, node " << node;
      }
    }
    // Allgathers and reductions take turns on the same connections.
    std::vector<uint64_t> in(nodes), all(nodes * nodes);
    std::vector<Outcome> outcomes(nodes);
    for (int node = 0; node < nodes; ++node) {
      in[node] = node;
      meshes[node]->StartAllGather(&in[node], &all[node * nodes], std::vector<size_t>(nodes, 8),
                                   ControlTag(9), outcomes[node].Callback());
    }
    for (int node = 0; node < nodes; ++node) ASSERT_TRUE(outcomes[node].Get().ok());
  }
}

TEST_F(SocketMeshTest, AReductionWaitsAsStateNamesWhomAndFailsWhenAPeerGoes) {
  constexpr int kNodes = 8;
  Meshes& meshes = ConnectAll(kNodes);
  ASSERT_EQ(meshes.size(), static_cast<size_t>(kNodes));
  std::vector<RangeSum> in(kNodes), out(kNodes);
  std::vector<Outcome> outcomes(kNodes);
  for (int node = 0; node < kNodes; ++node) {
    if (node == 6) continue;  // node 6 (child of 4, in node 0's subtree of 4..7) never starts
    in[node] = RangeSum{node, node, 0, 0, 1};
    std::weak_ptr<SocketMesh> mesh = meshes[node];
    auto done = outcomes[node].Callback();
    meshes[node]->StartAllReduce(&in[node], &out[node], sizeof(RangeSum), CombineRanges(),
                                 ControlTag(1), [mesh, done](const Status& status) {
                                   if (auto self = mesh.lock(); self && !status.ok()) self->Close();
                                   done(status);
                                 });
  }
  EXPECT_FALSE(outcomes[0].Arrives(milliseconds(50))) << "completed without node 6";
  std::vector<int> awaited = meshes[4]->AwaitedNodes();
  EXPECT_NE(std::find(awaited.begin(), awaited.end(), 6), awaited.end());
  awaited = meshes[0]->AwaitedNodes();
  EXPECT_NE(std::find(awaited.begin(), awaited.end(), 6), awaited.end());
  const auto start = std::chrono::steady_clock::now();
  meshes[6].reset();
  for (int node = 0; node < kNodes; ++node) {
    if (node == 6) continue;
    Status status = outcomes[node].Get();
    EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << node << ": " << status.message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// One node has not started: every other one names it among the nodes it awaits (with others,
// whose parts would have come through it).
TEST_F(SocketMeshTest, AwaitedNodesIncludeTheOneThatDidNotStart) {
  constexpr int kNodes = 8;
  Meshes& meshes = ConnectAll(kNodes);
  ASSERT_EQ(meshes.size(), static_cast<size_t>(kNodes));
  std::vector<uint64_t> in(kNodes), out(kNodes * kNodes);
  std::vector<Outcome> outcomes(kNodes);
  const std::vector<size_t> sizes(kNodes, 8);
  for (int node = 0; node < kNodes; ++node) {
    if (node == 5) continue;
    in[node] = node;
    meshes[node]->StartAllGather(&in[node], &out[node * kNodes], sizes, ControlTag(1),
                                 outcomes[node].Callback());
  }
  for (int node = 0; node < kNodes; ++node) {
    if (node == 5) continue;
    ASSERT_TRUE(Eventually([&] {
      std::vector<int> awaited = meshes[node]->AwaitedNodes();
      return std::find(awaited.begin(), awaited.end(), 5) != awaited.end() &&
             std::find(awaited.begin(), awaited.end(), node) == awaited.end();
    })) << node;
  }
  in[5] = 5;
  meshes[5]->StartAllGather(&in[5], &out[5 * kNodes], sizes, ControlTag(1), outcomes[5].Callback());
  for (int node = 0; node < kNodes; ++node) {
    ASSERT_TRUE(outcomes[node].Get().ok()) << node;
    for (int from = 0; from < kNodes; ++from) EXPECT_EQ(out[node * kNodes + from], from);
  }
}

// A node vanishes mid-exchange. Its peers fail at once; the nodes that never spoke to it fail
// as the failed ones close their connections (what a group does on failure): no node waits out
// a timeout.
TEST_F(SocketMeshTest, AVanishedNodeFailsEveryExchangeThroughTheClosesOfItsPeers) {
  constexpr int kNodes = 8;
  Meshes& meshes = ConnectAll(kNodes);
  ASSERT_EQ(meshes.size(), static_cast<size_t>(kNodes));
  std::vector<char> in(kNodes), out(kNodes * kNodes);
  std::vector<Outcome> outcomes(kNodes);
  const auto start = std::chrono::steady_clock::now();
  meshes[0].reset();
  for (int node = 1; node < kNodes; ++node) {
    std::weak_ptr<SocketMesh> mesh = meshes[node];
    auto done = outcomes[node].Callback();
    meshes[node]->StartAllGather(&in[node], &out[node * kNodes], std::vector<size_t>(kNodes, 1),
                                 ControlTag(1), [mesh, done](const Status& status) {
                                   if (auto self = mesh.lock(); self && !status.ok()) self->Close();
                                   done(status);
                                 });
  }
  for (int node = 1; node < kNodes; ++node) {
    Status status = outcomes[node].Get();
    EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << node << ": " << status.message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Nodes 0 and 3 of 8 are not dissemination peers: their first transfer opens a connection
// (node 3 dials), whichever side starts first, and it is kept for the next ones.
TEST_F(SocketMeshTest, ATransferToANodeThatIsNotAPeerConnectsOnFirstUse) {
  constexpr int kNodes = 8;
  Meshes& meshes = ConnectAll(kNodes);
  ASSERT_EQ(meshes.size(), static_cast<size_t>(kNodes));
  const int before0 = meshes[0]->connections(), before3 = meshes[3]->connections();
  std::vector<std::byte> sent = Block(3, 1 << 20), received(1 << 20);
  Outcome send, recv;
  meshes[0]->StartRecv(received.data(), received.size(), 3, P2PKey{3, 0, 1}, recv.Callback());
  meshes[3]->StartSend(sent.data(), sent.size(), 0, P2PKey{3, 0, 1}, send.Callback());
  ASSERT_TRUE(send.Get().ok());
  ASSERT_TRUE(recv.Get().ok());
  EXPECT_TRUE(received == sent);
  EXPECT_EQ(meshes[0]->connections(), before0 + 1);
  EXPECT_EQ(meshes[3]->connections(), before3 + 1);
  // The lower node sends first this time, on the connection already there.
  Outcome back_send, back_recv;
  std::vector<std::byte> back = Block(0, 64), back_received(64);
  meshes[0]->StartSend(back.data(), 64, 3, P2PKey{0, 3, 2}, back_send.Callback());
  meshes[3]->StartRecv(back_received.data(), 64, 0, P2PKey{0, 3, 2}, back_recv.Callback());
  ASSERT_TRUE(back_send.Get().ok());
  ASSERT_TRUE(back_recv.Get().ok());
  EXPECT_TRUE(back_received == back);
  EXPECT_EQ(meshes[0]->connections(), before0 + 1);

  // Nodes 1 and 6: the lower one starts, and waits for the higher one's call.
  Outcome first_send, first_recv;
  meshes[1]->StartSend(back.data(), 64, 6, P2PKey{1, 6, 3}, first_send.Callback());
  EXPECT_FALSE(first_send.Arrives(milliseconds(50)));
  meshes[6]->StartRecv(back_received.data(), 64, 1, P2PKey{1, 6, 3}, first_recv.Callback());
  ASSERT_TRUE(first_send.Get().ok());
  ASSERT_TRUE(first_recv.Get().ok());
  EXPECT_TRUE(Eventually([&] {
    for (auto& mesh : meshes) {
      if (!mesh->Idle()) return false;
    }
    return true;
  }));
  // The agreement still runs over the dissemination peers alone, beside those connections.
  std::vector<uint64_t> in(kNodes), out(kNodes * kNodes);
  std::vector<Outcome> outcomes(kNodes);
  for (int node = 0; node < kNodes; ++node) {
    in[node] = node * 10;
    meshes[node]->StartAllGather(&in[node], &out[node * kNodes], std::vector<size_t>(kNodes, 8),
                                 ControlTag(1), outcomes[node].Callback());
  }
  for (int node = 0; node < kNodes; ++node) {
    ASSERT_TRUE(outcomes[node].Get().ok()) << node;
    EXPECT_EQ(out[node * kNodes + 7], 70u);
  }
}

// A transfer to a non-peer whose mesh was closed fails instead of waiting for a connection.
TEST_F(SocketMeshTest, AClosedMeshRefusesTransfersToNodesItNeverConnected) {
  constexpr int kNodes = 8;
  Meshes& meshes = ConnectAll(kNodes);
  ASSERT_EQ(meshes.size(), static_cast<size_t>(kNodes));
  std::vector<std::byte> buffer(16);
  Outcome waiting;
  meshes[0]->StartRecv(buffer.data(), 16, 3, P2PKey{3, 0, 1}, waiting.Callback());
  meshes[0]->Close();
  EXPECT_EQ(waiting.Get().kind(), ErrorKind::kPeerLost);
  Outcome later;
  meshes[0]->StartSend(buffer.data(), 16, 5, P2PKey{0, 5, 1}, later.Callback());
  ASSERT_TRUE(later.Arrives(milliseconds(0)));
  EXPECT_EQ(later.Get().kind(), ErrorKind::kPeerLost);
}

TEST_F(SocketMeshTest, OneNodeCopiesItsOwnBlockAtOnce) {
  Meshes& meshes = ConnectAll(1);
  ASSERT_EQ(meshes.size(), 1u);
  EXPECT_EQ(meshes[0]->connections(), 0);
  const char in[] = "signature";
  char out[sizeof(in)] = {};
  Outcome outcome;
  meshes[0]->StartAllGather(in, out, {sizeof(in)}, ControlTag(1), outcome.Callback());
  ASSERT_TRUE(outcome.Arrives(milliseconds(0))) << "one node has nobody to wait for";
  EXPECT_TRUE(outcome.Get().ok());
  EXPECT_STREQ(out, in);
}

TEST_F(SocketMeshTest, AnExchangeWaitsForItsPeerAsStateAndNamesTheNodeItAwaits) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  uint64_t in0 = 10, in1 = 11, out0[2] = {}, out1[2] = {};
  Outcome first;
  meshes[0]->StartAllGather(&in0, out0, {8, 8}, ControlTag(1), first.Callback());
  EXPECT_FALSE(first.Arrives(milliseconds(100))) << "completed without its peer";
  EXPECT_EQ(meshes[0]->AwaitedNodes(), std::vector<int>{1});
  Outcome second;
  meshes[1]->StartAllGather(&in1, out1, {8, 8}, ControlTag(1), second.Callback());
  EXPECT_TRUE(first.Get().ok());
  EXPECT_TRUE(second.Get().ok());
  EXPECT_EQ(out0[1], 11u);
  EXPECT_EQ(out1[0], 10u);
  EXPECT_TRUE(meshes[0]->AwaitedNodes().empty());
}

TEST_F(SocketMeshTest, CloseEndsTheExchangeInProgressAndThePeerSeesTheConnectionGo) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  uint64_t in = 0, out[2];
  Outcome blocked;
  meshes[0]->StartAllGather(&in, out, {8, 8}, ControlTag(1), blocked.Callback());
  const auto start = std::chrono::steady_clock::now();
  meshes[0]->Close();
  Status status = blocked.Get();
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.message();
  EXPECT_NE(status.message().find("closed"), std::string::npos) << status.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));

  // Node 1 has node 0's frame already; the exchange after it finds the connection gone.
  uint64_t out1[2];
  Outcome first;
  meshes[1]->StartAllGather(&in, out1, {8, 8}, ControlTag(1), first.Callback());
  (void)first.Get();
  Outcome later;
  meshes[1]->StartAllGather(&in, out1, {8, 8}, ControlTag(2), later.Callback());
  Status peer = later.Get();
  EXPECT_EQ(peer.kind(), ErrorKind::kPeerLost) << peer.message();
  EXPECT_NE(peer.message().find("sidecar node 0 of group 'g' broke"), std::string::npos)
      << peer.message();
}

TEST_F(SocketMeshTest, AVanishedPeerIsPeerLostNamingIt) {
  Meshes& meshes = ConnectAll(3);
  ASSERT_EQ(meshes.size(), 3u);
  meshes[2].reset();  // its sockets close
  char in[8] = {}, out[24];
  Outcome outcome;
  meshes[0]->StartAllGather(in, out, {8, 8, 8}, ControlTag(1), outcome.Callback());
  Status status = outcome.Get();
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.message();
  EXPECT_NE(status.message().find("sidecar node 2"), std::string::npos) << status.message();
}

// Nothing waits on the connections (a device group's ops wait on the GPU): a peer that vanishes
// still reaches the broken handler, once; a mesh's own Close does not.
TEST_F(SocketMeshTest, AVanishedPeerReachesTheBrokenHandlerWhileNothingWaits) {
  Meshes& meshes = ConnectAll(3);
  ASSERT_EQ(meshes.size(), 3u);
  Outcome broken;
  std::atomic<int> calls{0};
  meshes[0]->SetBrokenHandler([&](const Status& why) {
    if (calls.fetch_add(1) == 0) broken.Callback()(why);
  });
  std::atomic<int> close_calls{0};
  meshes[1]->SetBrokenHandler([&](const Status&) { close_calls.fetch_add(1); });
  meshes[2].reset();  // its sockets close
  Status why = broken.Get();
  EXPECT_EQ(why.kind(), ErrorKind::kPeerLost) << why.message();
  EXPECT_NE(why.message().find("sidecar node 2"), std::string::npos) << why.message();
  // Mesh 1 saw node 2 go too: its handler ran once. Closing it afterwards adds nothing.
  EXPECT_TRUE(Eventually([&] { return close_calls.load() == 1; }));
  meshes[1]->Close();
  meshes[0]->Close();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(close_calls.load(), 1);
}

TEST_F(SocketMeshTest, CloseDoesNotRunTheBrokenHandler) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  std::atomic<int> calls{0};
  meshes[0]->SetBrokenHandler([&](const Status&) { calls.fetch_add(1); });
  meshes[0]->Close();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(SocketMeshTest, AMismatchedMessageFailsInsteadOfBeingReadAsData) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  char in[8] = {}, out0[16], out1[16];
  Outcome zero, one;
  meshes[1]->StartAllGather(in, out1, {8, 8}, ControlTag(2), one.Callback());
  meshes[0]->StartAllGather(in, out0, {8, 8}, ControlTag(1), zero.Callback());
  Status status = zero.Get();
  EXPECT_EQ(status.kind(), ErrorKind::kInternal) << status.message();
  EXPECT_NE(status.message().find("control message mismatch"), std::string::npos)
      << status.message();
  EXPECT_FALSE(one.Get().ok());
}

// --- point to point ---

TEST_F(SocketMeshTest, TransfersMeetByKeyInOrderWhicheverSideComesFirst) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  const P2PKey a{0, 1, 7}, b{0, 1, 8};
  const std::vector<size_t> sizes = {5, 0, 3 << 20};
  std::vector<std::vector<std::byte>> sent;
  for (size_t i = 0; i < sizes.size(); ++i) sent.push_back(Block(static_cast<int>(i), sizes[i]));
  std::vector<std::byte> other = Block(9, 64);
  // Key b is received first although it is sent last; key a's messages arrive in send order,
  // the first receive posted before its send, the others after.
  std::vector<std::vector<std::byte>> received;
  for (size_t size : sizes) received.emplace_back(size);
  std::vector<std::byte> other_received(64);
  std::vector<Outcome> recvs(sizes.size() + 1), sends(sizes.size() + 1);
  meshes[1]->StartRecv(other_received.data(), 64, 0, b, recvs[sizes.size()].Callback());
  meshes[1]->StartRecv(received[0].data(), sizes[0], 0, a, recvs[0].Callback());
  for (size_t i = 0; i < sizes.size(); ++i) {
    meshes[0]->StartSend(sent[i].data(), sizes[i], 1, a, sends[i].Callback());
  }
  meshes[0]->StartSend(other.data(), 64, 1, b, sends[sizes.size()].Callback());
  EXPECT_TRUE(recvs[sizes.size()].Get().ok());
  EXPECT_TRUE(other_received == other);
  EXPECT_FALSE(sends[1].Arrives(milliseconds(50))) << "moved before its receive was posted";
  for (size_t i = 1; i < sizes.size(); ++i) {
    meshes[1]->StartRecv(received[i].data(), sizes[i], 0, a, recvs[i].Callback());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(recvs[i].Get().ok()) << i;
    EXPECT_TRUE(sends[i].Get().ok()) << i;
    EXPECT_TRUE(received[i] == sent[i]) << i;
  }
  EXPECT_TRUE(sends[sizes.size()].Get().ok());
  // Idle once the callbacks returned (the promises above were set from inside them).
  EXPECT_TRUE(Eventually([&] { return meshes[0]->Idle() && meshes[1]->Idle(); }));
}

// Keys are compared whole: tags that differ only above bit 31 (a 32-bit slot once merged them)
// and equal tags of other rank pairs are separate streams, whichever order their sends and
// receives are posted in.
TEST_F(SocketMeshTest, KeysThatDifferInAnyFieldAreSeparateStreams) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  constexpr int64_t kHigh = int64_t{1} << 32;
  const std::vector<P2PKey> keys = {{0, 1, 1}, {0, 1, kHigh},    {0, 1, kHigh + 1}, {0, 1, -1},
                                    {2, 1, 1}, {0, 3, 1},        {2, 3, kHigh},     {-1, -2, 0},
                                    {0, 1, 0}, {0, 1, INT64_MIN}};
  std::vector<std::vector<std::byte>> sent, received;
  for (size_t i = 0; i < keys.size(); ++i) {
    sent.push_back(Block(static_cast<int>(i), 16));
    received.emplace_back(16);
  }
  std::vector<Outcome> recvs(keys.size()), sends(keys.size());
  // Half the receives before any send, newest first; the sends in order; then the other half.
  for (size_t i = keys.size(); i-- > 0;) {
    if (i % 2 == 0) meshes[1]->StartRecv(received[i].data(), 16, 0, keys[i], recvs[i].Callback());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    meshes[0]->StartSend(sent[i].data(), 16, 1, keys[i], sends[i].Callback());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i % 2 == 1) meshes[1]->StartRecv(received[i].data(), 16, 0, keys[i], recvs[i].Callback());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(recvs[i].Get().ok()) << i;
    EXPECT_TRUE(sends[i].Get().ok()) << i;
    EXPECT_TRUE(received[i] == sent[i]) << "key " << i;
  }
  EXPECT_TRUE(Eventually([&] { return meshes[0]->Idle() && meshes[1]->Idle(); }));
}

TEST_F(SocketMeshTest, ABrokenConnectionFailsThePendingTransfersOfBothSides) {
  Meshes& meshes = ConnectAll(2);
  ASSERT_EQ(meshes.size(), 2u);
  std::vector<std::byte> buffer(16);
  Outcome send, recv;
  meshes[0]->StartSend(buffer.data(), 16, 1, P2PKey{0, 1, 1}, send.Callback());  // never cleared
  meshes[0]->StartRecv(buffer.data(), 16, 1, P2PKey{1, 0, 1}, recv.Callback());  // never sent
  EXPECT_FALSE(meshes[0]->Idle());
  meshes[1]->Close();
  EXPECT_EQ(send.Get().kind(), ErrorKind::kPeerLost);
  Status status = recv.Get();
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.message();
  EXPECT_NE(status.message().find("sidecar node 1"), std::string::npos) << status.message();
  Outcome later;
  meshes[0]->StartSend(buffer.data(), 16, 1, P2PKey{0, 1, 2}, later.Callback());
  ASSERT_TRUE(later.Arrives(milliseconds(0))) << "a broken connection refuses at once";
  EXPECT_EQ(later.Get().kind(), ErrorKind::kPeerLost);
  EXPECT_TRUE(Eventually([&] { return meshes[0]->Idle(); }));
}

// The fields of node `node`'s record in the store: host, port, secret.
std::vector<std::string> PublishedRecord(Store& store, int node) {
  StatusOr<std::string> record = store.Get("control/" + std::to_string(node), milliseconds(5000));
  EXPECT_TRUE(record.ok()) << record.status().message();
  std::vector<std::string> fields;
  if (!record.ok()) return fields;
  size_t start = 0;
  for (size_t space; (space = record->find(' ', start)) != std::string::npos; start = space + 1) {
    fields.push_back(record->substr(start, space - start));
  }
  fields.push_back(record->substr(start));
  return fields;
}

// A connection to node 0's control port from this process.
int DialControlPort(const std::string& port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo("127.0.0.1", port.c_str(), &hints, &found) != 0) return -1;
  const int fd = socket(found->ai_family, found->ai_socktype, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    close(fd);
    freeaddrinfo(found);
    return -1;
  }
  freeaddrinfo(found);
  return fd;
}

TEST_F(SocketMeshTest, AStrayConnectionIsRefusedAndTheMeshStillForms) {
  std::shared_ptr<MemoryStore> store = store_;
  auto first = std::async(std::launch::async, [&] {
    return ConnectSocketMesh("g", "127.0.0.1", store, 0, 2, milliseconds(10000));
  });
  // Someone who can reach the port but did not read node 0's secret from the store.
  const std::vector<std::string> record = PublishedRecord(*store, 0);
  ASSERT_EQ(record.size(), 3u);
  const int stray = DialControlPort(record[1]);
  ASSERT_GE(stray, 0);
  char forged[44] = "CDCTLv3";
  forged[8] = 1;  // claims node 1, with a wrong secret
  ASSERT_EQ(send(stray, forged, sizeof(forged), MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(forged)));

  // The real node 1 comes after the stray (node 0 accepts once it has read every address).
  auto second = ConnectSocketMesh("g", "127.0.0.1", store, 1, 2, milliseconds(10000));
  ASSERT_TRUE(second.ok()) << second.status().message();
  char answer[44];
  EXPECT_EQ(recv(stray, answer, sizeof(answer), 0), 0);  // closed without an answer
  close(stray);
  auto fds = first.get();
  ASSERT_TRUE(fds.ok()) << fds.status().message();
  auto zero = SocketMesh::Start("g", 0, std::move(*fds), *runtime_);
  auto one = SocketMesh::Start("g", 1, std::move(*second), *runtime_);
  ASSERT_TRUE(zero.ok() && one.ok());
  meshes_ = {*zero, *one};
  uint64_t in0 = 1, in1 = 2, out0[2] = {}, out1[2] = {};
  Outcome a, b;
  (*one)->StartAllGather(&in1, out1, {8, 8}, ControlTag(1), b.Callback());
  (*zero)->StartAllGather(&in0, out0, {8, 8}, ControlTag(1), a.Callback());
  ASSERT_TRUE(a.Get().ok());
  EXPECT_EQ(out0[0], 1u);
  EXPECT_EQ(out0[1], 2u);
  EXPECT_TRUE(b.Get().ok());
}

// Node 1 (played here) says a valid hello and goes before reading the answer, as after a reset
// on the way back: node 0 must not count that connection, and must take node 1's next one.
TEST_F(SocketMeshTest, ADiallerWhoseAnswerWasLostDialsAgainAndIsTaken) {
  std::shared_ptr<MemoryStore> store = store_;
  auto first = std::async(std::launch::async, [&] {
    return ConnectSocketMesh("g", "127.0.0.1", store, 0, 2, milliseconds(10000));
  });
  const std::vector<std::string> record = PublishedRecord(*store, 0);
  ASSERT_EQ(record.size(), 3u);
  const std::string my_secret(32, 'a');
  ASSERT_TRUE(store->Set("control/1", "127.0.0.1 1 " + my_secret).ok());
  char hello[44] = "CDCTLv3";
  hello[8] = 1;  // node 1 (little-endian uint32), with node 0's secret
  std::memcpy(hello + 12, record[2].data(), 32);
  // Says hello and reads node 0's answer, which must carry node 1's secret.
  auto greet = [&](int fd) {
    ASSERT_EQ(send(fd, hello, sizeof(hello), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(hello)));
    char answer[44];
    ASSERT_EQ(recv(fd, answer, sizeof(answer), MSG_WAITALL), static_cast<ssize_t>(sizeof(answer)));
    EXPECT_EQ(std::string(answer + 12, 32), my_secret);
  };

  const int lost = DialControlPort(record[1]);
  ASSERT_GE(lost, 0);
  greet(lost);
  close(lost);  // never confirms
  EXPECT_EQ(first.wait_for(milliseconds(300)), std::future_status::timeout)
      << "node 0 counted a connection its dialler never confirmed";

  const int taken = DialControlPort(record[1]);
  ASSERT_GE(taken, 0);
  greet(taken);
  const char confirm = 'C';
  ASSERT_EQ(send(taken, &confirm, 1, MSG_NOSIGNAL), 1);
  auto fds = first.get();
  ASSERT_TRUE(fds.ok()) << fds.status().message();
  auto mesh = SocketMesh::Start("g", 0, std::move(*fds), *runtime_);
  ASSERT_TRUE(mesh.ok());
  meshes_ = {*mesh};
  // Node 0 talks to node 1 on the confirmed connection: its first message arrives there.
  uint64_t in = 1, out[2];
  Outcome exchange;
  (*mesh)->StartAllGather(&in, out, {8, 8}, ControlTag(1), exchange.Callback());
  pollfd readable{taken, POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, 5000), 1);
  char frame[64];
  EXPECT_GT(recv(taken, frame, sizeof(frame), 0), 0);
  close(taken);
  EXPECT_EQ(exchange.Get().kind(), ErrorKind::kPeerLost);  // node 1 went: not a hang
}

// The handshake's deadlines read the clock it is given: on a manual clock, each timeout below
// passes when the test moves time, in microseconds of real time.
TEST_F(SocketMeshTest, ConnectTimesOutWhenAPeerNeverPublishesItsAddress) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  auto connecting = std::async(std::launch::async, [&] {
    return ConnectSocketMesh("g", "127.0.0.1", store, 0, 2, milliseconds(30000), clock);
  });
  clock.AwaitWaiters(1);  // the store's wait for node 1's address
  clock.Advance(std::chrono::seconds(31));
  StatusOr<MeshConnections> fds = connecting.get();
  ASSERT_FALSE(fds.ok());
  EXPECT_EQ(fds.status().kind(), ErrorKind::kUnavailable) << fds.status().message();
  EXPECT_NE(fds.status().message().find("group 'g'"), std::string::npos) << fds.status().message();
}

TEST_F(SocketMeshTest, ConnectTimesOutWhenAPublishedPeerNeverDials) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  ASSERT_TRUE(store->Set("control/1", "127.0.0.1 9 " + std::string(32, 'a')).ok());
  auto connecting = std::async(std::launch::async, [&] {
    return ConnectSocketMesh("g", "127.0.0.1", store, 0, 2, milliseconds(30000), clock);
  });
  clock.AwaitPolls(1);  // node 0 polls its listener for node 1's call
  clock.Advance(std::chrono::seconds(31));
  StatusOr<MeshConnections> fds = connecting.get();
  ASSERT_FALSE(fds.ok());
  EXPECT_EQ(fds.status().kind(), ErrorKind::kUnavailable) << fds.status().message();
  EXPECT_NE(fds.status().message().find("timed out waiting for sidecar nodes 1"), std::string::npos)
      << fds.status().message();
}

// Node 1 dials a published address where nothing listens: refused, it backs off and dials again
// (on the clock) until the deadline.
TEST_F(SocketMeshTest, ADialToAListenerThatIsGoneBacksOffUntilTheDeadline) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  // A port that was just listened on and closed: nothing accepts there.
  const int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(probe, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(probe);
  ASSERT_TRUE(store
                  ->Set("control/0", "127.0.0.1 " + std::to_string(ntohs(address.sin_port)) + " " +
                                         std::string(32, 'a'))
                  .ok());
  auto connecting = std::async(std::launch::async, [&] {
    return ConnectSocketMesh("g", "127.0.0.1", store, 1, 2, milliseconds(30000), clock);
  });
  clock.AwaitWaiters(1);  // refused once: the back-off's wait
  clock.Advance(std::chrono::seconds(31));
  StatusOr<MeshConnections> fds = connecting.get();
  ASSERT_FALSE(fds.ok());
  EXPECT_EQ(fds.status().kind(), ErrorKind::kUnavailable) << fds.status().message();
  EXPECT_NE(fds.status().message().find("sidecar node 0"), std::string::npos)
      << fds.status().message();
}

}  // namespace
}  // namespace collectived
