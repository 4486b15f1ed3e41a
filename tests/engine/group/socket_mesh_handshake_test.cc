// SocketMesh's connections formed (ConnectSocketMesh): a stray connection is refused, a dialler
// whose answer was lost dials again, and the deadlines and back-off read the clock given.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/group/transport/socket/socket_handshake.h"
#include "engine/group/transport/socket/socket_mesh.h"
#include "engine/store/memory_store.h"
#include "tests/engine/group/socket_mesh_test_helpers.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

using namespace socket_mesh_testing;  // NOLINT: the helpers of these tests

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

// Publishes as node 0's address a port that was just bound and closed: nothing accepts there.
void PublishAGoneListenerAsNode0(Store& store) {
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
                  .Set("control/0", "127.0.0.1 " + std::to_string(ntohs(address.sin_port)) + " " +
                                        std::string(32, 'a'))
                  .ok());
}

// Node 1 dials a published address where nothing listens: refused, it backs off and dials again
// (on the clock) until the deadline.
TEST_F(SocketMeshTest, ADialToAListenerThatIsGoneBacksOffUntilTheDeadline) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  PublishAGoneListenerAsNode0(*store);
  ASSERT_FALSE(HasFatalFailure());
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

// A sidecar that stops cancels the connects of the groups it was forming (ConnectRequest.cancel):
// each wait of the connect ends with the cancel's reason, long before its deadline. Time stands
// still on a manual clock: only the cancel can end these connects.
Status CancelledConnect(
    const std::function<StatusOr<MeshConnections>()>& connect,
    const std::function<void()>& once_waiting, CancelToken& cancel,
    const std::function<void()>& after_cancel = [] {}) {
  auto connecting = std::async(std::launch::async, connect);
  once_waiting();
  cancel.Cancel(Status::Aborted("the sidecar is stopping"));
  after_cancel();
  if (connecting.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    return Status::Internal("the connect did not end at the cancel");
  }
  StatusOr<MeshConnections> fds = connecting.get();
  return fds.ok() ? Status::Ok() : fds.status();
}

TEST_F(SocketMeshTest, ACancelEndsAConnectWaitingForAPeersAddress) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  auto cancel = std::make_shared<CancelToken>();
  const Status status = CancelledConnect(
      [&] {
        return ConnectSocketMesh("g", "127.0.0.1", store, 0, 2, milliseconds(30000), clock, cancel);
      },
      [] { std::this_thread::sleep_for(milliseconds(50)); }, *cancel);
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_NE(status.message().find("stopping"), std::string::npos) << status.ToString();
}

TEST_F(SocketMeshTest, ACancelEndsAConnectWaitingForAPeersCall) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  ASSERT_TRUE(store->Set("control/1", "127.0.0.1 9 " + std::string(32, 'a')).ok());
  auto cancel = std::make_shared<CancelToken>();
  const Status status = CancelledConnect(
      [&] {
        return ConnectSocketMesh("g", "127.0.0.1", store, 0, 2, milliseconds(30000), clock, cancel);
      },
      [&] { clock.AwaitPolls(1); },  // node 0 polls its listener for node 1's call
      *cancel);
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
}

TEST_F(SocketMeshTest, ACancelEndsTheRedialsToAListenerThatIsGone) {
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::kDefaultCapacityBytes, clock);
  PublishAGoneListenerAsNode0(*store);
  ASSERT_FALSE(HasFatalFailure());
  auto cancel = std::make_shared<CancelToken>();
  const Status status = CancelledConnect(
      [&] {
        return ConnectSocketMesh("g", "127.0.0.1", store, 1, 2, milliseconds(30000), clock, cancel);
      },
      [&] { clock.AwaitWaiters(1); },  // refused once: the back-off's wait
      *cancel,
      // The back-off in progress passes (one second of the thirty): the cancel ends the redials.
      [&] { clock.Advance(std::chrono::seconds(1)); });
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
}

}  // namespace
}  // namespace collectived
