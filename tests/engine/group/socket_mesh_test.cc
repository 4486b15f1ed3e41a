// SocketMesh over real loopback TCP, the control exchange: allgathers of any sizes in node order
// and summaries reduced up and down the tree, over the dissemination peers; an exchange waits
// for its peer as state; closes, vanished peers and mismatched messages each give their error.
#include "engine/group/transport/socket/socket_mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/store/memory_store.h"
#include "tests/engine/group/socket_mesh_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

using namespace socket_mesh_testing;  // NOLINT: the helpers of these tests

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

}  // namespace
}  // namespace collectived
