#include "engine/group/socket/socket_handshake.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "engine/errno_message.h"
#include "engine/group/job_token.h"  // ConstantTimeEquals
#include "engine/random_id.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHelloMagic[8] = {'C', 'D', 'C', 'T', 'L', 'v', '2', '\0'};
// The dialler's last word: it has read the listener's answer, so the connection is one both
// ends hold. A listener counts a connection only after this, and keeps listening otherwise.
constexpr char kConfirm = 'C';
constexpr size_t kSecretChars = 32;  // RandomHex(16)
// A connection that does not say hello within this long is dropped: a stray one must not hold
// up the group's connections.
constexpr auto kHelloBudget = std::chrono::milliseconds(2000);
constexpr auto kRedialPauseMax = std::chrono::milliseconds(200);

struct Hello {
  char magic[8];
  uint32_t node;
  char secret[kSecretChars];
};

int MillisLeft(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Rounded up: poll() must not return before the deadline only to find 0 ms left forever.
  const int64_t millis = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(millis, INT_MAX));
}

// Sends or receives what the non-blocking socket takes or gives now of the `n` bytes at `data`,
// from *done on, without waiting. Returns "" (all moved, or the socket would block) or why the
// connection failed.
std::string MoveNow(int fd, bool is_send, void* data, size_t n, size_t* done) {
  auto* bytes = static_cast<char*>(data);
  while (*done < n) {
    const ssize_t moved = is_send ? send(fd, bytes + *done, n - *done, MSG_NOSIGNAL)
                                  : recv(fd, bytes + *done, n - *done, 0);
    if (moved > 0) {
      *done += static_cast<size_t>(moved);
    } else if (moved == 0) {
      return "the connection closed";
    } else if (errno != EINTR) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return "";
      return ErrnoMessage(is_send ? "send" : "recv");
    }
  }
  return "";
}

// Sends or receives all `n` bytes on a non-blocking socket before `deadline`. Returns "" or why
// it could not.
std::string TransferAll(int fd, bool is_send, void* data, size_t n, Clock::time_point deadline) {
  for (size_t done = 0;;) {
    if (std::string why = MoveNow(fd, is_send, data, n, &done); !why.empty()) return why;
    if (done == n) return "";
    const int left = MillisLeft(deadline);
    if (left == 0) return "timed out";
    pollfd waiting{fd, static_cast<short>(is_send ? POLLOUT : POLLIN), 0};
    if (poll(&waiting, 1, left) < 0 && errno != EINTR) return ErrnoMessage("poll");
  }
}

void Tune(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));  // small messages go at once
}

// Tries each address of host:port with a fresh non-blocking socket until `use` takes one
// (returns true: that socket is the result) or none is left (`use` says why in *why).
StatusOr<int> OpenSocket(const std::string& host, const std::string& port, bool passive,
                         const std::string& what,
                         const std::function<bool(int, const addrinfo&, std::string*)>& use) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const char* node = passive && host.empty() ? nullptr : host.c_str();
  const int resolved = getaddrinfo(node, port.c_str(), &hints, &found);
  if (resolved != 0) {
    return Status::Unavailable("cannot resolve '" + host + "': " + gai_strerror(resolved));
  }
  std::string why = "no address";
  for (addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                          address->ai_protocol);
    if (fd < 0) {
      why = ErrnoMessage("socket");
      continue;
    }
    if (use(fd, *address, &why)) {
      freeaddrinfo(found);
      return fd;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return Status::Unavailable("cannot " + what + ": " + why);
}

