// SocketMesh: a group's TCP connections to its peer sidecars, run by the sidecar's Reactor. It
// is the group's ControlChannel and its MessageTransport (point-to-point bytes: the receiver
// clears a send once its buffer is there, then the bytes go straight into it). Nothing here holds
// a thread while waiting for a peer: writes go out from the calling thread as far as the socket
// takes them, the rest and every read are moved by the reactor, and callbacks report completions.
//
// It is not a full mesh: a sidecar starts with connections to its dissemination peers only
// (ConnectSocketMesh: i ± 2^k, at most 2·⌈log₂ S⌉), and each op's agreement is a dissemination
// (Bruck) allgather over them, or a large group's allreduce of summaries up and down a binomial
// tree over the same peers: the protocols of ControlExchange, whose messages travel here as
// control frames, sent at once (no clearance) and taken in each connection's order. A transfer
// to any other sidecar opens a connection on first use (the higher node dials, on the
// executor).
//
// Every message is a frame (type, check, key, length) so that a stream that lost its framing (a
// bug, or a peer that is not what it claims) breaks the connection instead of being read as
// data. A broken connection fails what waits on it with PeerLost at once; the group learns the
// reason through its store and decides what that means.
//
// Thread-safety: every method may be called from any thread; callbacks run without the mesh's
// lock held and may start new exchanges and transfers.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/concurrency/runtime.h"
#include "engine/group/transport/control_channel.h"
#include "engine/group/transport/control_exchange.h"
#include "engine/group/transport/message_transport.h"
#include "engine/group/transport/socket/socket_handshake.h"

namespace collectived {

class SocketMesh final : public ControlChannel,
                         public MessageTransport,
                         public std::enable_shared_from_this<SocketMesh> {
 public:
  using Done = std::function<void(const Status&)>;  // both bases' (the same type)

  // Runs `connections` (ConnectSocketMesh's result) on `runtime`'s reactor; connections opened
  // on first use are made on its executor. The runtime must outlive the mesh. Takes the
  // descriptors (closed by the destructor, or here on failure). Internal when the reactor
  // refuses one.
  static StatusOr<std::shared_ptr<SocketMesh>> Start(std::string group, int node_rank,
                                                     MeshConnections connections, Runtime& runtime);
  // Stops watching and closes the connections. Transfers still pending are dropped without a
  // callback: Close first to fail them.
  ~SocketMesh() override;
  SocketMesh(const SocketMesh&) = delete;
  SocketMesh& operator=(const SocketMesh&) = delete;

  int node_rank() const override { return node_rank_; }
  int node_count() const override { return node_count_; }
  // The connections this sidecar holds for the group now.
  int connections() const;

  void StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node, uint32_t tag,
                      Done done) override;
  void StartAllReduce(const void* in, void* out, size_t bytes, Combine combine, uint32_t tag,
                      Done done) override;
  // The nodes whose part has not reached this node yet, directly or passed on by a peer: a
  // superset of the nodes whose ranks did not issue the op.
  std::vector<int> AwaitedNodes() const override;
  void Close() override;
  void SetBrokenHandler(Done handler) override;

  void StartSend(const void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  bool Idle() const override;

 private:
  struct OutChunk;
  struct Transfer;
  struct Peer;
  // Callbacks that became due under the lock, run once it is released.
  struct Fired;

  SocketMesh(std::string group, int node_rank, MeshConnections connections, Runtime& runtime);
  // Watches a connection (marked watched first: an event may come before Watch returns).
  Status Watch(int node);
  // The reactor's handler of node `node`'s connection (nothing once the mesh is gone).
  Reactor::Handler EventsOf(int node);
  void OnEvents(int node, uint32_t events);
  // A connection arrived on the listener: answered on the executor, then adopted.
  void OnListenerReadable();
  // Takes a connection opened after the start (first use) and sends what waited for it.
  void Adopt(int node, int fd);
  // Opens the connection to `peer` on first use: the higher node dials, the lower one waits.
  void ConnectOnFirstUseLocked(Peer& peer);
  void FailConnect(int node, const Status& why);

  // Writes what the socket takes now; watches for room while something is left.
  void FlushLocked(Peer& peer, Fired& fired);
  void ReadLocked(Peer& peer, Fired& fired);
  void OnHeaderLocked(Peer& peer, Fired& fired);
  void OnPayloadLocked(Peer& peer, Fired& fired);
  // Queues the data frame of `send` (cleared by the receiver for `bytes`).
  void SendDataLocked(Peer& peer, const P2PKey& key, Transfer send, uint64_t cleared, Fired& fired);
  // Marks the connection broken (first reason wins) and fails everything waiting on it.
  void BreakLocked(Peer& peer, const std::string& why, Fired& fired);
  // Posts what the control exchange left (frames to its peers) and takes its callbacks.
  void ApplyLocked(ControlExchange::Effects& effects, Fired& fired);
  Status BrokenStatus(const Peer& peer, const std::string& why) const;
  void Run(Fired& fired);

  const std::string group_;
  // What every exchange and transfer fails with once closed; built once, since a close marks
  // every one of the S peers (a closing sidecar of a large group did S string builds).
  const Status closed_status_;
  const int node_rank_;
  const int node_count_;
  Reactor& reactor_;
  Executor& executor_;
  Clock& clock_;  // the runtime's: first-use connections' deadlines
  const std::shared_ptr<MeshHandshake> handshake_;  // null with one node

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by node (this node's has no connection); guarded
  ControlExchange exchange_;                  // guarded by mutex_
  bool closed_ = false;                       // guarded by mutex_
  bool listening_ = false;                    // guarded by mutex_
  Done broken_handler_;                       // guarded by mutex_; runs once
  std::atomic<int> callbacks_due_{0};         // callbacks taken out of the state, not yet returned
};

}  // namespace collectived
