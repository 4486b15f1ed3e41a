// GlooPairs: a Gloo context among the sidecars of one group whose pairs are connected on first
// use, not as a full mesh when the group forms. A group that only ever allreduces then holds the
// two connections of Gloo's ring, not S - 1 (issue 35: connections in O(log S) per sidecar).
//
// Debian's Gloo (snapshot 2022-05-18) has no lazy initialization: gloo::rendezvous::Context
// connects every pair at once. This class fills a gloo::Context itself (its protected device_
// and transportContext_) with a TCP transport context that starts with no pair, and Connect()
// adds the pairs an algorithm is about to use. Gloo's algorithms then find them through
// gloo::Context::getPair as usual; a pair an algorithm uses but that is not connected is a null
// pointer inside Gloo, so callers connect every peer of a call before making it (GlooBackend).
//
// Rendezvous, per pair: each side creates its pair (a listening socket), publishes the pair's
// address under "pair/<me>/<peer>" in the group's store, reads "pair/<peer>/<me>" and calls
// Gloo's Pair::connect, which blocks until the connection is made. The keys name the pair, so
// callers need no round counter and concurrent callers agree. A call's peers are connected in
// ascending rank order, after all of its pairs were published: see Connect for why this cannot
// deadlock.
//
// Thread-safety: Connect, connected_peers and Close may be called concurrently from any thread,
// also while Gloo calls run on pairs already connected. Gloo's own calls are as thread-safe as
// Gloo makes them (calls with different tags may run at once).
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/store/store.h"
#include "engine/vocabulary/status.h"

namespace collectived {

class GlooPairs final : public gloo::Context {
 public:
  // Creates the context of node `rank` of `size` (size >= 2) of group `group`, on `device` (a
  // Gloo TCP device), with no pair yet. The pairs' addresses meet in `store`, which must be
  // scoped to this incarnation of the group (it is kept alive by the context). `pair_timeout`
  // bounds Gloo's wait for a pair's peer to connect, and is the default timeout of Gloo calls.
  // Connect's deadlines read `clock`, which must outlive the context. Returns Unavailable naming
  // the group when Gloo cannot create the transport context.
  static StatusOr<std::shared_ptr<GlooPairs>> Create(
      std::string group, int rank, int size, std::shared_ptr<gloo::transport::Device> device,
      std::shared_ptr<Store> store, std::chrono::milliseconds pair_timeout,
      Clock& clock = Clock::Real());

  ~GlooPairs() override;

  GlooPairs(const GlooPairs&) = delete;
  GlooPairs& operator=(const GlooPairs&) = delete;

  // Connects this node with every node in `peers` it is not connected with yet (this node's own
  // rank is skipped; duplicates are fine), and returns once all of them are connected: at once
  // when they already are. Every peer named here must, at some point, make a Connect call that
  // names this node (the peer sets of a Gloo algorithm are symmetric), else the pair's
  // connection waits until `timeout` (for the peer's address) or the pair timeout (for the
  // peer's connect) passes.
  //
  // Why no deadlock: each call first creates and publishes all its missing pairs (no waiting on
  // peers), then connects them in ascending peer order; a pair's side waits only for its peer to
  // publish (a client) or to reach that pair in its own Connect (a listener). Ascending peer
  // order on every node is the global order of edges {min, max} (lexicographic), so the least
  // edge anyone waits on has both its ends at it. Pairs, not the whole call, are serialized
  // across threads: a thread that finds a pair being connected by another waits for that pair.
  //
  // Returns OK; Unavailable naming the group and the peer when a pair cannot be connected (the
  // peer's address did not appear within `timeout`, or Gloo failed to connect: the message
  // carries Gloo's reason); PeerLost when Close() ran first or meanwhile; InvalidArgument for a
  // rank outside [0, size). A pair that failed stays failed: later calls that need it return
  // its error again (the group fails on the first one anyway).
  Status Connect(const std::vector<int>& peers, std::chrono::milliseconds timeout);

  // How many peers this node is connected with now (pairs whose connection was made; a pair
  // still connecting does not count). Closed pairs still count.
  int connected_peers() const;

  // Closes every pair (Gloo's closeConnections, made safe against pairs being added) and makes
  // every Connect, now and later, return PeerLost; a Connect waiting for a peer's address or
  // for a peer to connect wakes at once. Gloo calls blocked on a pair fail (Gloo throws).
  // Idempotent.
  void Close();

 private:
  enum class PairState { kNone, kPublished, kConnecting, kConnected, kFailed };

  GlooPairs(std::string group, int rank, int size, std::shared_ptr<Store> store, Clock& clock);

  // Waits (no lock held) for the peer's address, then connects the pair (created before).
  Status ConnectPair(int peer, Clock::TimePoint deadline);
  // The peer's published address of its pair with this node, waiting until `deadline` or Close.
  StatusOr<std::string> AwaitPeerAddress(int peer, Clock::TimePoint deadline);
  Status ClosedError(int peer) const;

  static std::string PairKey(int from, int to);

  const std::string group_;
  const std::shared_ptr<Store> store_;
  Clock& clock_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;    // a pair's state changed, or Close ran
  std::vector<PairState> states_;      // guarded by mutex_; by peer rank
  std::vector<Status> failures_;       // guarded by mutex_; why a kFailed pair failed
  int connected_ = 0;                  // guarded by mutex_
  bool closed_ = false;                // guarded by mutex_
  std::vector<WaitId> address_waits_;  // guarded by mutex_; pending WaitAsync on the store
};

}  // namespace collectived
