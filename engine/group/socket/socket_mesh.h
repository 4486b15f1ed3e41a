// SocketMesh: a group's TCP connections to its peer sidecars (ConnectSocketMesh), run by the
// sidecar's Reactor. It is the group's ControlChannel (each op's agreement: one framed message
// each way per pair) and its MessageTransport (point-to-point bytes: the receiver clears a send
// once its buffer is there, then the bytes go straight into it). Nothing here holds a thread
// while waiting for a peer: writes go out from the calling thread as far as the socket takes
// them, the rest and every read are moved by the reactor, and callbacks report completions.
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

#include "engine/concurrency/reactor.h"
#include "engine/group/control_channel.h"
#include "engine/group/message_transport.h"

namespace collectived {

class SocketMesh final : public ControlChannel,
                         public MessageTransport,
                         public std::enable_shared_from_this<SocketMesh> {
 public:
  using Done = std::function<void(const Status&)>;  // both bases' (the same type)

  // Runs `fds` (by node, -1 for this node; ConnectSocketMesh's result) on `reactor`, which must
  // outlive the mesh. Takes the descriptors (closed by the destructor, or here on failure).
  // Internal when the reactor refuses one.
  static StatusOr<std::shared_ptr<SocketMesh>> Start(std::string group, int node_rank,
                                                     std::vector<int> fds, Reactor& reactor);
  // Stops watching and closes the connections. Transfers still pending are dropped without a
  // callback: Close first to fail them.
  ~SocketMesh() override;
  SocketMesh(const SocketMesh&) = delete;
  SocketMesh& operator=(const SocketMesh&) = delete;

  int node_rank() const override { return node_rank_; }
  int node_count() const override { return node_count_; }
  // The connections this sidecar holds for the group (node_count - 1).
  int connections() const { return node_count() - 1; }

  void StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node, uint32_t tag,
                      Done done) override;
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
  struct Gather;
  // Callbacks that became due under the lock, run once it is released.
  struct Fired;

  SocketMesh(std::string group, int node_rank, std::vector<int> fds, Reactor& reactor);
  void OnEvents(int node, uint32_t events);

  // Writes what the socket takes now; watches for room while something is left.
  void FlushLocked(Peer& peer, Fired& fired);
  void ReadLocked(Peer& peer, Fired& fired);
  void OnHeaderLocked(Peer& peer, Fired& fired);
  void OnPayloadLocked(Peer& peer, Fired& fired);
  // Queues the data frame of `send` (cleared by the receiver for `bytes`).
  void SendDataLocked(Peer& peer, const P2PKey& key, Transfer send, uint64_t cleared, Fired& fired);
  // Marks the connection broken (first reason wins) and fails everything waiting on it.
  void BreakLocked(Peer& peer, const std::string& why, Fired& fired);
  void TryCompleteGatherLocked(Fired& fired);
  void FailGatherLocked(const Status& status, Fired& fired);
  Status BrokenStatus(const Peer& peer, const std::string& why) const;
  Status ClosedStatus() const;
  void Run(Fired& fired);

  const std::string group_;
  const int node_rank_;
  const int node_count_;
  Reactor& reactor_;

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by node (this node's has no connection); guarded
  std::unique_ptr<Gather> gather_;            // guarded by mutex_
  bool closed_ = false;                       // guarded by mutex_
  Done broken_handler_;                       // guarded by mutex_; runs once
  std::atomic<int> callbacks_due_{0};         // callbacks taken out of the state, not yet returned
};

}  // namespace collectived
