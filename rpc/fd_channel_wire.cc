#include "rpc/fd_channel_wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace collectived {
namespace {

void Put16(std::byte* at, uint16_t v) {
  for (int i = 0; i < 2; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put32(std::byte* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
void Put64(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t Get(const std::byte* at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(at[i]) << (8 * i);
  return v;
}

// Header layout: magic u32, version u16, kind u16, request_id u64, value0 u64, value1 u64,
// error_kind i32, flags u32, reserved u64.
constexpr size_t kMagicAt = 0, kVersionAt = 4, kKindAt = 6, kRequestAt = 8, kValue0At = 16,
                 kValue1At = 24, kErrorAt = 32, kFlagsAt = 36;

bool KnownKind(uint16_t kind) {
  switch (static_cast<FdChannelKind>(kind)) {
    case FdChannelKind::kBind:
    case FdChannelKind::kRegister:
    case FdChannelKind::kOpenRing:
    case FdChannelKind::kRegisterCudaVmm:
    case FdChannelKind::kUnregisterCudaVmm:
    case FdChannelKind::kBound:
    case FdChannelKind::kRegistered:
    case FdChannelKind::kRingOpened:
    case FdChannelKind::kCudaVmmRegistered:
    case FdChannelKind::kCudaVmmUnregistered:
      return true;
  }
  return false;
}

}  // namespace

std::string FdChannelPath(const std::string& socket_path) {
  return socket_path + ".fd";
}

Status SendFdChannelMessage(int socket, const FdChannelMessage& message, int fd) {
  if (message.payload.size() > FdChannelMessage::kMaxPayload) {
    return Status::InvalidArgument("fd-channel payload of " +
                                   std::to_string(message.payload.size()) + " bytes is over " +
                                   std::to_string(FdChannelMessage::kMaxPayload));
  }
  std::vector<std::byte> bytes(FdChannelMessage::kHeaderBytes + message.payload.size());
  Put32(&bytes[kMagicAt], FdChannelMessage::kMagic);
  Put16(&bytes[kVersionAt], FdChannelMessage::kVersion);
  Put16(&bytes[kKindAt], static_cast<uint16_t>(message.kind));
  Put64(&bytes[kRequestAt], message.request_id);
  Put64(&bytes[kValue0At], message.value0);
  Put64(&bytes[kValue1At], message.value1);
  Put32(&bytes[kErrorAt], static_cast<uint32_t>(message.error_kind));
  Put32(&bytes[kFlagsAt], message.flags);
  std::memcpy(bytes.data() + FdChannelMessage::kHeaderBytes, message.payload.data(),
              message.payload.size());

  iovec io{bytes.data(), bytes.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
    cmsghdr* attached = CMSG_FIRSTHDR(&header);
    attached->cmsg_level = SOL_SOCKET;
    attached->cmsg_type = SCM_RIGHTS;
    attached->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(attached), &fd, sizeof(int));
  }
  ssize_t sent;
  do {
    sent = sendmsg(socket, &header, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    return Status::Unavailable(std::string("cannot send on the fd channel: ") +
                               std::strerror(errno));
  }
  return Status::Ok();
}

StatusOr<FdChannelMessage> ReceiveFdChannelMessage(int socket, int* fd) {
  if (fd != nullptr) *fd = -1;
  std::vector<std::byte> bytes(FdChannelMessage::kHeaderBytes + FdChannelMessage::kMaxPayload);
  iovec io{bytes.data(), bytes.size()};
  msghdr header{};
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  // Room for a few descriptors, so that extra ones are received (and closed), not lost in
  // truncation with the message refused.
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
  header.msg_control = control;
  header.msg_controllen = sizeof(control);
  ssize_t received;
  do {
    received = recvmsg(socket, &header, MSG_CMSG_CLOEXEC);
  } while (received < 0 && errno == EINTR);
  if (received < 0) {
    return Status::Unavailable(std::string("cannot receive on the fd channel: ") +
                               std::strerror(errno));
  }
  std::vector<int> descriptors;
  for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      descriptors.push_back(passed);
    }
  }
  auto refuse = [&](Status status) {
    for (int d : descriptors) close(d);
    return status;
  };
  if (received == 0 && descriptors.empty()) return Status::Unavailable("closed");
  if (header.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    return refuse(Status::InvalidArgument(
        "fd-channel message too long, or too many file descriptors attached"));
  }
  if (static_cast<size_t>(received) < FdChannelMessage::kHeaderBytes ||
      Get(&bytes[kMagicAt], 4) != FdChannelMessage::kMagic) {
    return refuse(Status::InvalidArgument(
        "not an fd-channel message (expected the 48-byte header that starts with \"cdfd\")"));
  }
  if (Get(&bytes[kVersionAt], 2) != FdChannelMessage::kVersion) {
    return refuse(Status::InvalidArgument("fd-channel version " +
                                          std::to_string(Get(&bytes[kVersionAt], 2)) +
                                          " is not served (this sidecar speaks version 1)"));
  }
  const uint16_t kind = static_cast<uint16_t>(Get(&bytes[kKindAt], 2));
  if (!KnownKind(kind)) {
    return refuse(
        Status::InvalidArgument("unknown fd-channel message kind " + std::to_string(kind)));
  }
  if (descriptors.size() > 1) {
    return refuse(Status::InvalidArgument(std::to_string(descriptors.size()) +
                                          " file descriptors in one message (at most one)"));
  }
  FdChannelMessage message;
  message.kind = static_cast<FdChannelKind>(kind);
  message.request_id = Get(&bytes[kRequestAt], 8);
  message.value0 = Get(&bytes[kValue0At], 8);
  message.value1 = Get(&bytes[kValue1At], 8);
  message.error_kind = static_cast<int32_t>(Get(&bytes[kErrorAt], 4));
  message.flags = static_cast<uint32_t>(Get(&bytes[kFlagsAt], 4));
  message.payload.assign(
      reinterpret_cast<const char*>(bytes.data()) + FdChannelMessage::kHeaderBytes,
      static_cast<size_t>(received) - FdChannelMessage::kHeaderBytes);
  if (!descriptors.empty()) {
    if (fd != nullptr) {
      *fd = descriptors[0];
    } else {
      close(descriptors[0]);
    }
  }
  return message;
}

}  // namespace collectived
