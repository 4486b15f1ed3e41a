#include "engine/group/transport/socket/socket_handshake.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "engine/group/rendezvous/job_token.h"  // ConstantTimeEquals
#include "engine/store/cancellable_wait.h"
#include "engine/vocabulary/errno_message.h"
#include "engine/vocabulary/random_id.h"

namespace collectived {
namespace {

constexpr char kHelloMagic[8] = {'C', 'D', 'C', 'T', 'L', 'v', '3', '\0'};
// The dialler's last word: it has read the listener's answer, so the connection is one both
// ends hold. A listener counts a connection only after this, and keeps listening otherwise.
constexpr char kConfirm = 'C';
constexpr size_t kSecretChars = 32;  // RandomHex(16)
// A connection that does not say hello within this long is dropped: a stray one must not hold
// up the group's connections.
constexpr auto kHelloBudget = std::chrono::milliseconds(2000);
constexpr auto kRedialPauseMax = std::chrono::milliseconds(200);
// A cancellable connect's read of addresses its wait just saw, and how often a store lost
// meanwhile is waited in again.
constexpr auto kPublishedReadBudget = std::chrono::milliseconds(1000);
constexpr int kStoreLostRetries = 3;

struct Hello {
  char magic[8];
  uint32_t node;
  char secret[kSecretChars];
};

// The time left before `deadline` on `clock`, for a store call's timeout (at least 1 ms).
std::chrono::milliseconds StoreTimeLeft(const Clock& clock, Clock::TimePoint deadline) {
  const Clock::Duration left = deadline - clock.Now();
  return std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(left));
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
std::string TransferAll(int fd, bool is_send, void* data, size_t n, Clock::TimePoint deadline,
                        const Clock& clock) {
  for (size_t done = 0;;) {
    if (std::string why = MoveNow(fd, is_send, data, n, &done); !why.empty()) return why;
    if (done == n) return "";
    const int left = clock.PollMillis(deadline);
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
StatusOr<int> Dial(const std::string& host, const std::string& port, Clock::TimePoint deadline,
                   const Clock& clock) {
  return OpenSocket(
      host, port, false, "connect to " + host + ":" + port,
      [deadline, &clock](int fd, const addrinfo& address, std::string* why) {
        if (connect(fd, address.ai_addr, address.ai_addrlen) != 0 && errno != EINPROGRESS) {
          *why = ErrnoMessage("connect");
          return false;
        }
        pollfd waiting{fd, POLLOUT, 0};
        int error = 0;
        socklen_t length = sizeof(error);
        const int ready = poll(&waiting, 1, clock.PollMillis(deadline));
        if (ready == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
            error == 0) {
          return true;
        }
        *why = ready == 0 ? "timed out"
                          : std::string("connect: ") + std::strerror(error ? error : errno);
        return false;
      });
}

// "host port secret" (the host may contain ':' but no space).
bool ParseRecord(const std::string& text, std::string* host, std::string* port,
                 std::string* secret) {
  const size_t first = text.find(' ');
  const size_t second = first == std::string::npos ? first : text.find(' ', first + 1);
  if (second == std::string::npos) return false;
  *host = text.substr(0, first);
  *port = text.substr(first + 1, second - first - 1);
  *secret = text.substr(second + 1);
  return secret->size() == kSecretChars;
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

std::string ControlKey(int node) {
  return "control/" + std::to_string(node);
}

// An eventfd that a cancel makes readable, so that a poll for connections ends at once. Shared
// with the token's callback, which may run after the wait returned.
class CancelWakeup {
 public:
  static StatusOr<std::shared_ptr<CancelWakeup>> Make() {
    const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return Status::Internal(ErrnoMessage("eventfd"));
    return std::shared_ptr<CancelWakeup>(new CancelWakeup(fd));
  }
  ~CancelWakeup() { close(fd_); }
  CancelWakeup(const CancelWakeup&) = delete;
  CancelWakeup& operator=(const CancelWakeup&) = delete;

  int fd() const { return fd_; }
  void Signal() {
    const uint64_t one = 1;
    (void)!write(fd_, &one, sizeof(one));
  }

 private:
  explicit CancelWakeup(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace

MeshHandshake::MeshHandshake(std::string group, int listener, std::string secret,
                             std::shared_ptr<Store> store, int node_rank, int node_count,
                             Clock& clock)
    : group_(std::move(group)),
      listener_(listener),
      secret_(std::move(secret)),
      store_(std::move(store)),
      node_rank_(node_rank),
      node_count_(node_count),
      clock_(clock) {}

MeshHandshake::~MeshHandshake() {
  close(listener_);
}

StatusOr<std::shared_ptr<MeshHandshake>> MeshHandshake::Listen(std::string group,
                                                               const std::string& advertise_host,
                                                               std::shared_ptr<Store> store,
                                                               int node_rank, int node_count,
                                                               Clock& clock) {
  const std::string where = "connecting the sidecars of group '" + group + "'";
  int port = 0;
  StatusOr<int> listener = ::collectived::Listen(advertise_host, &port);
  if (!listener.ok()) return listener.status().WithContext(where);
  std::shared_ptr<MeshHandshake> handshake(new MeshHandshake(std::move(group), *listener,
                                                             RandomHex(kSecretChars / 2), store,
                                                             node_rank, node_count, clock));
  COLLECTIVED_RETURN_IF_ERROR(
      store
          ->Set(ControlKey(node_rank),
                advertise_host + " " + std::to_string(port) + " " + handshake->secret_)
          .WithContext(where));
  return handshake;
}

Status MeshHandshake::Prefetch(const std::vector<int>& nodes, Clock::TimePoint deadline,
                               CancelToken* cancel) {
  std::vector<int> missing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int node : nodes) {
      if (!records_.count(node)) missing.push_back(node);
    }
  }
  if (missing.empty()) return Status::Ok();
  const std::string where = "connecting the sidecars of group '" + group_ + "'";
  std::vector<std::string> keys;
  for (int node : missing) keys.push_back(ControlKey(node));
  const auto left = [&] { return StoreTimeLeft(clock_, deadline); };
  StatusOr<std::vector<std::string>> texts = Status::Unavailable("not read");
  if (!cancel) {
    texts = store_->MultiGet(keys, left());
  } else {
    // Cancellable: wait for the addresses, then read what is there. A store lost meanwhile (a
    // movable one moves at the read, to a store where they are not yet) is waited in again, a few
    // times at most.
    for (int tries = 0; tries <= kStoreLostRetries && !texts.ok(); ++tries) {
      bool cancelled = false;
      const Status published =
          WaitUnlessCancelled(*store_, keys, left(), cancel, clock_, &cancelled);
      if (cancelled) return published;
      if (!published.ok() && published.kind() != ErrorKind::kUnavailable) {
        texts = published;
        break;
      }
      texts = store_->MultiGet(keys, std::min(kPublishedReadBudget, left()));
    }
  }
  if (!texts.ok()) return Status::Unavailable(where + ": " + texts.status().message());
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < missing.size(); ++i) {
    PeerRecord record;
    if (!ParseRecord((*texts)[i], &record.host, &record.port, &record.secret)) {
      return Status::Unavailable(where + ": sidecar node " + std::to_string(missing[i]) +
                                 " published a malformed address");
    }
    records_[missing[i]] = std::move(record);
  }
  return Status::Ok();
}

StatusOr<MeshHandshake::PeerRecord> MeshHandshake::Record(int node, Clock::TimePoint deadline,
                                                          CancelToken* cancel) {
  COLLECTIVED_RETURN_IF_ERROR(Prefetch({node}, deadline, cancel));
  std::lock_guard<std::mutex> lock(mutex_);
  return records_.at(node);
}

StatusOr<int> MeshHandshake::Dial(int peer, Clock::TimePoint deadline, CancelToken* cancel) {
  const std::string where =
      "connecting the sidecars of group '" + group_ + "': sidecar node " + std::to_string(peer);
  StatusOr<PeerRecord> record = Record(peer, deadline, cancel);
  if (!record.ok()) return record.status();
  // A connection reset or refused while the group forms (a full accept backlog under heavy
  // group churn) is dialled again until the deadline; the listener takes the newest connection.
  std::string why;
  for (auto pause = std::chrono::milliseconds(5);; pause = std::min(pause * 2, kRedialPauseMax)) {
    if (cancel && !cancel->reason().ok()) return cancel->reason();
    StatusOr<int> dialed = ::collectived::Dial(record->host, record->port, deadline, clock_);
    if (dialed.ok()) {
      const int fd = *dialed;
      Hello hello = MakeHello(node_rank_, record->secret);
      Hello answer{};
      why = TransferAll(fd, true, &hello, sizeof(hello), deadline, clock_);
      if (why.empty()) why = TransferAll(fd, false, &answer, sizeof(answer), deadline, clock_);
      if (why.empty() &&
          (!HelloIs(answer, secret_) || answer.node != static_cast<uint32_t>(peer))) {
        close(fd);
        return Status::Unavailable(where + ": it did not answer as that sidecar");
      }
      char confirm = kConfirm;
      if (why.empty()) why = TransferAll(fd, true, &confirm, sizeof(confirm), deadline, clock_);
      if (why.empty()) {
        Tune(fd);
        return fd;
      }
      close(fd);
    } else {
      why = dialed.status().message();
    }
    if (clock_.Now() + pause >= deadline) break;
    // A back-off before dialling again a listener that refused or reset us, not a wait for a
    // state change (nothing tells a dialler when a peer's listener is back).
    clock_.SleepFor(pause);
  }
  return Status::Unavailable(where + ": " + why);
}

StatusOr<int> MeshHandshake::Answer(int fd, Clock::TimePoint deadline) {
  Hello hello{};
  const Clock::TimePoint hello_deadline = std::min(deadline, clock_.After(kHelloBudget));
  const bool valid =
      TransferAll(fd, false, &hello, sizeof(hello), hello_deadline, clock_).empty() &&
      HelloIs(hello, secret_) && hello.node > static_cast<uint32_t>(node_rank_) &&
      hello.node < static_cast<uint32_t>(node_count_);
  if (!valid) return Status::PermissionDenied("not one of the group's sidecars");
  const int node = static_cast<int>(hello.node);
  StatusOr<PeerRecord> record = Record(node, deadline, nullptr);
  if (!record.ok()) return record.status();
  // A dialler that did not get the answer dials again: this connection then never confirms
  // and the next one is taken.
  Hello answer = MakeHello(node_rank_, record->secret);
  char confirm = 0;
  if (!TransferAll(fd, true, &answer, sizeof(answer), deadline, clock_).empty() ||
      !TransferAll(fd, false, &confirm, sizeof(confirm), hello_deadline, clock_).empty() ||
      confirm != kConfirm) {
    return Status::Unavailable("sidecar node " + std::to_string(node) + " did not confirm");
  }
  Tune(fd);
  return node;
}

StatusOr<MeshConnections> ConnectSocketMesh(const std::string& group,
                                            const std::string& advertise_host,
                                            std::shared_ptr<Store> store, int node_rank,
                                            int node_count, std::chrono::milliseconds timeout,
                                            Clock& clock, std::shared_ptr<CancelToken> cancel) {
  const Clock::TimePoint deadline = clock.After(timeout);
  const std::string where = "connecting the sidecars of group '" + group + "'";
  MeshConnections connections;
  connections.fds.assign(static_cast<size_t>(node_count), -1);
  if (node_count == 1) return connections;
  std::vector<int>& fds = connections.fds;
  FdCloser closer(&fds);
  StatusOr<std::shared_ptr<MeshHandshake>> handshake =
      MeshHandshake::Listen(group, advertise_host, std::move(store), node_rank, node_count, clock);
  if (!handshake.ok()) return handshake.status();
  connections.handshake = *handshake;
  const std::vector<int> peers = DisseminationPeers(node_rank, node_count);
  COLLECTIVED_RETURN_IF_ERROR(connections.handshake->Prefetch(peers, deadline, cancel.get()));

  // Dial the lower peers, then take calls from the higher ones: every sidecar waits only on
  // lower ranks, so the connections form without a cycle of waits.
  int expected = 0;
  for (int peer : peers) {
    if (peer > node_rank) {
      ++expected;
      continue;
    }
    StatusOr<int> dialed = connections.handshake->Dial(peer, deadline, cancel.get());
    if (!dialed.ok()) return dialed.status();
    fds[peer] = *dialed;
  }
  const int listener = connections.handshake->listener();
  // The accept wait also watches an eventfd that a cancel signals.
  std::shared_ptr<CancelWakeup> wakeup;
  uint64_t cancel_watch = 0;
  if (cancel && expected > 0) {
    StatusOr<std::shared_ptr<CancelWakeup>> made = CancelWakeup::Make();
    if (!made.ok()) return made.status().WithContext(where);
    wakeup = *made;
    cancel_watch = cancel->OnCancel([wakeup](const Status&) { wakeup->Signal(); });
  }
  struct Unwatch {
    CancelToken* token;
    uint64_t id;
    ~Unwatch() {
      if (token && id != 0) token->Remove(id);
    }
  } unwatch{cancel.get(), cancel_watch};
  while (expected > 0) {
    if (cancel && !cancel->reason().ok()) return cancel->reason();
    const int left = clock.PollMillis(deadline);
    if (left == 0) {
      std::string missing;
      for (int peer : peers) {
        if (peer > node_rank && fds[peer] < 0)
          missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
      }
      return Status::Unavailable(where + ": timed out waiting for sidecar nodes " + missing);
    }
    pollfd waiting[2] = {{listener, POLLIN, 0}, {wakeup ? wakeup->fd() : -1, POLLIN, 0}};
    if (poll(waiting, 2, left) <= 0 || !(waiting[0].revents & POLLIN)) continue;
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    StatusOr<int> node = connections.handshake->Answer(fd, deadline);
    if (!node.ok()) {  // not one of the group's sidecars, or a dialler that went: dropped
      close(fd);
      continue;
    }
    if (fds[*node] >= 0) {
      close(fds[*node]);  // the peer dialled again: its earlier connection broke
    } else if (std::binary_search(peers.begin(), peers.end(), *node)) {
      --expected;
    }
    fds[*node] = fd;
  }
  closer.Release();
  return connections;
}

}  // namespace collectived
