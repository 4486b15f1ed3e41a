// SocketControlChannel over real loopback TCP, each node on its own thread, meeting through one
// MemoryStore: the mesh forms (and refuses a stray connection), allgathers of any sizes (large
// ones included, which need both directions to move at once) arrive intact in node order, and a
// missing peer, a closed channel, a vanished peer and a mismatched message each give their error.
#include "engine/group/socket_control_channel.h"

#include <gtest/gtest.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/op_tags.h"
#include "engine/store/memory_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using Channels = std::vector<std::unique_ptr<SocketControlChannel>>;

uint32_t ControlTag(uint64_t sequence) {
  return OpTags(sequence).Control<OpTags::kSignatures>();
}

Channels ConnectAll(int nodes, Store& store) {
  std::vector<std::future<StatusOr<std::unique_ptr<SocketControlChannel>>>> pending;
  for (int node = 0; node < nodes; ++node) {
    pending.push_back(std::async(std::launch::async, [&store, node, nodes] {
      return SocketControlChannel::Connect("g", "127.0.0.1", store, node, nodes,
                                           milliseconds(10000));
    }));
  }
  Channels channels;
  for (auto& future : pending) {
    auto channel = future.get();
    EXPECT_TRUE(channel.ok()) << channel.status().message();
    if (!channel.ok()) return {};
    channels.push_back(std::move(*channel));
  }
  return channels;
}

// An allgather of 8 zero bytes per node among two nodes, as control step `sequence`.
Status TwoNodeExchange(SocketControlChannel& channel, uint64_t sequence, milliseconds timeout) {
  char in[8] = {}, out[16];
  return channel.AllGather(in, out, {8, 8}, ControlTag(sequence), timeout);
}

// Node n contributes sizes[n] bytes, byte i of which is (n * 31 + i) % 251.
std::vector<std::byte> Block(int node, size_t bytes) {
  std::vector<std::byte> block(bytes);
  for (size_t i = 0; i < bytes; ++i) block[i] = std::byte((node * 31 + i) % 251);
  return block;
}

