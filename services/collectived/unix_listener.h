// UnixListener: the gRPC Unix socket, accepted by collectived itself rather than by gRPC, so
// that every connection is told apart (gRPC names all of its own Unix connections "unix:"):
// each accepted connection is recorded with its peer's credentials (UnixConnections) and
// handed to gRPC, which then names it "fd:<descriptor>". A session attached on one connection
// is thereby usable from that connection only, as over TCP.
//
// It holds no thread: the sidecar's reactor tells it when a connection waits. When accept fails
// for want of descriptors or memory the listener is left unwatched for a while (AcceptBackoff,
// a timer of the runtime) instead of spinning, reports it (`on_exhaustion(true, reason)`: the
// daemon says NOT_SERVING on health and counts it) and reports recovery as soon as a connection
// is accepted again.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/concurrency/reactor.h"
#include "engine/concurrency/timer_queue.h"
#include "engine/vocabulary/status.h"
#include "services/collectived/accept_backoff.h"

namespace collectived {

struct UnixListenerOptions {
  std::string path;  // the socket file (bound here; removed by Stop)
  int mode = 0660;   // its permissions
  // Takes ownership of an accepted, non-blocking connection (hands it to gRPC). On the reactor
  // thread: must not block.
  std::function<void(int fd)> on_connection;
  // Called when accepting stops for want of resources (true, why) and when it works again.
  std::function<void(bool exhausted, const std::string& reason)> on_exhaustion;
};

class UnixListener {
 public:
  // Binds and listens on options.path (which must not exist). Unavailable with the system's
  // reason otherwise. `reactor` and `timers` must outlive the listener.
  static StatusOr<std::unique_ptr<UnixListener>> Listen(UnixListenerOptions options,
                                                        Reactor& reactor, TimerQueue& timers);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting (the reactor watches the socket). Internal when the reactor refuses it.
  Status Start();
  // Stops accepting (connections already handed over are gRPC's), closes and removes the
  // socket. Idempotent.
  void Stop();

 private:
  // What the retry timer shares with the listener: it may fire after Stop.
  struct Resting {
    std::mutex mutex;
    bool stopped = false;                              // guarded by mutex
    TimerQueue::TimerId retry = TimerQueue::kNoTimer;  // guarded by mutex
  };

  UnixListener(UnixListenerOptions options, int listener, Reactor& reactor, TimerQueue& timers)
      : options_(std::move(options)),
        listener_(listener),
        reactor_(reactor),
        timers_(timers),
        resting_(std::make_shared<Resting>()) {}
  // On the reactor thread: accepts every waiting connection, or rests on exhaustion.
  void AcceptAll();

  const UnixListenerOptions options_;
  int listener_ = -1;
  Reactor& reactor_;
  TimerQueue& timers_;
  AcceptBackoff backoff_;  // used on the reactor thread only
  const std::shared_ptr<Resting> resting_;
  bool watched_ = false;
};

}  // namespace collectived
