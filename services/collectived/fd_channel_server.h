// FdChannelServer: the front end through which local clients hand the sidecar memory as file
// descriptors (SCM_RIGHTS on a SOCK_SEQPACKET Unix socket; the format is rpc/fd_channel_wire.h).
// A connection is bound to one session by a one-time token from that session's Attach stream;
// the connection's peer credentials (SO_PEERCRED) are recorded in the session. It is the only
// way memory enters the sidecar: nothing is ever opened by name.
//
// One thread serves every connection (registration is an mmap: short), never blocking on a
// client: a connection that does not bind within `bind_deadline`, sends garbage before binding,
// or does not read its answers is closed.
//
// Thread-safety: Start and Shutdown from one thread; Shutdown is idempotent.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "engine/sidecar/sidecar.h"
#include "engine/vocabulary/status.h"
#include "services/collectived/metrics.h"

namespace collectived {

struct FdChannelOptions {
  std::string path;      // the socket file (FdChannelPath of the gRPC socket)
  unsigned mode = 0660;  // its permissions: those of the gRPC socket
  size_t max_connections = 4096;
  std::chrono::milliseconds bind_deadline{10000};
};

class FdChannelServer {
 public:
  FdChannelServer(Sidecar& sidecar, Metrics& metrics, FdChannelOptions options);
  ~FdChannelServer();
  FdChannelServer(const FdChannelServer&) = delete;
  FdChannelServer& operator=(const FdChannelServer&) = delete;

  // Binds the socket at options.path (its directory must exist and no file may be there) and
  // starts serving. Unavailable with the system's reason otherwise.
  Status Start();

  // Closes every connection, stops the thread and removes the socket file.
  void Shutdown();

 private:
  void Serve();
  // What a new submission ring of `session` costs (a ring, a descriptor, its mapping), taken
  // from the ledger into `claims`; ResourceExhausted naming what is used up.
  Status ClaimRing(const SessionRef& session, std::vector<ResourceClaim>* claims);

  Sidecar& sidecar_;
  Metrics& metrics_;
  const FdChannelOptions options_;
  int listener_ = -1;
  int wake_ = -1;  // eventfd that Shutdown writes to end Serve
  std::thread thread_;
};

}  // namespace collectived