// A non-blocking listening socket on `host` (port chosen by the kernel); its port in *port.
StatusOr<int> Listen(const std::string& host, int* port) {
  return OpenSocket(host, "0", true, "listen on '" + host + "'",
                    [port](int fd, const addrinfo& address, std::string* why) {
                      sockaddr_storage bound{};
                      socklen_t length = sizeof(bound);
                      if (bind(fd, address.ai_addr, address.ai_addrlen) != 0 ||
                          listen(fd, SOMAXCONN) != 0 ||
                          getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
                        *why = ErrnoMessage("bind/listen");
                        return false;
                      }
                      *port = ntohs(bound.ss_family == AF_INET6
                                        ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
                      return true;
                    });
}

// Connects to host:port before `deadline`; returns the non-blocking socket or why not.
StatusOr<int> Dial(const std::string& host, const std::string& port, Clock::time_point deadline) {
  return OpenSocket(
      host, port, false, "connect to " + host + ":" + port,
      [deadline](int fd, const addrinfo& address, std::string* why) {
        if (connect(fd, address.ai_addr, address.ai_addrlen) != 0 && errno != EINPROGRESS) {
          *why = ErrnoMessage("connect");
          return false;
        }
        pollfd waiting{fd, POLLOUT, 0};
        int error = 0;
        socklen_t length = sizeof(error);
        const int ready = poll(&waiting, 1, MillisLeft(deadline));
        if (ready == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
            error == 0) {
          return true;
        }
        *why = ready == 0 ? "timed out"
                          : std::string("connect: ") + std::strerror(error ? error : errno);
        return false;
      });
}

struct PeerRecord {
  std::string host;
  std::string port;
  std::string secret;
};

// "host port secret" (the host may contain ':' but no space).
std::optional<PeerRecord> ParseRecord(const std::string& text) {
  const size_t first = text.find(' ');
  const size_t second = first == std::string::npos ? first : text.find(' ', first + 1);
  if (second == std::string::npos) return std::nullopt;
  PeerRecord record{text.substr(0, first), text.substr(first + 1, second - first - 1),
                    text.substr(second + 1)};
  if (record.secret.size() != kSecretChars) return std::nullopt;
  return record;
}

Hello MakeHello(int node, const std::string& secret) {
  Hello hello{};
  std::memcpy(hello.magic, kHelloMagic, sizeof(kHelloMagic));
  hello.node = static_cast<uint32_t>(node);
  std::memcpy(hello.secret, secret.data(), kSecretChars);
  return hello;
}

bool HelloIs(const Hello& hello, const std::string& secret) {
  return std::memcmp(hello.magic, kHelloMagic, sizeof(kHelloMagic)) == 0 &&
         ConstantTimeEquals(std::string_view(hello.secret, kSecretChars), secret);
}

class FdCloser {
 public:
  explicit FdCloser(std::vector<int>* fds) : fds_(fds) {}
  ~FdCloser() {
    if (fds_ == nullptr) return;
    for (int fd : *fds_) {
      if (fd >= 0) close(fd);
    }
  }
  void Release() { fds_ = nullptr; }

 private:
  std::vector<int>* fds_;
};

}  // namespace

