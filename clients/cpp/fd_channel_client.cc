#include "clients/cpp/fd_channel_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rpc/address.h"

namespace collectived {
FdChannelClient::FdChannelClient(std::string address, std::chrono::milliseconds request_timeout)
    : address_(std::move(address)), request_timeout_(request_timeout) {}

FdChannelClient::~FdChannelClient() {
  Close();
}

void FdChannelClient::SetSession(std::string token, std::string label) {
  std::lock_guard<std::mutex> lock(mutex_);
  token_ = std::move(token);
  session_label_ = std::move(label);
}

bool FdChannelClient::has_token() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !token_.empty();
}

Status FdChannelClient::ConnectLocked() {
  StatusOr<std::string> target_name = ToGrpcTarget(address_);
  if (!target_name.ok() || target_name->rfind("unix:", 0) != 0 || token_.empty()) {
    return Status::PermissionDenied(
        "session " + session_label_ + " to " + address_ +
        " cannot register memory: only a client on the sidecar's Unix socket hands memory over "
        "(as a file descriptor); over TCP send tensors inline");
  }
  const std::string path = FdChannelPath(target_name->substr(std::string("unix:").size()));
  sockaddr_un target{};
  target.sun_family = AF_UNIX;
  if (path.size() >= sizeof(target.sun_path)) {
    return Status::InvalidArgument("fd-channel path " + path + " is too long");
  }
  std::memcpy(target.sun_path, path.c_str(), path.size() + 1);
  const int socket_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (socket_fd < 0) {
    return Status::Unavailable(std::string("cannot create a socket: ") + std::strerror(errno));
  }
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(request_timeout_);
  const timeval limit{static_cast<time_t>(seconds.count()),
                      static_cast<suseconds_t>((request_timeout_ - seconds).count() * 1000)};
  setsockopt(socket_fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(socket_fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  if (connect(socket_fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) {
    const int error = errno;
    close(socket_fd);
    return Status::Unavailable("cannot connect to the sidecar's fd channel " + path + ": " +
                               std::strerror(error));
  }
  FdChannelMessage bind;
  bind.kind = FdChannelKind::kBind;
  bind.request_id = next_request_++;
  bind.payload = token_;
  token_.clear();  // one-time, whatever the answer
  Status bound = SendFdChannelMessage(socket_fd, bind);
  if (bound.ok()) {
    StatusOr<FdChannelMessage> answer = ReceiveFdChannelMessage(socket_fd, nullptr);
    if (!answer.ok()) {
      bound = answer.status();
    } else if (answer->error_kind != 0) {
      bound = Status(static_cast<ErrorKind>(answer->error_kind), answer->payload);
    }
  }
  if (!bound.ok()) {
    close(socket_fd);
    return bound.WithContext("binding the fd channel " + path);
  }
  socket_ = socket_fd;
  return Status::Ok();
}

Status FdChannelClient::Exchange(FdChannelKind kind, int fd, uint64_t value, uint64_t* answer_value,
                                 int* received, uint64_t value1) {
  if (socket_ < 0) COLLECTIVED_RETURN_IF_ERROR(ConnectLocked());
  FdChannelMessage request;
  request.kind = kind;
  request.request_id = next_request_++;
  request.value0 = value;
  request.value1 = value1;
  Status sent = SendFdChannelMessage(socket_, request, fd);
  StatusOr<FdChannelMessage> answer =
      sent.ok() ? ReceiveFdChannelMessage(socket_, received) : StatusOr<FdChannelMessage>(sent);
  Status broken = !answer.ok() ? answer.status()
                  : answer->request_id != request.request_id
                      ? Status::Internal("the fd channel answered request " +
                                         std::to_string(answer->request_id) + " instead of " +
                                         std::to_string(request.request_id))
                      : Status::Ok();
  if (!broken.ok()) {
    // The sidecar went away, or answered out of order: the channel is dropped.
    close(socket_);
    socket_ = -1;
    return broken;
  }
  if (answer->error_kind != 0) {
    return Status(static_cast<ErrorKind>(answer->error_kind), answer->payload);
  }
  if (answer_value != nullptr) *answer_value = answer->value0;
  return Status::Ok();
}

StatusOr<uint64_t> FdChannelClient::Register(int fd, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t id = 0;
  COLLECTIVED_RETURN_IF_ERROR(Exchange(FdChannelKind::kRegister, fd, bytes, &id, nullptr));
  return id;
}

StatusOr<uint64_t> FdChannelClient::RegisterCudaVmm(int fd, uint64_t bytes, int device) {
  if (device < 0) {
    return Status::InvalidArgument("CUDA VMM allocation on negative device " +
                                   std::to_string(device));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t id = 0;
  COLLECTIVED_RETURN_IF_ERROR(Exchange(FdChannelKind::kRegisterCudaVmm, fd, bytes, &id, nullptr,
                                       static_cast<uint64_t>(device)));
  return id;
}

Status FdChannelClient::UnregisterCudaVmm(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  return Exchange(FdChannelKind::kUnregisterCudaVmm, -1, id, nullptr, nullptr);
}

StatusOr<int> FdChannelClient::OpenRing() {
  std::lock_guard<std::mutex> lock(mutex_);
  int ring_fd = -1;
  COLLECTIVED_RETURN_IF_ERROR(Exchange(FdChannelKind::kOpenRing, -1, 0, nullptr, &ring_fd));
  if (ring_fd < 0) return Status::Internal("the sidecar opened a ring but sent no descriptor");
  return ring_fd;
}

bool FdChannelClient::Gone() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (socket_ < 0) return true;
  pollfd watched{socket_, POLLRDHUP, 0};
  return poll(&watched, 1, 0) != 0;
}

void FdChannelClient::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (socket_ >= 0) close(socket_);
  socket_ = -1;
}

}  // namespace collectived
