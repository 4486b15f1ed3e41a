#include "services/collectived/unix_connections.h"

#include <sys/socket.h>

#include <charconv>

namespace collectived {

PeerCredentials PeerCredentialsOf(int socket) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return {};
  return {credentials.pid, credentials.uid, credentials.gid};
}

std::string DescribePeerCredentials(const PeerCredentials& peer) {
  return "pid " + std::to_string(peer.pid) + " uid " + std::to_string(peer.uid) + " gid " +
         std::to_string(peer.gid);
}

UnixConnections& UnixConnections::Instance() {
  static UnixConnections* const connections = new UnixConnections;  // lives until exit
  return *connections;
}

UnixConnections::Connection UnixConnections::Accepted(int fd, PeerCredentials peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection connection{next_generation_++, peer};
  by_fd_[fd] = connection;
  return connection;
}

std::optional<UnixConnections::Connection> UnixConnections::Find(std::string_view grpc_peer) const {
  constexpr std::string_view kPrefix = "fd:";
  if (grpc_peer.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  int fd = -1;
  const char* begin = grpc_peer.data() + kPrefix.size();
  const char* end = grpc_peer.data() + grpc_peer.size();
  auto [last, error] = std::from_chars(begin, end, fd);
  if (error != std::errc() || last != end) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

}  // namespace collectived
