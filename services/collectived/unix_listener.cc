#include "services/collectived/unix_listener.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/vocabulary/logging.h"
#include "services/collectived/unix_connections.h"

namespace collectived {

StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(UnixListenerOptions options,
                                                             Reactor& reactor, TimerQueue& timers) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options.path.size() >= sizeof(address.sun_path)) {
    return Status::InvalidArgument("socket path " + options.path + " is longer than " +
                                   std::to_string(sizeof(address.sun_path) - 1) + " bytes");
  }
  std::memcpy(address.sun_path, options.path.c_str(), options.path.size() + 1);
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      chmod(options.path.c_str(), static_cast<mode_t>(options.mode)) != 0 ||
      listen(listener, SOMAXCONN) != 0) {
    const int error = errno;
    if (listener >= 0) close(listener);
    return Status::Unavailable("cannot listen on unix:" + options.path + ": " +
                               std::strerror(error));
  }
  return std::unique_ptr<UnixListener>(
      new UnixListener(std::move(options), listener, reactor, timers));
}

UnixListener::~UnixListener() {
  Stop();
}

Status UnixListener::Start() {
  COLLECTIVED_RETURN_IF_ERROR(
      reactor_.Watch(listener_, EPOLLIN, [this](uint32_t) { AcceptAll(); }));
  watched_ = true;
  return Status::Ok();
}

void UnixListener::Stop() {
  {
    std::lock_guard<std::mutex> lock(resting_->mutex);
    resting_->stopped = true;
    timers_.Cancel(resting_->retry);
  }
  if (watched_) {
    reactor_.Unwatch(listener_);  // once it returns, AcceptAll is not running
    watched_ = false;
  }
  if (listener_ >= 0) {
    close(listener_);
    listener_ = -1;
    ::unlink(options_.path.c_str());
  }
}

void UnixListener::AcceptAll() {
  for (;;) {
    const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) {
      const int error = errno;
      if (!AcceptBackoff::IsExhaustion(error)) {
        if (error != EAGAIN && error != EWOULDBLOCK && error != EINTR && error != ECONNABORTED) {
          LogWarning("accepting on the Unix socket failed", {{"error", std::strerror(error)}});
        }
        return;
      }
      // The queued connection would wake the reactor at once: stop watching until the timer.
      const auto now = Clock::Real().Now();
      const bool began = backoff_.Failed(error, now);
      reactor_.Update(listener_, 0);
      {
        std::lock_guard<std::mutex> lock(resting_->mutex);
        if (resting_->stopped) return;
        resting_->retry =
            timers_.ScheduleAfter(std::chrono::milliseconds(backoff_.MillisUntilRetry(now)),
                                  [resting = resting_, reactor = &reactor_, fd = listener_] {
                                    std::lock_guard<std::mutex> lock(resting->mutex);
                                    if (!resting->stopped) reactor->Update(fd, EPOLLIN);
                                  });
      }
      if (began && options_.on_exhaustion) options_.on_exhaustion(true, backoff_.reason());
      return;
    }
    if (backoff_.Succeeded() && options_.on_exhaustion) options_.on_exhaustion(false, "");
    UnixConnections::Instance().Accepted(connection, PeerCredentialsOf(connection));
    options_.on_connection(connection);
  }
}

}  // namespace collectived
