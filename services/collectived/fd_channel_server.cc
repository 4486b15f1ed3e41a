#include "services/collectived/fd_channel_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/vocabulary/logging.h"
#include "rpc/fd_channel_wire.h"
#include "rpc/submission_ring.h"
#include "services/collectived/accept_backoff.h"
#include "services/collectived/ring_front_end.h"
#include "services/collectived/unix_connections.h"

namespace collectived {
namespace {

struct Connection {
  PeerCredentials peer;
  Clock::TimePoint accepted;
  std::optional<SessionRef> session;       // set once bound
  std::string label;                       // the bound session's label
  std::unique_ptr<RingFrontEnd> ring;      // the session's submission ring, once opened here
  std::vector<ResourceClaim> ring_claims;  // what the ring costs the sidecar
};

FdChannelMessage Answer(FdChannelKind kind, uint64_t request_id, const Status& status) {
  FdChannelMessage answer;
  answer.kind = kind;
  answer.request_id = request_id;
  answer.error_kind = static_cast<int32_t>(status.kind());
  answer.payload = status.message().substr(0, FdChannelMessage::kMaxPayload);
  return answer;
}

}  // namespace

FdChannelServer::FdChannelServer(Sidecar& sidecar, Metrics& metrics, FdChannelOptions options)
    : sidecar_(sidecar), metrics_(metrics), options_(std::move(options)) {}

FdChannelServer::~FdChannelServer() {
  Shutdown();
}

Status FdChannelServer::Start() {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options_.path.size() >= sizeof(address.sun_path)) {
    return Status::InvalidArgument("fd-channel socket path " + options_.path + " is longer than " +
                                   std::to_string(sizeof(address.sun_path) - 1) + " bytes");
  }
  std::memcpy(address.sun_path, options_.path.c_str(), options_.path.size() + 1);
  listener_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener_ < 0 ||
      bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      chmod(options_.path.c_str(), static_cast<mode_t>(options_.mode)) != 0 ||
      listen(listener_, 128) != 0) {
    const int error = errno;
    if (listener_ >= 0) close(listener_);
    listener_ = -1;
    return Status::Unavailable("cannot listen on the fd channel " + options_.path + ": " +
                               std::strerror(error));
  }
  wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_ < 0) {
    close(listener_);
    listener_ = -1;
    return Status::Unavailable(std::string("cannot create an eventfd: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { Serve(); });
  return Status::Ok();
}

void FdChannelServer::Shutdown() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
  thread_.join();
  close(listener_);
  close(wake_);
  listener_ = wake_ = -1;
  ::unlink(options_.path.c_str());
}

Status FdChannelServer::ClaimRing(const SessionRef& ref, std::vector<ResourceClaim>* claims) {
  StatusOr<std::shared_ptr<Session>> session = sidecar_.FindSession(ref);
  if (!session.ok()) return session.status();
  ResourceLedger& ledger = sidecar_.resources();
  const std::shared_ptr<ResourceShare>& share = (*session)->resources();
  // A ring is a thread, a shared mapping and its descriptor.
  for (const auto& [resource, amount] :
       {std::pair{Resource::kRings, uint64_t{1}}, std::pair{Resource::kDescriptors, uint64_t{1}},
        std::pair{Resource::kMappedBytes, uint64_t{SubmissionRingHeader::kTotalBytes}}}) {
    StatusOr<ResourceClaim> claim = ledger.Claim(share, resource, amount);
    if (!claim.ok()) return claim.status();
    claims->push_back(std::move(*claim));
  }
  return Status::Ok();
}

void FdChannelServer::Serve() {
  std::map<int, Connection> connections;
  std::set<std::string> sessions_with_ring;  // one ring per session, whatever the connection
  auto drop = [&](int socket, const std::string& why) {
    auto it = connections.find(socket);
    if (it == connections.end()) return;  // dropped already: never close a number twice
    if (it->second.ring) sessions_with_ring.erase(it->second.session->id);
    if (!why.empty()) {
      LogWarning("fd-channel connection closed",
                 {{"peer", DescribePeerCredentials(it->second.peer)},
                  {"session", it->second.label.empty() ? "(unbound)" : it->second.label},
                  {"why", why}});
    }
    connections.erase(it);
    close(socket);
  };
  // Answers without ever blocking the thread that serves everyone: a client that does not read
  // its answers loses its connection.
  auto reply = [&](int socket, const FdChannelMessage& answer) {
    if (Status sent = SendFdChannelMessage(socket, answer); !sent.ok()) {
      drop(socket, sent.message());
      return false;
    }
    return true;
  };
  auto refuse = [&](const std::string& method, const Status& status) {
    metrics_.CountRefusedCall(method, status.kind());
    LogWarning("fd-channel call refused", {{"method", method}, {"error", status.ToString()}});
  };
  // A call that needs a session, on a connection not bound to one: refused, answered with
  // `answer`, and the connection dropped. Returns false then (the call's descriptor is closed).
  auto require_bound = [&](int socket, const Connection& connection, const FdChannelMessage& call,
                           int fd, const char* verb, const char* method, FdChannelKind answer) {
    if (connection.session) return true;
    if (fd >= 0) close(fd);
    const Status denied = Status::PermissionDenied(
        std::string(verb) +
        " on an unbound fd-channel connection: bind it to a session with the token of the "
        "session's Attach stream first");
    refuse(method, denied);
    reply(socket, Answer(answer, call.request_id, denied));
    drop(socket, "");
    return false;
  };

  // The loop waits in poll (real time): its deadlines are read on the real clock.
  Clock& clock = Clock::Real();
  AcceptBackoff backoff;
  for (;;) {
    // A listener resting after running out of descriptors is not watched (see AcceptBackoff).
    const bool resting = backoff.Resting(clock.Now());
    std::vector<pollfd> watched{{wake_, POLLIN, 0},
                                {listener_, static_cast<short>(resting ? 0 : POLLIN), 0}};
    for (const auto& [socket, connection] : connections) watched.push_back({socket, POLLIN, 0});
    // Asleep until a message, a connection, the stop, or the bind deadline of the oldest
    // connection that has not bound yet (none: no timeout).
    int timeout_ms = -1;
    for (const auto& [socket, connection] : connections) {
      if (connection.session) continue;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          connection.accepted + options_.bind_deadline - clock.Now());
      const int millis = static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
      timeout_ms = timeout_ms < 0 ? millis : std::min(timeout_ms, millis);
    }
    if (resting) {
      const int retry_ms = backoff.MillisUntilRetry(clock.Now());
      timeout_ms = timeout_ms < 0 ? retry_ms : std::min(timeout_ms, retry_ms);
    }
    const int ready = poll(watched.data(), watched.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      LogError("fd channel stops", {{"error", std::strerror(errno)}});
      break;
    }
    if (watched[0].revents != 0) break;
    const auto now = clock.Now();
    if ((watched[1].revents & POLLIN) || (resting && !backoff.Resting(now))) {
      for (;;) {
        const int socket = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (socket < 0) {
          const int error = errno;
          if (AcceptBackoff::IsExhaustion(error) && backoff.Failed(error, now)) {
            metrics_.CountListenerExhaustion("fd_channel");
            LogError("cannot accept fd-channel connections: out of resources; retrying",
                     {{"error", backoff.reason()}});
          }
          break;
        }
        if (backoff.Succeeded()) LogInfo("accepting fd-channel connections again", {});
        if (connections.size() >= options_.max_connections) {
          LogWarning("fd-channel connection refused: too many connections",
                     {{"limit", std::to_string(options_.max_connections)}});
          close(socket);
          continue;
        }
        connections[socket] =
            Connection{PeerCredentialsOf(socket), now, std::nullopt, "", nullptr, {}};
      }
    }
    for (size_t i = 2; i < watched.size(); ++i) {
      const int socket = watched[i].fd;
      if (watched[i].revents == 0) continue;
      auto found = connections.find(socket);
      if (found == connections.end()) continue;
      Connection& connection = found->second;
      int fd = -1;
      StatusOr<FdChannelMessage> message = ReceiveFdChannelMessage(socket, &fd);
      if (!message.ok()) {
        if (message.status().kind() == ErrorKind::kUnavailable) {
          // The client went away: its buffers stay with its session, which ends with its
          // Attach stream.
          const bool closed = message.status().message() == "closed";
          drop(socket, closed ? "" : message.status().message());
          continue;
        }
        if (!connection.session) {
          drop(socket, "malformed message before binding: " + message.status().message());
          continue;
        }
        reply(socket, Answer(FdChannelKind::kRegistered, 0, message.status()));
        continue;
      }
      switch (message->kind) {
        case FdChannelKind::kBind: {
          if (fd >= 0) close(fd);
          if (connection.session) {
            reply(socket, Answer(FdChannelKind::kBound, message->request_id,
                                 Status::InvalidArgument("this fd-channel connection is already "
                                                         "bound to session " +
                                                         connection.label)));
            break;
          }
          StatusOr<std::shared_ptr<Session>> session =
              sidecar_.RedeemChannelToken(message->payload, connection.peer);
          if (!session.ok()) {
            const Status denied = Status::PermissionDenied(session.status().message());
            refuse("FdChannel.Bind", denied);
            reply(socket, Answer(FdChannelKind::kBound, message->request_id, denied));
            drop(socket, "");
            break;
          }
          connection.session = SessionRef{(*session)->id(), (*session)->binding()};
          connection.label = (*session)->label();
          LogInfo("fd channel bound", {{"session", connection.label},
                                       {"peer", DescribePeerCredentials(connection.peer)}});
          FdChannelMessage bound = Answer(FdChannelKind::kBound, message->request_id, Status::Ok());
          bound.payload = connection.label;
          reply(socket, bound);
          break;
        }
        case FdChannelKind::kRegister: {
          if (!require_bound(socket, connection, *message, fd, "register", "FdChannel.Register",
                             FdChannelKind::kRegistered)) {
            break;
          }
          if (fd < 0) {
            reply(socket, Answer(FdChannelKind::kRegistered, message->request_id,
                                 Status::InvalidArgument("session " + connection.label +
                                                         ": register carries no file "
                                                         "descriptor (attach one with "
                                                         "SCM_RIGHTS)")));
            break;
          }
          StatusOr<MappedBuffer> buffer =
              sidecar_.RegisterBuffer(*connection.session, fd, message->value0);
          if (!buffer.ok()) {
            reply(socket, Answer(FdChannelKind::kRegistered, message->request_id, buffer.status()));
            break;
          }
          FdChannelMessage registered =
              Answer(FdChannelKind::kRegistered, message->request_id, Status::Ok());
          registered.value0 = buffer->buffer_id;
          registered.value1 = buffer->mapped_size;
          registered.flags = buffer->sealed ? FdChannelMessage::kFlagSealed : 0;
          reply(socket, registered);
          break;
        }
        case FdChannelKind::kRegisterCudaVmm: {
          if (!require_bound(socket, connection, *message, fd, "register_cuda_vmm",
                             "FdChannel.RegisterCudaVmm", FdChannelKind::kCudaVmmRegistered)) {
            break;
          }
          Status refused;
          if (fd < 0) {
            refused = Status::InvalidArgument("session " + connection.label +
                                              ": register_cuda_vmm carries no file descriptor "
                                              "(attach the allocation's with SCM_RIGHTS)");
          } else if (message->value1 > static_cast<uint64_t>(INT_MAX)) {
            close(fd);
            refused = Status::InvalidArgument(
                "session " + connection.label + ": register_cuda_vmm names device " +
                std::to_string(message->value1) + ", not a CUDA device ordinal");
          }
          StatusOr<uint64_t> id =
              refused.ok() ? sidecar_.RegisterCudaVmm(*connection.session, fd, message->value0,
                                                      static_cast<int>(message->value1))
                           : StatusOr<uint64_t>(refused);
          if (!id.ok()) {
            refuse("FdChannel.RegisterCudaVmm", id.status());
            reply(socket,
                  Answer(FdChannelKind::kCudaVmmRegistered, message->request_id, id.status()));
            break;
          }
          FdChannelMessage registered =
              Answer(FdChannelKind::kCudaVmmRegistered, message->request_id, Status::Ok());
          registered.value0 = *id;
          reply(socket, registered);
          break;
        }
        case FdChannelKind::kUnregisterCudaVmm: {
          if (fd >= 0) close(fd);
          if (!require_bound(socket, connection, *message, -1, "unregister_cuda_vmm",
                             "FdChannel.UnregisterCudaVmm", FdChannelKind::kCudaVmmUnregistered)) {
            break;
          }
          const Status gone = sidecar_.UnregisterCudaVmm(*connection.session, message->value0);
          if (!gone.ok()) refuse("FdChannel.UnregisterCudaVmm", gone);
          reply(socket, Answer(FdChannelKind::kCudaVmmUnregistered, message->request_id, gone));
          break;
        }
        case FdChannelKind::kOpenRing: {
          if (fd >= 0) close(fd);
          Status refused;
          if (!connection.session) {
            refused = Status::PermissionDenied(
                "open_ring on an unbound fd-channel connection: bind it to a session with the "
                "token of the session's Attach stream first");
          } else if (sessions_with_ring.count(connection.session->id) != 0) {
            refused = Status::ResourceExhausted("session " + connection.label +
                                                " already has a submission ring (one per session)");
          }
          std::unique_ptr<RingFrontEnd> ring;
          std::vector<ResourceClaim> ring_claims;
          if (refused.ok()) refused = ClaimRing(*connection.session, &ring_claims);
          if (refused.ok()) {
            StatusOr<std::unique_ptr<RingFrontEnd>> started =
                RingFrontEnd::Start(sidecar_, metrics_, *connection.session, connection.label);
            if (started.ok())
              ring = std::move(*started);
            else
              refused = started.status();
          }
          if (!refused.ok()) {
            refuse("FdChannel.OpenRing", refused);
            reply(socket, Answer(FdChannelKind::kRingOpened, message->request_id, refused));
            if (!connection.session) drop(socket, "");
            break;
          }
          FdChannelMessage opened =
              Answer(FdChannelKind::kRingOpened, message->request_id, Status::Ok());
          opened.value0 = SubmissionRingHeader::kTotalBytes;
          if (Status sent = SendFdChannelMessage(socket, opened, ring->fd()); !sent.ok()) {
            drop(socket, sent.message());
            break;
          }
          connection.ring = std::move(ring);
          connection.ring_claims = std::move(ring_claims);
          sessions_with_ring.insert(connection.session->id);
          LogInfo("submission ring opened", {{"session", connection.label}});
          break;
        }
        case FdChannelKind::kBound:
        case FdChannelKind::kRegistered:
        case FdChannelKind::kRingOpened:
        case FdChannelKind::kCudaVmmRegistered:
        case FdChannelKind::kCudaVmmUnregistered:
          if (fd >= 0) close(fd);
          if (!connection.session) {
            drop(socket, "an answer kind sent before binding");
          } else {
            reply(socket,
                  Answer(FdChannelKind::kRegistered, message->request_id,
                         Status::InvalidArgument("clients send bind, register, register_cuda_vmm "
                                                 "and open_ring, not answers")));
          }
          break;
      }
    }
    // Connections that never bound do not hold a slot for long.
    std::vector<int> late;
    for (const auto& [socket, connection] : connections) {
      if (!connection.session && now - connection.accepted > options_.bind_deadline) {
        late.push_back(socket);
      }
    }
    for (int socket : late) drop(socket, "it did not bind to a session in time");
  }
  for (const auto& [socket, connection] : connections) close(socket);
}

}  // namespace collectived