TEST(SocketControlChannelTest, AllGathersEverySizeInNodeOrder) {
  MemoryStore store;
  Channels channels = ConnectAll(3, store);
  ASSERT_EQ(channels.size(), 3u);
  const std::vector<std::vector<size_t>> rounds = {
      {40, 40, 40}, {0, 16, 0}, {8 << 20, 3 << 20, 1}, {1, 2, 3}};
  for (size_t round = 0; round < rounds.size(); ++round) {
    const std::vector<size_t>& sizes = rounds[round];
    size_t total = 0;
    for (size_t bytes : sizes) total += bytes;
    std::vector<std::future<std::pair<Status, std::vector<std::byte>>>> results;
    for (int node = 0; node < 3; ++node) {
      results.push_back(std::async(std::launch::async, [&, node] {
        std::vector<std::byte> mine = Block(node, sizes[node]);
        std::vector<std::byte> all(total);
        Status status = channels[node]->AllGather(mine.data(), all.data(), sizes,
                                                  ControlTag(round + 1), milliseconds(20000));
        return std::make_pair(status, all);
      }));
    }
    std::vector<std::byte> expected;
    for (int node = 0; node < 3; ++node) {
      std::vector<std::byte> block = Block(node, sizes[node]);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    for (int node = 0; node < 3; ++node) {
      auto [status, all] = results[node].get();
      ASSERT_TRUE(status.ok()) << "round " << round << " node " << node << ": " << status.message();
      EXPECT_TRUE(all == expected) << "round " << round << " node " << node;
    }
  }
}

TEST(SocketControlChannelTest, OneNodeCopiesItsOwnBlock) {
  MemoryStore store;
  auto channel = SocketControlChannel::Connect("g", "127.0.0.1", store, 0, 1, milliseconds(1000));
  ASSERT_TRUE(channel.ok()) << channel.status().message();
  const char in[] = "signature";
  char out[sizeof(in)] = {};
  ASSERT_TRUE((*channel)->AllGather(in, out, {sizeof(in)}, ControlTag(1), milliseconds(100)).ok());
  EXPECT_STREQ(out, in);
}

TEST(SocketControlChannelTest, APeerThatNeverSendsTimesOutNamingIt) {
  MemoryStore store;
  Channels channels = ConnectAll(2, store);
  ASSERT_EQ(channels.size(), 2u);
  const auto start = std::chrono::steady_clock::now();
  Status status = TwoNodeExchange(*channels[0], 1, milliseconds(300));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(status.IsTimeout()) << status.message();
  EXPECT_NE(status.message().find("timed out after 300 ms"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("Timeout exchanging control messages with sidecar nodes [1] of "
                                  "group 'g'"),
            std::string::npos)
      << status.message();
  EXPECT_GE(waited, milliseconds(290));
  EXPECT_LT(waited, milliseconds(3000));
}

TEST(SocketControlChannelTest, CloseWakesABlockedCallAndThePeerSeesTheConnectionGo) {
  MemoryStore store;
  Channels channels = ConnectAll(2, store);
  ASSERT_EQ(channels.size(), 2u);
  auto blocked = std::async(std::launch::async,
                            [&] { return TwoNodeExchange(*channels[0], 1, milliseconds(30000)); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  channels[0]->Close();
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status status = blocked.get();
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.message();
  EXPECT_NE(status.message().find("closed"), std::string::npos) << status.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));

  Status peer = TwoNodeExchange(*channels[1], 1, milliseconds(30000));
  EXPECT_EQ(peer.kind(), ErrorKind::kPeerLost) << peer.message();
  EXPECT_NE(peer.message().find("sidecar node 0 of group 'g' broke"), std::string::npos)
      << peer.message();
}

TEST(SocketControlChannelTest, AVanishedPeerIsPeerLostNamingIt) {
  MemoryStore store;
  Channels channels = ConnectAll(3, store);
  ASSERT_EQ(channels.size(), 3u);
  channels[2].reset();  // its sockets close
  char in[8] = {}, out[24];
  Status status = channels[0]->AllGather(in, out, {8, 8, 8}, ControlTag(1), milliseconds(30000));
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.message();
  EXPECT_NE(status.message().find("sidecar node 2"), std::string::npos) << status.message();
}

TEST(SocketControlChannelTest, AMismatchedMessageFailsInsteadOfBeingReadAsData) {
  MemoryStore store;
  Channels channels = ConnectAll(2, store);
  ASSERT_EQ(channels.size(), 2u);
  auto other = std::async(std::launch::async,
                          [&] { return TwoNodeExchange(*channels[1], 2, milliseconds(2000)); });
  Status status = TwoNodeExchange(*channels[0], 1, milliseconds(2000));
  EXPECT_EQ(status.kind(), ErrorKind::kInternal) << status.message();
  EXPECT_NE(status.message().find("control message mismatch"), std::string::npos)
      << status.message();
  EXPECT_FALSE(other.get().ok());
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

TEST(SocketControlChannelTest, AStrayConnectionIsRefusedAndTheMeshStillForms) {
  MemoryStore store;
  auto first = std::async(std::launch::async, [&] {
    return SocketControlChannel::Connect("g", "127.0.0.1", store, 0, 2, milliseconds(10000));
  });
  // Someone who can reach the port but did not read node 0's secret from the store.
  const std::vector<std::string> record = PublishedRecord(store, 0);
  ASSERT_EQ(record.size(), 3u);
  const int stray = DialControlPort(record[1]);
  ASSERT_GE(stray, 0);
  char forged[44] = "CDCTLv2";
  forged[8] = 1;  // claims node 1, with a wrong secret
  ASSERT_EQ(send(stray, forged, sizeof(forged), MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(forged)));

  // The real node 1 comes after the stray (node 0 accepts once it has read every address).
  auto second = SocketControlChannel::Connect("g", "127.0.0.1", store, 1, 2, milliseconds(10000));
  ASSERT_TRUE(second.ok()) << second.status().message();
  char answer[44];
  EXPECT_EQ(recv(stray, answer, sizeof(answer), 0), 0);  // closed without an answer
  close(stray);
  auto channel = first.get();
  ASSERT_TRUE(channel.ok()) << channel.status().message();
  auto other = std::async(std::launch::async, [&] {
    uint64_t in = 2, out[2];
    return (*second)->AllGather(&in, out, {8, 8}, ControlTag(1), milliseconds(5000));
  });
  uint64_t in = 1, out[2] = {};
  ASSERT_TRUE((*channel)->AllGather(&in, out, {8, 8}, ControlTag(1), milliseconds(5000)).ok());
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 2u);
  EXPECT_TRUE(other.get().ok());
}

// Node 1 (played here) says a valid hello and goes before reading the answer, as after a reset
// on the way back: node 0 must not count that connection, and must take node 1's next one.
TEST(SocketControlChannelTest, ADiallerWhoseAnswerWasLostDialsAgainAndIsTaken) {
  MemoryStore store;
  auto first = std::async(std::launch::async, [&] {
    return SocketControlChannel::Connect("g", "127.0.0.1", store, 0, 2, milliseconds(10000));
  });
  const std::vector<std::string> record = PublishedRecord(store, 0);
  ASSERT_EQ(record.size(), 3u);
  const std::string my_secret(32, 'a');
  ASSERT_TRUE(store.Set("control/1", "127.0.0.1 1 " + my_secret).ok());
  char hello[44] = "CDCTLv2";
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
  auto channel = first.get();
  ASSERT_TRUE(channel.ok()) << channel.status().message();
  // Node 0 talks to node 1 on the confirmed connection: its first message arrives there.
  auto exchange = std::async(std::launch::async, [&] {
    uint64_t in = 1, out[2];
    return (*channel)->AllGather(&in, out, {8, 8}, ControlTag(1), milliseconds(2000));
  });
  pollfd readable{taken, POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, 5000), 1);
  char frame[64];
  EXPECT_GT(recv(taken, frame, sizeof(frame), 0), 0);
  close(taken);
  EXPECT_FALSE(exchange.get().ok());  // node 1 never answers: PeerLost or Timeout, not a hang
}

TEST(SocketControlChannelTest, ConnectTimesOutWhenAPeerNeverComes) {
  MemoryStore store;
  auto channel = SocketControlChannel::Connect("g", "127.0.0.1", store, 0, 2, milliseconds(300));
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().kind(), ErrorKind::kUnavailable) << channel.status().message();
  EXPECT_NE(channel.status().message().find("group 'g'"), std::string::npos)
      << channel.status().message();
}

}  // namespace
}  // namespace collectived
