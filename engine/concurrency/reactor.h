// Reactor: one epoll thread that watches the sidecar's sockets for everyone — every group's
// connections to its peer sidecars — and runs a handler when one is readable, writable or
// broken. A connection waiting for a peer's message therefore holds no thread: its owner keeps
// its state and the reactor calls back when bytes arrive.
//
// Handlers run on the reactor thread, one at a time; they must not block (move what the socket
// takes or gives now; hand anything long to an Executor).
//
// Thread-safety: every method may be called from any thread, handlers included.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/vocabulary/status.h"

namespace collectived {

class Reactor {
 public:
  // Called with the epoll events that fired (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP...).
  using Handler = std::function<void(uint32_t events)>;

  // Opens the epoll instance and its wake-up eventfd and starts the thread; Internal when the
  // kernel refuses either.
  static StatusOr<std::unique_ptr<Reactor>> Create();
  // Stops the thread. Every descriptor must have been unwatched.
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // Watches `fd` (not watched yet; the caller keeps owning it) for `events` (EPOLLIN and/or
  // EPOLLOUT; errors and hang-ups are always reported). Internal when epoll refuses it.
  Status Watch(int fd, uint32_t events, Handler handler);
  // Changes the events watched for `fd` (ignored for a descriptor not watched).
  void Update(int fd, uint32_t events);
  // Stops watching `fd`. Once it returns, its handler is not running (unless Unwatch was called
  // from that handler) and never runs again.
  void Unwatch(int fd);

  // Runs `fn` on the reactor thread, soon, in post order.
  void Post(std::function<void()> fn);

  bool OnReactorThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct Registration {
    int fd;
    Handler handler;
  };
  Reactor(int epoll_fd, int wake_fd);
  void Loop();
  void Wake();

  const int epoll_fd_;
  const int wake_fd_;
  mutable std::mutex mutex_;
  std::condition_variable handler_done_;
  std::map<uint64_t, std::shared_ptr<Registration>> registrations_;  // guarded; by id
  std::map<int, uint64_t> id_of_fd_;                                 // guarded by mutex_
  std::deque<std::function<void()>> posted_;                         // guarded by mutex_
  uint64_t next_id_ = 1;                                             // guarded by mutex_
  uint64_t running_ = 0;   // guarded by mutex_: the registration whose handler runs now
  bool stopping_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace collectived
