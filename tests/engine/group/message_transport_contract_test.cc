// MessageTransport's contract (message_transport.h), checked on both of its carriers: the socket
// mesh over loopback TCP (what ships) and the in-process fabric (what the group tests run on).
// Transfers of one key meet in start order whichever side comes first, move only into a posted
// receive's buffer, keys that differ in any field are separate streams, and a closed end fails
// what waits on it at both ends, and everything later.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/runtime.h"
#include "engine/group/core/topology.h"
#include "engine/group/transport/in_process/in_process_fabric.h"
#include "engine/group/transport/message_transport.h"
#include "engine/group/transport/socket/socket_handshake.h"
#include "engine/group/transport/socket/socket_mesh.h"
#include "engine/store/memory_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

enum class Carrier { kSockets, kInProcess };

std::string CarrierName(const ::testing::TestParamInfo<Carrier>& info) {
  return info.param == Carrier::kSockets ? "SocketMesh" : "InProcessFabric";
}

// A callback's outcome, waited for with a bound (a hang fails the test instead of blocking it).
class Outcome {
 public:
  MessageTransport::Done Callback() {
    return [this](const Status& status) { promise_.set_value(status); };
  }
  bool Arrives(milliseconds within = milliseconds(20000)) {
    return future_.wait_for(within) == std::future_status::ready;
  }
  Status Get() {
    EXPECT_TRUE(Arrives()) << "no completion";
    return Arrives(milliseconds(0)) ? future_.get() : Status::Internal("no completion");
  }

 private:
  std::promise<Status> promise_;
  std::shared_future<Status> future_ = promise_.get_future().share();
};

bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

std::vector<std::byte> Block(int seed, size_t bytes) {
  std::vector<std::byte> block(bytes);
  for (size_t i = 0; i < bytes; ++i) block[i] = std::byte((seed * 31 + i) % 251);
  return block;
}

// Two connected nodes of one group on the carrier under test: each node's transport and the
// control channel whose Close closes its connections.
class MessageTransportContract : public ::testing::TestWithParam<Carrier> {
 protected:
  void SetUp() override {
    if (GetParam() == Carrier::kSockets) {
      StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create();
      ASSERT_TRUE(runtime.ok());
      runtime_ = *runtime;
      auto store = std::make_shared<MemoryStore>();
      std::vector<std::future<StatusOr<MeshConnections>>> pending;
      for (int node = 0; node < 2; ++node) {
        pending.push_back(std::async(std::launch::async, [store, node] {
          return ConnectSocketMesh("g", "127.0.0.1", store, node, 2, milliseconds(10000));
        }));
      }
      for (int node = 0; node < 2; ++node) {
        StatusOr<MeshConnections> connections = pending[node].get();
        ASSERT_TRUE(connections.ok()) << connections.status().message();
        StatusOr<std::shared_ptr<SocketMesh>> mesh =
            SocketMesh::Start("g", node, std::move(*connections), *runtime_);
        ASSERT_TRUE(mesh.ok()) << mesh.status().message();
        transports_.push_back(*mesh);
        channels_.push_back(*mesh);
      }
      return;
    }
    fabric_ = InProcessFabric::Create();
    std::vector<std::optional<StatusOr<GroupTransport>>> connected(2);
    std::vector<std::thread> threads;
    for (int node = 0; node < 2; ++node) {
      threads.emplace_back([&, node] {
        StatusOr<GroupTopology> topology =
            GroupTopology::FromSidecarIds({"a", "b"}, node == 0 ? "a" : "b");
        if (!topology.ok()) {
          connected[node].emplace(topology.status());
          return;
        }
        connected[node].emplace(fabric_->Connect(
            ConnectRequest{"g", DeviceKind::kCpu, *topology, nullptr, milliseconds(5000)}));
      });
    }
    for (auto& thread : threads) thread.join();
    for (int node = 0; node < 2; ++node) {
      ASSERT_TRUE(connected[node]->ok()) << connected[node]->status().ToString();
      GroupTransport transport = std::move(**connected[node]);
      transports_.push_back(transport.transfers);
      channels_.push_back(transport.control);
      data_.push_back(std::move(transport.data));
    }
  }

  void TearDown() override {
    for (auto& channel : channels_) channel->Close();
    data_.clear();
    transports_.clear();
    channels_.clear();
  }

  MessageTransport& node(int n) { return *transports_[n]; }
  ControlChannel& channel(int n) { return *channels_[n]; }

