#include "services/collectived/unix_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/logging.h"
#include "services/collectived/accept_backoff.h"
#include "services/collectived/unix_connections.h"

namespace collectived {

StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(UnixListenerOptions options) {
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
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int error = errno;
    close(listener);
    return Status::Unavailable(std::string("cannot create an eventfd: ") + std::strerror(error));
  }
  return std::unique_ptr<UnixListener>(new UnixListener(std::move(options), listener, wake));
}

UnixListener::~UnixListener() {
  Stop();
  if (listener_ >= 0) close(listener_);
  if (wake_ >= 0) close(wake_);
}

void UnixListener::Start() {
  thread_ = std::thread([this] { Serve(); });
}

void UnixListener::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
    thread_.join();
  }
  if (listener_ >= 0) {
    close(listener_);
    listener_ = -1;
    ::unlink(options_.path.c_str());
  }
}

void UnixListener::Serve() {
  AcceptBackoff backoff;
  for (;;) {
    const auto now = AcceptBackoff::Clock::now();
    const bool resting = backoff.Resting(now);
    // While resting the listener is not watched (its queued connection would wake us at once).
    pollfd watched[2] = {{wake_, POLLIN, 0},
                         {listener_, static_cast<short>(resting ? 0 : POLLIN), 0}};
    const int ready = poll(watched, 2, resting ? backoff.MillisUntilRetry(now) : -1);
    if (ready < 0 && errno != EINTR) {
      LogError("the Unix socket listener stops", {{"error", std::strerror(errno)}});
      return;
    }
    if (watched[0].revents != 0) return;
    if (backoff.Resting(AcceptBackoff::Clock::now())) continue;
    for (;;) {
      const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (connection < 0) {
        const int error = errno;
        if (AcceptBackoff::IsExhaustion(error)) {
          if (backoff.Failed(error, AcceptBackoff::Clock::now()) && options_.on_exhaustion) {
            options_.on_exhaustion(true, backoff.reason());
          }
        } else if (error != EAGAIN && error != EWOULDBLOCK && error != EINTR &&
                   error != ECONNABORTED) {
          LogWarning("accepting on the Unix socket failed", {{"error", std::strerror(error)}});
        }
        break;
      }
      if (backoff.Succeeded() && options_.on_exhaustion) options_.on_exhaustion(false, "");
      UnixConnections::Instance().Accepted(connection, PeerCredentialsOf(connection));
      options_.on_connection(connection);
    }
  }
}

}  // namespace collectived