StatusOr<std::vector<int>> ConnectSocketMesh(const std::string& group,
                                             const std::string& advertise_host, Store& store,
                                             int node_rank, int node_count,
                                             std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string where = "connecting the mesh of group '" + group + "'";
  std::vector<int> fds(static_cast<size_t>(node_count), -1);
  FdCloser closer(&fds);
  if (node_count == 1) {
    closer.Release();
    return fds;
  }

  int port = 0;
  StatusOr<int> listener = Listen(advertise_host, &port);
  if (!listener.ok()) return listener.status().WithContext(where);
  std::vector<int> listening{*listener};
  FdCloser close_listener(&listening);
  const std::string secret = RandomHex(kSecretChars / 2);
  auto key = [](int node) { return "control/" + std::to_string(node); };
  COLLECTIVED_RETURN_IF_ERROR(
      store.Set(key(node_rank), advertise_host + " " + std::to_string(port) + " " + secret)
          .WithContext(where));
  std::vector<std::string> keys;
  for (int node = 0; node < node_count; ++node) keys.push_back(key(node));
  StatusOr<std::vector<std::string>> texts =
      store.MultiGet(keys, std::chrono::milliseconds(std::max(1, MillisLeft(deadline))));
  if (!texts.ok()) return Status::Unavailable(where + ": " + texts.status().message());
  std::vector<PeerRecord> peers;
  for (int node = 0; node < node_count; ++node) {
    std::optional<PeerRecord> record = ParseRecord((*texts)[node]);
    if (!record) {
      return Status::Unavailable(where + ": sidecar node " + std::to_string(node) +
                                 " published a malformed address");
    }
    peers.push_back(*record);
  }

  // Each sidecar dials the ones of lower rank and takes calls from those of higher rank: every
  // sidecar waits only on lower ranks, so the mesh forms without a cycle of waits.
  for (int node = 0; node < node_rank; ++node) {
    // A connection reset or refused while the mesh forms (a full accept backlog under heavy
    // group churn) is dialled again until the deadline; the listener takes the newest connection.
    std::string why;
    for (auto pause = std::chrono::milliseconds(5);; pause = std::min(pause * 2, kRedialPauseMax)) {
      StatusOr<int> dialed = Dial(peers[node].host, peers[node].port, deadline);
      if (dialed.ok()) {
        fds[node] = *dialed;
        Hello hello = MakeHello(node_rank, peers[node].secret);
        Hello answer{};
        why = TransferAll(fds[node], true, &hello, sizeof(hello), deadline);
        if (why.empty()) why = TransferAll(fds[node], false, &answer, sizeof(answer), deadline);
        if (why.empty() &&
            (!HelloIs(answer, secret) || answer.node != static_cast<uint32_t>(node))) {
          why = "it did not answer as that sidecar";
          break;  // a stranger on that port: no retry helps
        }
        char confirm = kConfirm;
        if (why.empty()) why = TransferAll(fds[node], true, &confirm, sizeof(confirm), deadline);
        if (why.empty()) break;
        close(fds[node]);
        fds[node] = -1;
      } else {
        why = dialed.status().message();
      }
      if (Clock::now() + pause >= deadline) break;
      // A back-off before dialling again a listener that refused or reset us, not a wait for a
      // state change (nothing tells a dialler when a peer's listener is back).
      std::this_thread::sleep_for(pause);
    }
    if (!why.empty()) {
      return Status::Unavailable(where + ": sidecar node " + std::to_string(node) + ": " + why);
    }
  }
  for (int expected = node_count - node_rank - 1; expected > 0;) {
    const int left = MillisLeft(deadline);
    if (left == 0) {
      std::string missing;
      for (int node = node_rank + 1; node < node_count; ++node) {
        if (fds[node] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(node);
      }
      return Status::Unavailable(where + ": timed out waiting for sidecar nodes " + missing);
    }
    pollfd waiting{listening[0], POLLIN, 0};
    if (poll(&waiting, 1, left) <= 0) continue;
    const int fd = accept4(listening[0], nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    Hello hello{};
    const Clock::time_point hello_deadline = std::min(deadline, Clock::now() + kHelloBudget);
    const bool valid = TransferAll(fd, false, &hello, sizeof(hello), hello_deadline).empty() &&
                       HelloIs(hello, secret) && hello.node > static_cast<uint32_t>(node_rank) &&
                       hello.node < static_cast<uint32_t>(node_count);
    if (!valid) {  // not one of the group's sidecars: dropped
      close(fd);
      continue;
    }
    // A dialler that did not get the answer dials again: this connection then never confirms
    // and the next one is taken.
    Hello answer = MakeHello(node_rank, peers[hello.node].secret);
    char confirm = 0;
    if (!TransferAll(fd, true, &answer, sizeof(answer), deadline).empty() ||
        !TransferAll(fd, false, &confirm, sizeof(confirm), hello_deadline).empty() ||
        confirm != kConfirm) {
      close(fd);
      continue;
    }
    if (fds[hello.node] >= 0) {
      close(fds[hello.node]);  // the peer dialled again: its earlier connection broke
    } else {
      --expected;
    }
    fds[hello.node] = fd;
  }
  for (int fd : fds) {
    if (fd >= 0) Tune(fd);
  }
  closer.Release();
  return fds;
}

}  // namespace collectived
