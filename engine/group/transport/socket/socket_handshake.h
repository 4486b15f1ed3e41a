// How a group's sidecars open TCP connections to one another, meeting through the group's store,
// which is the trust anchor here as it is for Gloo: each sidecar listens on an ephemeral port of
// its advertised host and publishes the address with a random secret. A connecting sidecar
// presents the listener's secret and gets its own back, so a stray or forged connection is
// refused; it then confirms that it read the answer, and only a confirmed connection counts, so a
// dialler whose answer was lost dials again and is taken.
//
// Between two sidecars the one of higher rank dials and the other answers, so connections form
// without a cycle of waits. A group is not a full mesh: ConnectSocketMesh connects each sidecar
// to its dissemination peers only (i ± 2^k, at most 2·⌈log₂ S⌉ of them: what the agreement's
// allgather uses), and SocketMesh opens any other connection on first use (a point-to-point
// transfer) through the same MeshHandshake.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/concurrency/cancel_token.h"
#include "engine/concurrency/clock.h"
#include "engine/group/transport/dissemination.h"
#include "engine/store/store.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// This sidecar's side of its group's connections: its listener (published in the store) and the
// two halves of the handshake. Thread-safety: every method may be called from any thread.
class MeshHandshake {
 public:
  // Listens on `advertise_host` and publishes this node's address under "control/<node>" of
  // `store` (scoped to this incarnation of the group). Unavailable when it cannot listen. Its
  // deadlines, polls and back-offs read `clock`, which must outlive it.
  static StatusOr<std::shared_ptr<MeshHandshake>> Listen(std::string group,
                                                         const std::string& advertise_host,
                                                         std::shared_ptr<Store> store,
                                                         int node_rank, int node_count,
                                                         Clock& clock = Clock::Real());
  ~MeshHandshake();  // closes the listener
  MeshHandshake(const MeshHandshake&) = delete;
  MeshHandshake& operator=(const MeshHandshake&) = delete;

  int listener() const { return listener_; }

  // Reads the published addresses of `nodes` in one store call (those not read yet). A
  // cancelled `cancel` ends the wait for them with its reason.
  Status Prefetch(const std::vector<int>& nodes, Clock::TimePoint deadline,
                  CancelToken* cancel = nullptr);
  // Dials node `peer` (of lower rank) until it takes a confirmed connection or `deadline`
  // passes (a reset or refused connection is dialled again). Returns the non-blocking socket,
  // or Unavailable naming the group and the peer; the reason of `cancel` once it is cancelled.
  StatusOr<int> Dial(int peer, Clock::TimePoint deadline, CancelToken* cancel = nullptr);
  // Answers a connection accepted on the listener: returns the node (of higher rank) that
  // dialled once it confirmed, or why it is not taken (a stranger, or a dialler that went).
  // The caller closes `fd` on error.
  StatusOr<int> Answer(int fd, Clock::TimePoint deadline);

 private:
  struct PeerRecord {
    std::string host;
    std::string port;
    std::string secret;
  };

  MeshHandshake(std::string group, int listener, std::string secret, std::shared_ptr<Store> store,
                int node_rank, int node_count, Clock& clock);
  StatusOr<PeerRecord> Record(int node, Clock::TimePoint deadline, CancelToken* cancel);

  const std::string group_;
  const int listener_;
  const std::string secret_;
  const std::shared_ptr<Store> store_;
  const int node_rank_;
  const int node_count_;
  Clock& clock_;
  std::mutex mutex_;
  std::map<int, PeerRecord> records_;  // guarded by mutex_
};

// The connections a group starts with: its dissemination peers' sockets by node (-1 for every
// other node; all -1 with one node) and the handshake that opens the others later.
struct MeshConnections {
  std::vector<int> fds;
  std::shared_ptr<MeshHandshake> handshake;  // null with one node
};

// Connects this sidecar (node `node_rank` of `node_count`) with its dissemination peers of
// `group`, meeting through `store`, listening on `advertise_host`. Blocks until each of them is
// connected. Unavailable naming the group and the peer when `timeout` passes first or a peer
// cannot be reached. A higher node that is not a dissemination peer but dials early (a transfer
// on first use) is taken too. The timeout, and the handshake's later deadlines, read `clock`.
// Once `cancel` (when given) is cancelled, returns its reason at once: a sidecar that stops does
// not wait out the timeout for peers that stop too.
StatusOr<MeshConnections> ConnectSocketMesh(const std::string& group,
                                            const std::string& advertise_host,
                                            std::shared_ptr<Store> store, int node_rank,
                                            int node_count, std::chrono::milliseconds timeout,
                                            Clock& clock = Clock::Real(),
                                            std::shared_ptr<CancelToken> cancel = nullptr);

}  // namespace collectived
