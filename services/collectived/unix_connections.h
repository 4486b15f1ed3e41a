// UnixConnections: the connections this process accepted on its Unix sockets and handed to
// gRPC, by descriptor, with the credentials the kernel gave for their peer (SO_PEERCRED). gRPC
// names such a connection "fd:<descriptor>" (AddInsecureChannelFromFd); a descriptor number is
// reused once gRPC closes it, so each accepted connection also gets a generation that no other
// connection of the process ever has: a session bound to (descriptor, generation) is usable
// from that connection only, even after its number is taken by a newer one.
//
// Process-wide (descriptors are), thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "engine/sidecar/session.h"  // PeerCredentials

namespace collectived {

// The credentials of the process at the other end of a Unix socket; pid 0 when unknown.
PeerCredentials PeerCredentialsOf(int socket);
// "pid 12 uid 1000 gid 1000".
std::string DescribePeerCredentials(const PeerCredentials& peer);

class UnixConnections {
 public:
  struct Connection {
    uint64_t generation = 0;
    PeerCredentials peer;
  };

  static UnixConnections& Instance();

  // Records a connection just accepted on `fd` (replacing what a closed one left under the
  // same number) and returns it.
  Connection Accepted(int fd, PeerCredentials peer);
  // The connection gRPC names `grpc_peer` ("fd:17"), or nullopt for any other peer string.
  std::optional<Connection> Find(std::string_view grpc_peer) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, Connection> by_fd_;  // guarded by mutex_
  uint64_t next_generation_ = 1;     // guarded by mutex_
};

}  // namespace collectived
