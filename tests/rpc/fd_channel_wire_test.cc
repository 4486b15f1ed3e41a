// The fd channel's wire format over a real SOCK_SEQPACKET socket pair: round trips, descriptors
// passed and never leaked, and the malformed messages a hostile peer sends.
#include "rpc/fd_channel_wire.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace collectived {
namespace {

using ::testing::HasSubstr;

class FdChannelWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // the tests write to pipes whose readers were closed
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, ends_), 0);
  }
  void TearDown() override {
    close(ends_[0]);
    close(ends_[1]);
  }
  int ends_[2] = {-1, -1};
};

TEST_F(FdChannelWireTest, AMessageAndItsDescriptorRoundTrip) {
  const int memory = memfd_create("wire-test", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(memory, 123), 0);
  FdChannelMessage sent;
  sent.kind = FdChannelKind::kRegister;
  sent.request_id = 0x0102030405060708;
  sent.value0 = 123;
  sent.value1 = ~uint64_t{0};
  sent.error_kind = 9;
  sent.flags = FdChannelMessage::kFlagSealed;
  sent.payload = "payload";
  ASSERT_TRUE(SendFdChannelMessage(ends_[0], sent, memory).ok());
  int received_fd = -1;
  auto received = ReceiveFdChannelMessage(ends_[1], &received_fd);
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  EXPECT_EQ(received->kind, FdChannelKind::kRegister);
  EXPECT_EQ(received->request_id, sent.request_id);
  EXPECT_EQ(received->value0, 123u);
  EXPECT_EQ(received->value1, ~uint64_t{0});
  EXPECT_EQ(received->error_kind, 9);
  EXPECT_EQ(received->flags, FdChannelMessage::kFlagSealed);
  EXPECT_EQ(received->payload, "payload");
  ASSERT_GE(received_fd, 0);
  EXPECT_NE(received_fd, memory);
  EXPECT_EQ(lseek(received_fd, 0, SEEK_END), 123);  // the same file
  EXPECT_EQ(fcntl(received_fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  close(received_fd);
  close(memory);
}

TEST_F(FdChannelWireTest, TheCudaVmmRegistrationAndItsAnswerRoundTrip) {
  const int memory = memfd_create("vmm-wire-test", MFD_CLOEXEC);
  FdChannelMessage sent;
  sent.kind = FdChannelKind::kRegisterCudaVmm;
  sent.request_id = 5;
  sent.value0 = 20 << 20;  // the allocation's size
  sent.value1 = 3;         // its device
  ASSERT_TRUE(SendFdChannelMessage(ends_[0], sent, memory).ok());
  int received_fd = -1;
  auto received = ReceiveFdChannelMessage(ends_[1], &received_fd);
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  EXPECT_EQ(received->kind, FdChannelKind::kRegisterCudaVmm);
  EXPECT_EQ(received->value0, uint64_t{20} << 20);
  EXPECT_EQ(received->value1, 3u);
  EXPECT_GE(received_fd, 0);
  close(received_fd);
  close(memory);
  FdChannelMessage answer;
  answer.kind = FdChannelKind::kCudaVmmRegistered;
  answer.request_id = 5;
  answer.value0 = 42;
  ASSERT_TRUE(SendFdChannelMessage(ends_[1], answer).ok());
  auto answered = ReceiveFdChannelMessage(ends_[0], nullptr);
  ASSERT_TRUE(answered.ok()) << answered.status().ToString();
  EXPECT_EQ(answered->kind, FdChannelKind::kCudaVmmRegistered);
  EXPECT_EQ(answered->value0, 42u);
}

TEST_F(FdChannelWireTest, AReceiverThatWantsNoDescriptorClosesIt) {
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  ASSERT_TRUE(SendFdChannelMessage(ends_[0], FdChannelMessage{}, pipe_ends[0]).ok());
  close(pipe_ends[0]);
  ASSERT_TRUE(ReceiveFdChannelMessage(ends_[1], nullptr).ok());
  // The only reader was closed: writing to the pipe now fails.
  EXPECT_EQ(write(pipe_ends[1], "x", 1), -1);
  close(pipe_ends[1]);
}

TEST_F(FdChannelWireTest, SeveralDescriptorsInOneMessageAreRefusedAndClosed) {
  char header[FdChannelMessage::kHeaderBytes] = {};
  const uint32_t magic = FdChannelMessage::kMagic;
  std::memcpy(header, &magic, 4);
  header[4] = 1;  // version
  header[6] = 2;  // register
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  iovec io{header, sizeof(header)};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&message);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ASSERT_GT(sendmsg(ends_[0], &message, 0), 0);
  close(fds[0]);
  int received_fd = 42;
  auto received = ReceiveFdChannelMessage(ends_[1], &received_fd);
  EXPECT_TRUE(received.status().IsInvalidArgument());
  EXPECT_THAT(received.status().message(), HasSubstr("2 file descriptors in one message"));
  EXPECT_EQ(received_fd, -1);
  // Both received copies were closed: with fds[0] closed here too, the pipe has no reader.
  EXPECT_EQ(write(fds[1], "x", 1), -1);
  close(fds[1]);
}

TEST_F(FdChannelWireTest, ForeignShortAndUnknownMessagesAreRefused) {
  ASSERT_EQ(send(ends_[0], "GET / HTTP/1.1\r\n\r\n", 18, 0), 18);
  EXPECT_THAT(ReceiveFdChannelMessage(ends_[1], nullptr).status().message(),
              HasSubstr("not an fd-channel message"));

  char header[FdChannelMessage::kHeaderBytes] = {};
  const uint32_t magic = FdChannelMessage::kMagic;
  std::memcpy(header, &magic, 4);
  header[4] = 7;  // a version this sidecar does not speak
  ASSERT_GT(send(ends_[0], header, sizeof(header), 0), 0);
  EXPECT_THAT(ReceiveFdChannelMessage(ends_[1], nullptr).status().message(),
              HasSubstr("version 7 is not served"));

  header[4] = 1;
  header[6] = 0x55;  // no such kind
  ASSERT_GT(send(ends_[0], header, sizeof(header), 0), 0);
  EXPECT_THAT(ReceiveFdChannelMessage(ends_[1], nullptr).status().message(),
              HasSubstr("unknown fd-channel message kind 85"));

  std::string huge(FdChannelMessage::kHeaderBytes + FdChannelMessage::kMaxPayload + 10, 'x');
  std::memcpy(huge.data(), header, 4);
  ASSERT_GT(send(ends_[0], huge.data(), huge.size(), 0), 0);
  EXPECT_THAT(ReceiveFdChannelMessage(ends_[1], nullptr).status().message(), HasSubstr("too long"));

  FdChannelMessage too_big;
  too_big.payload.assign(FdChannelMessage::kMaxPayload + 1, 'x');
  EXPECT_TRUE(SendFdChannelMessage(ends_[0], too_big).IsInvalidArgument());

  close(ends_[0]);
  ends_[0] = socket(AF_UNIX, SOCK_SEQPACKET, 0);  // closed by TearDown
  auto closed = ReceiveFdChannelMessage(ends_[1], nullptr);
  EXPECT_EQ(closed.status().kind(), ErrorKind::kUnavailable);
  EXPECT_EQ(closed.status().message(), "closed");
}

TEST(FdChannelPathTest, SitsBesideTheGrpcSocket) {
  EXPECT_EQ(FdChannelPath("/run/collectived/collectived.sock"),
            "/run/collectived/collectived.sock.fd");
}

}  // namespace
}  // namespace collectived
