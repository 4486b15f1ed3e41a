// SocketMesh over real loopback TCP, point to point, beyond MessageTransport's contract (which
// message_transport_contract_test.cc checks here and on the fabric): a non-peer connects on
// first use, and a closed mesh refuses transfers to nodes it never connected.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/group/transport/socket/socket_mesh.h"
#include "tests/engine/group/socket_mesh_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

using namespace socket_mesh_testing;  // NOLINT: the helpers of these tests

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

// The contract's cases (transfers meet by key in order whichever side comes first, keys that
// differ in any field are separate streams, a broken connection fails the pending transfers of
// both sides) run on this mesh and on the in-process fabric in
// message_transport_contract_test.cc.

}  // namespace
}  // namespace collectived