 private:
  std::shared_ptr<Runtime> runtime_;
  std::shared_ptr<InProcessFabric> fabric_;
  std::vector<std::shared_ptr<MessageTransport>> transports_;
  std::vector<std::shared_ptr<ControlChannel>> channels_;
  std::vector<std::unique_ptr<DataBackend>> data_;
};

TEST_P(MessageTransportContract, TransfersMeetByKeyInOrderWhicheverSideComesFirst) {
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
  node(1).StartRecv(other_received.data(), 64, 0, b, recvs[sizes.size()].Callback());
  node(1).StartRecv(received[0].data(), sizes[0], 0, a, recvs[0].Callback());
  for (size_t i = 0; i < sizes.size(); ++i) {
    node(0).StartSend(sent[i].data(), sizes[i], 1, a, sends[i].Callback());
  }
  node(0).StartSend(other.data(), 64, 1, b, sends[sizes.size()].Callback());
  EXPECT_TRUE(recvs[sizes.size()].Get().ok());
  EXPECT_TRUE(other_received == other);
  EXPECT_FALSE(sends[1].Arrives(milliseconds(50))) << "moved before its receive was posted";
  for (size_t i = 1; i < sizes.size(); ++i) {
    node(1).StartRecv(received[i].data(), sizes[i], 0, a, recvs[i].Callback());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(recvs[i].Get().ok()) << i;
    EXPECT_TRUE(sends[i].Get().ok()) << i;
    EXPECT_TRUE(received[i] == sent[i]) << i;
  }
  EXPECT_TRUE(sends[sizes.size()].Get().ok());
  EXPECT_TRUE(Eventually([&] { return node(0).Idle() && node(1).Idle(); }));
}

// Keys are compared whole: tags that differ only above bit 31 and equal tags of other rank pairs
// are separate streams, whichever order their sends and receives are posted in.
TEST_P(MessageTransportContract, KeysThatDifferInAnyFieldAreSeparateStreams) {
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
  for (size_t i = keys.size(); i-- > 0;) {
    if (i % 2 == 0) node(1).StartRecv(received[i].data(), 16, 0, keys[i], recvs[i].Callback());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    node(0).StartSend(sent[i].data(), 16, 1, keys[i], sends[i].Callback());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i % 2 == 1) node(1).StartRecv(received[i].data(), 16, 0, keys[i], recvs[i].Callback());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(recvs[i].Get().ok()) << i;
    EXPECT_TRUE(sends[i].Get().ok()) << i;
    EXPECT_TRUE(received[i] == sent[i]) << "key " << i;
  }
  EXPECT_TRUE(Eventually([&] { return node(0).Idle() && node(1).Idle(); }));
}

TEST_P(MessageTransportContract, AClosedEndFailsThePendingTransfersOfBothSidesAndLaterOnes) {
  std::vector<std::byte> buffer(16);
  Outcome send, recv;
  node(0).StartSend(buffer.data(), 16, 1, P2PKey{0, 1, 1}, send.Callback());  // never received
  node(0).StartRecv(buffer.data(), 16, 1, P2PKey{1, 0, 1}, recv.Callback());  // never sent
  EXPECT_FALSE(node(0).Idle());
  channel(1).Close();
  EXPECT_EQ(send.Get().kind(), ErrorKind::kPeerLost);
  Status status = recv.Get();
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.message();
  EXPECT_NE(status.message().find("sidecar node 1"), std::string::npos) << status.message();
  Outcome later;
  node(0).StartSend(buffer.data(), 16, 1, P2PKey{0, 1, 2}, later.Callback());
  // A socket refuses at once, on the calling thread; the fabric's answers come from its worker.
  if (GetParam() == Carrier::kSockets) {
    EXPECT_TRUE(later.Arrives(milliseconds(0))) << "a broken connection refuses at once";
  }
  EXPECT_EQ(later.Get().kind(), ErrorKind::kPeerLost);
  // The closed end refuses too.
  Outcome closed_end;
  node(1).StartRecv(buffer.data(), 16, 0, P2PKey{0, 1, 3}, closed_end.Callback());
  EXPECT_EQ(closed_end.Get().kind(), ErrorKind::kPeerLost);
  EXPECT_TRUE(Eventually([&] { return node(0).Idle(); }));
}

INSTANTIATE_TEST_SUITE_P(BothCarriers, MessageTransportContract,
                         ::testing::Values(Carrier::kSockets, Carrier::kInProcess), CarrierName);

}  // namespace
}  // namespace collectived
