#include "services/collectived/metrics_http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/vocabulary/errno_message.h"

namespace collectived {
namespace {

// How long the listener rests after accept failed for want of descriptors or memory (the
// connection stays queued: polling again at once would spin).
constexpr std::chrono::milliseconds kAcceptRest{100};
// How long a client that has its response may take to close its side.
constexpr std::chrono::milliseconds kDrainTimeout{1000};

struct SplitAddress {
  std::string host;  // empty: every interface
  std::string port;
};

StatusOr<SplitAddress> Split(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    return Status::InvalidArgument("metrics address '" + address + "' is not HOST:PORT");
  SplitAddress split{address.substr(0, colon), address.substr(colon + 1)};
  if (split.host.size() >= 2 && split.host.front() == '[' && split.host.back() == ']')
    split.host = split.host.substr(1, split.host.size() - 2);
  if (!std::all_of(split.port.begin(), split.port.end(),
                   [](char c) { return c >= '0' && c <= '9'; }))
    return Status::InvalidArgument("metrics address '" + address + "' has no numeric port");
  return split;
}

int BoundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return 0;
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

std::string Response(const std::string& status, const std::string& content_type,
                     const std::string& body, bool with_body, const std::string& extra = "") {
  std::string head = "HTTP/1.1 " + status + "\r\nContent-Type: " + content_type +
                     "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
                     "Connection: close\r\n\r\n";
  return with_body ? head + body : head;
}

bool IsExhaustion(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

}  // namespace

struct MetricsHttpServer::Connection {
  int fd = -1;
  std::string request;
  std::string response;  // set once the request head is complete
  size_t written = 0;
  // The response is sent and the write side shut: what the client still sends is read and
  // dropped until it closes, so that closing does not reset the connection under the response.
  bool draining = false;
  Clock::TimePoint deadline;
};

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& address,
                                                                      Render render) {
  StatusOr<SplitAddress> split = Split(address);
  if (!split.ok()) return split.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = getaddrinfo(split->host.empty() ? nullptr : split->host.c_str(),
                                   split->port.c_str(), &hints, &found);
  if (resolved != 0)
    return Status::Unavailable("cannot serve metrics on " + address + ": " +
                               gai_strerror(resolved));
  std::string reason = "no address";
  int listen_fd = -1;
  for (addrinfo* candidate = found; candidate != nullptr; candidate = candidate->ai_next) {
    const int fd =
        socket(candidate->ai_family, candidate->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               candidate->ai_protocol);
    if (fd < 0) {
      reason = ErrnoMessage("socket");
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, candidate->ai_addr, candidate->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      listen_fd = fd;
      break;
    }
    reason = ErrnoMessage("bind");
    close(fd);
  }
  freeaddrinfo(found);
  if (listen_fd < 0)
    return Status::Unavailable("cannot serve metrics on " + address + ": " + reason);
  const int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    const std::string why = ErrnoMessage("eventfd");
    close(listen_fd);
    return Status::Internal("cannot serve metrics: " + why);
  }
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(listen_fd, stop_fd, BoundPort(listen_fd), std::move(render)));
  server->thread_ = std::thread([raw = server.get()] { raw->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int stop_fd, int port, Render render)
    : listen_fd_(listen_fd), stop_fd_(stop_fd), port_(port), render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(stop_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(stop_fd_);
}

void MetricsHttpServer::Loop() {
  Clock& clock = Clock::Real();
  std::vector<Connection> connections;
  Clock::TimePoint accept_rest_until{};
  std::vector<pollfd> polled;
  for (;;) {
    const Clock::TimePoint now = clock.Now();
    polled.clear();
    polled.push_back({stop_fd_, POLLIN, 0});
    const bool accepting = connections.size() < kMaxConnections && now >= accept_rest_until;
    polled.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    Clock::TimePoint wake = accepting ? Clock::TimePoint::max() : accept_rest_until;
    for (const Connection& connection : connections) {
      polled.push_back({connection.fd,
                        static_cast<short>(
                            connection.response.empty() || connection.draining ? POLLIN : POLLOUT),
                        0});
      wake = std::min(wake, connection.deadline);
    }
    int timeout_ms = -1;
    if (wake != Clock::TimePoint::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60000));
    }
    if (poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (polled[0].revents != 0) break;

    if (polled[1].revents & POLLIN) {
      while (connections.size() < kMaxConnections) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (IsExhaustion(errno)) accept_rest_until = clock.Now() + kAcceptRest;
          break;
        }
        Connection connection;
        connection.fd = fd;
        connection.deadline = clock.Now() + kIdleTimeout;
        connections.push_back(std::move(connection));
      }
    }

    const Clock::TimePoint after = clock.Now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& connection = connections[i];
      const short events =
          i + 2 < polled.size() && polled[i + 2].fd == connection.fd ? polled[i + 2].revents : 0;
      bool done = after >= connection.deadline || (events & (POLLERR | POLLNVAL)) != 0;
      if (!done && connection.draining && (events & (POLLIN | POLLHUP))) {
        char sink[4096];
        const ssize_t got = recv(connection.fd, sink, sizeof(sink), 0);
        done = got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR);
      }
      if (!done && connection.response.empty() && (events & (POLLIN | POLLHUP))) {
        char chunk[4096];
        const ssize_t got = recv(connection.fd, chunk, sizeof(chunk), 0);
        if (got <= 0) {
          done = got == 0 || (errno != EAGAIN && errno != EINTR);
        } else {
          connection.request.append(chunk, static_cast<size_t>(got));
          const bool complete = connection.request.find("\r\n\r\n") != std::string::npos ||
                                connection.request.find("\n\n") != std::string::npos;
          if (connection.request.size() > kMaxRequestBytes) {
            connection.response = Response("431 Request Header Fields Too Large", "text/plain",
                                           "request head over 16 KiB\n", true);
          } else if (complete) {
            const std::string line =
                connection.request.substr(0, connection.request.find_first_of("\r\n"));
            const size_t space = line.find(' ');
            const std::string method = line.substr(0, space);
            std::string target = space == std::string::npos ? "" : line.substr(space + 1);
            target = target.substr(0, target.find(' '));
            target = target.substr(0, target.find('?'));
            const bool head = method == "HEAD";
            if (method != "GET" && !head) {
              connection.response = Response("405 Method Not Allowed", "text/plain",
                                             "only GET and HEAD\n", true, "Allow: GET, HEAD\r\n");
            } else if (target != "/metrics") {
              connection.response =
                  Response("404 Not Found", "text/plain", "the metrics are at /metrics\n", !head);
            } else {
              connection.response =
                  Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_(), !head);
            }
          }
        }
      }
      if (!done && !connection.draining && !connection.response.empty() && (events & POLLOUT)) {
        const ssize_t sent = send(connection.fd, connection.response.data() + connection.written,
                                  connection.response.size() - connection.written, MSG_NOSIGNAL);
        if (sent < 0) {
          done = errno != EAGAIN && errno != EINTR;
        } else {
          connection.written += static_cast<size_t>(sent);
          if (connection.written == connection.response.size()) {
            shutdown(connection.fd, SHUT_WR);
            connection.draining = true;
            connection.deadline = std::min(connection.deadline, after + kDrainTimeout);
          }
        }
      }
      if (done) connection.fd = (close(connection.fd), -1);
    }
    std::erase_if(connections, [](const Connection& connection) { return connection.fd < 0; });
  }
  for (const Connection& connection : connections) close(connection.fd);
}

}  // namespace collectived
