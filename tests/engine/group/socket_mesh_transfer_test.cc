// SocketMesh over real loopback TCP, point to point: transfers meet by their whole key, in order,
// whichever side comes first; a non-peer connects on first use; broken or closed meshes fail them.
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

}  // namespace
}  // namespace collectived
