// UnixListener: the gRPC Unix socket, accepted by collectived itself rather than by gRPC, so
// that every connection is told apart (gRPC names all of its own Unix connections "unix:"):
// each accepted connection is recorded with its peer's credentials (UnixConnections) and
// handed to gRPC, which then names it "fd:<descriptor>". A session attached on one connection
// is thereby usable from that connection only, as over TCP.
//
// When accept fails for want of descriptors or memory the listener rests (AcceptBackoff)
// instead of spinning, reports it (`on_exhaustion(true, reason)`: the daemon says NOT_SERVING
// on health and counts it) and reports recovery as soon as a connection is accepted again.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "engine/status.h"

namespace collectived {

struct UnixListenerOptions {
  std::string path;  // the socket file (bound here; removed by Stop)
  int mode = 0660;   // its permissions
  // Takes ownership of an accepted, non-blocking connection (hands it to gRPC).
  std::function<void(int fd)> on_connection;
  // Called when accepting stops for want of resources (true, why) and when it works again.
  std::function<void(bool exhausted, const std::string& reason)> on_exhaustion;
};

class UnixListener {
 public:
  // Binds and listens on options.path (which must not exist). Unavailable with the system's
  // reason otherwise.
  static StatusOr<std::unique_ptr<UnixListener>> Listen(UnixListenerOptions options);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting on a thread of its own.
  void Start();
  // Stops accepting (connections already handed over are gRPC's), closes and removes the
  // socket. Idempotent.
  void Stop();

 private:
  UnixListener(UnixListenerOptions options, int listener, int wake)
      : options_(std::move(options)), listener_(listener), wake_(wake) {}
  void Serve();

  const UnixListenerOptions options_;
  int listener_ = -1;
  int wake_ = -1;  // an eventfd: Stop wakes the thread through it
  std::thread thread_;
};

}  // namespace collectived
