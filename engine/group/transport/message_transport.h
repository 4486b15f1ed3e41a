// MessageTransport: point-to-point byte transfers between the sidecars of a group, matched by
// key. A send and a receive of one key meet in the order each side started them; the bytes move
// only once the receiver's buffer is there (rendezvous), so nothing waits in memory the sidecar
// did not plan for. Completions come back through callbacks: a transfer waiting for its peer holds
// no thread.
//
// Timeouts are the caller's (PointToPoint watches each transfer's deadline and fails the group);
// closing the connections (the group's ControlChannel::Close, same object) ends every transfer
// with PeerLost.
//
// Thread-safety: every method may be called from any thread; callbacks may start transfers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "engine/vocabulary/status.h"

namespace collectived {

// Identifies one stream of messages: from group rank `source` to group rank `destination` with
// the user's tag. Messages of one key arrive in the order they were sent. Negative ranks name
// streams of the engine's own (PointToPoint's envelopes).
struct P2PKey {
  int source = 0;
  int destination = 0;
  int64_t tag = 0;
  auto operator<=>(const P2PKey&) const = default;
};

class MessageTransport {
 public:
  using Done = std::function<void(const Status&)>;

  virtual ~MessageTransport() = default;

  // Moves `bytes` bytes to (from) sidecar node `node`; `done` runs exactly once, on a thread of
  // the transport or on this one before the call returns (a broken connection), when the
  // transfer completed or failed (PeerLost when the connection broke or the transport was
  // closed; Internal when the two sides disagree on the size). The memory must stay valid until
  // then. `done` must not block.
  virtual void StartSend(const void* data, size_t bytes, int node, const P2PKey& key,
                         Done done) = 0;
  virtual void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) = 0;

  // Whether every transfer started here has finished (its `done` has returned).
  virtual bool Idle() const = 0;
};

}  // namespace collectived
