// A connection reset before Gloo reads its peer's address must not throw on Gloo's event-loop
// thread (that terminates the sidecar): gloo_peer_name_guard answers Gloo's getpeername() on such
// a socket with an unspecified address, and only Gloo's.
#include "engine/group/transport/gloo/gloo_peer_name_guard.h"

#include <gloo/transport/tcp/address.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace collectived {
namespace {

class UnconnectedSocket : public ::testing::Test {
 protected:
  void SetUp() override {
    LinkGlooPeerNameGuard();
    fd_ = socket(AF_INET, SOCK_STREAM, 0);  // getpeername on it fails with ENOTCONN
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { close(fd_); }
  int fd_ = -1;
};

TEST_F(UnconnectedSocket, GlooReadsAnUnspecifiedPeerInsteadOfThrowing) {
  gloo::transport::tcp::Address peer;
  EXPECT_NO_THROW(peer = gloo::transport::tcp::Address::fromPeerName(fd_));
  sockaddr_storage storage = peer.getSockaddr();
  EXPECT_EQ(storage.ss_family, AF_INET);
  EXPECT_EQ(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port, 0);
}

TEST_F(UnconnectedSocket, OtherCallersStillSeeTheError) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  errno = 0;
  EXPECT_EQ(getpeername(fd_, reinterpret_cast<sockaddr*>(&storage), &length), -1);
  EXPECT_EQ(errno, ENOTCONN);
}

TEST(GlooPeerNameGuard, AConnectedSocketIsAnsweredAsUsual) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  sockaddr_storage peer = gloo::transport::tcp::Address::fromPeerName(client).getSockaddr();
  EXPECT_EQ(reinterpret_cast<const sockaddr_in*>(&peer)->sin_port, address.sin_port);
  close(client);
  close(listener);
}

}  // namespace
}  // namespace collectived
