#include "engine/group/transport/socket/socket_mesh.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/vocabulary/errno_message.h"

namespace collectived {
namespace {

constexpr uint32_t kFrameMagic = 0x43444d31;  // "CDM1"
// The largest control message a peer may announce: the allgathers of an op's agreement are a
// few hundred bytes per rank (alltoall counts: 16 bytes per pair of ranks).
constexpr uint64_t kMaxControlBytes = uint64_t{1} << 30;
// How long a connection opened on first use may take (the transfer's own deadline is the
// group's, which fails it sooner if that comes first).
constexpr auto kFirstUseConnectBudget = std::chrono::seconds(30);

enum FrameType : uint32_t {
  kControl = 1,      // a round's parts of a control allgather; `tag` is the op's control tag
  kClearToSend = 2,  // the receiver of `key` posted a buffer of `bytes`: send them
  kData = 3,         // `bytes` bytes of `key`, cleared before
};

struct FrameHeader {
  uint32_t type = 0;
  uint32_t check = 0;  // type ^ kFrameMagic
  int32_t source = 0;  // P2PKey (control frames: the allgather's round)
  int32_t destination = 0;
  int64_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(FrameHeader) == 32);

std::shared_ptr<std::vector<std::byte>> HeaderBytes(FrameType type, const P2PKey& key, int64_t tag,
                                                    uint64_t bytes, const void* payload = nullptr,
                                                    size_t payload_bytes = 0) {
  FrameHeader header{type, type ^ kFrameMagic, key.source, key.destination, tag, bytes};
  auto storage = std::make_shared<std::vector<std::byte>>(sizeof(header) + payload_bytes);
  std::memcpy(storage->data(), &header, sizeof(header));
  if (payload_bytes > 0) std::memcpy(storage->data() + sizeof(header), payload, payload_bytes);
  return storage;
}

std::string DescribeKey(const P2PKey& key) {
  return "rank " + std::to_string(key.source) + " to rank " + std::to_string(key.destination) +
         ", tag " + std::to_string(key.tag);
}

}  // namespace

struct SocketMesh::OutChunk {
  std::shared_ptr<std::vector<std::byte>> storage;  // owns `data` when set
  const std::byte* data = nullptr;
  size_t size = 0;
  size_t sent = 0;
  Done on_sent;  // once the last byte went out (a send's completion)
};

struct SocketMesh::Transfer {
  std::byte* data = nullptr;
  size_t bytes = 0;
  Done done;
};

struct SocketMesh::Peer {
  int node = 0;
  int fd = -1;
  Status broken;  // PeerLost once the connection broke or was closed
  bool watched = false;
  std::deque<OutChunk> out;
  bool want_write = false;
  // The frame being read: its header, then its payload.
  FrameHeader header;
  size_t header_got = 0;
  bool in_payload = false;
  std::byte* payload = nullptr;
  size_t payload_got = 0;
  std::vector<std::byte> control;                     // a control frame's payload
  std::optional<Transfer> receiving;                  // a data frame's receive
  bool connecting = false;                            // a connection on first use is being opened
  std::map<P2PKey, std::deque<Transfer>> sends;       // waiting to be cleared
  std::map<P2PKey, std::deque<uint64_t>> clearances;  // cleared before their send started
  std::map<P2PKey, std::deque<Transfer>> recvs;       // cleared, waiting for the bytes
};

struct SocketMesh::Fired {
  explicit Fired(std::atomic<int>* due) : due(due) {}
  std::atomic<int>* const due;  // the mesh's count of callbacks not yet returned
  std::vector<std::pair<Done, Status>> callbacks;
  std::vector<int> unwatch;  // descriptors of broken connections

  void Add(Done done, Status status) {
    if (!done) return;
    due->fetch_add(1);
    callbacks.emplace_back(std::move(done), std::move(status));
  }
};

StatusOr<std::shared_ptr<SocketMesh>> SocketMesh::Start(std::string group, int node_rank,
                                                        MeshConnections connections,
                                                        Runtime& runtime) {
  std::shared_ptr<SocketMesh> mesh(
      new SocketMesh(std::move(group), node_rank, std::move(connections), runtime));
  for (auto& peer : mesh->peers_) {
    if (peer->fd < 0) continue;
    COLLECTIVED_RETURN_IF_ERROR(mesh->Watch(peer->node));
  }
  if (mesh->handshake_) {
    {
      std::lock_guard<std::mutex> lock(mesh->mutex_);
      mesh->listening_ = true;
    }
    std::weak_ptr<SocketMesh> weak = mesh;
    Status watched =
        runtime.reactor().Watch(mesh->handshake_->listener(), EPOLLIN, [weak](uint32_t) {
          if (std::shared_ptr<SocketMesh> self = weak.lock()) self->OnListenerReadable();
        });
    if (!watched.ok()) {
      std::lock_guard<std::mutex> lock(mesh->mutex_);
      mesh->listening_ = false;
      return watched.WithContext("group '" + mesh->group_ + "'");
    }
  }
  return mesh;
}

SocketMesh::SocketMesh(std::string group, int node_rank, MeshConnections connections,
                       Runtime& runtime)
    : group_(std::move(group)),
      closed_status_(Status::PeerLost("the connections of group '" + group_ + "' were closed")),
      node_rank_(node_rank),
      node_count_(static_cast<int>(connections.fds.size())),
      reactor_(runtime.reactor()),
      executor_(runtime.executor()),
      clock_(runtime.clock()),
      handshake_(std::move(connections.handshake)),
      exchange_(group_, node_rank, node_count_) {
  for (size_t node = 0; node < connections.fds.size(); ++node) {
    peers_.push_back(std::make_unique<Peer>());
    peers_[node]->node = static_cast<int>(node);
    peers_[node]->fd = connections.fds[node];
  }
}

SocketMesh::~SocketMesh() {
  if (listening_) reactor_.Unwatch(handshake_->listener());
  for (auto& peer : peers_) {
    if (peer->fd < 0) continue;
    reactor_.Unwatch(peer->fd);
    close(peer->fd);
  }
}

Status SocketMesh::Watch(int node) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_[node]->watched = true;
    fd = peers_[node]->fd;
  }
  Status watched = reactor_.Watch(fd, EPOLLIN, EventsOf(node));
  if (!watched.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_[node]->watched = false;
    return watched.WithContext("group '" + group_ + "'");
  }
  return Status::Ok();
}

Reactor::Handler SocketMesh::EventsOf(int node) {
  return [weak = weak_from_this(), node](uint32_t events) {
    if (std::shared_ptr<SocketMesh> self = weak.lock()) self->OnEvents(node, events);
  };
}

int SocketMesh::connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int connected = 0;
  for (const auto& peer : peers_) connected += peer->fd >= 0 ? 1 : 0;
  return connected;
}

// ---- connections opened on first use ---------------------------------------------------

void SocketMesh::ConnectOnFirstUseLocked(Peer& peer) {
  if (peer.fd >= 0 || peer.connecting || !peer.broken.ok() || !handshake_) return;
  peer.connecting = true;
  if (peer.node > node_rank_) return;  // it dials this node's listener
  const int node = peer.node;
  executor_.Post([weak = weak_from_this(), handshake = handshake_, clock = &clock_, node] {
    Executor::Blocking blocking;
    StatusOr<int> fd = handshake->Dial(node, clock->After(kFirstUseConnectBudget));
    std::shared_ptr<SocketMesh> self = weak.lock();
    if (!self) {
      if (fd.ok()) close(*fd);
      return;
    }
    if (fd.ok()) {
      self->Adopt(node, *fd);
    } else {
      self->FailConnect(node, fd.status());
    }
  });
}

void SocketMesh::OnListenerReadable() {
  for (;;) {
    const int fd = accept4(handshake_->listener(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or a connection that went before it was taken
    executor_.Post([weak = weak_from_this(), handshake = handshake_, clock = &clock_, fd] {
      Executor::Blocking blocking;
      StatusOr<int> node = handshake->Answer(fd, clock->After(kFirstUseConnectBudget));
      std::shared_ptr<SocketMesh> self = weak.lock();
      if (!node.ok() || !self) {
        close(fd);  // not one of the group's sidecars, or a dialler that went
        return;
      }
      self->Adopt(*node, fd);
    });
  }
}

void SocketMesh::Adopt(int node, int fd) {
  auto unusable = [&] {  // already connected (a duplicate dial), or the mesh or peer is done for
    const Peer& peer = *peers_[node];
    return closed_ || peer.fd >= 0 || !peer.broken.ok();
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (unusable()) {
      close(fd);
      return;
    }
  }
  // Watched before the peer names it: until then its events find no connection, and
  // level-triggered epoll reports them again.
  Status watched = reactor_.Watch(fd, EPOLLIN, EventsOf(node));
  if (!watched.ok()) {
    close(fd);
    FailConnect(node, watched.WithContext("group '" + group_ + "'"));
    return;
  }
  Fired fired(&callbacks_due_);
  bool taken = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!unusable()) {
      taken = true;
      Peer& peer = *peers_[node];
      peer.fd = fd;
      peer.watched = true;
      peer.connecting = false;
      FlushLocked(peer, fired);  // what waited for the connection
      ReadLocked(peer, fired);
    } else {
      fired.unwatch.push_back(fd);
    }
  }
  Run(fired);
  if (!taken) close(fd);
}

void SocketMesh::FailConnect(int node, const Status& why) {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    BreakLocked(*peers_[node], why.message(), fired);
  }
  Run(fired);
}

Status SocketMesh::BrokenStatus(const Peer& peer, const std::string& why) const {
  if (closed_) return closed_status_;
  return Status::PeerLost("the connection to sidecar node " + std::to_string(peer.node) +
                          " of group '" + group_ + "' broke: " + why);
}

void SocketMesh::Run(Fired& fired) {
  for (int fd : fired.unwatch) reactor_.Unwatch(fd);
  for (auto& [done, status] : fired.callbacks) {
    done(status);
    done = nullptr;  // what it holds goes before the transfer counts as finished
    callbacks_due_.fetch_sub(1);
  }
}

void SocketMesh::OnEvents(int node, uint32_t events) {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Peer& peer = *peers_[node];
    if (events & EPOLLOUT) FlushLocked(peer, fired);
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ReadLocked(peer, fired);
  }
  Run(fired);
}

// ---- writing ---------------------------------------------------------------------------

void SocketMesh::FlushLocked(Peer& peer, Fired& fired) {
  constexpr int kMaxChunks = 16;
  if (peer.fd < 0) return;  // not connected yet: it goes once the connection is there
  while (!peer.out.empty() && peer.broken.ok()) {
    iovec iov[kMaxChunks];
    int chunks = 0;
    for (const OutChunk& chunk : peer.out) {
      if (chunks == kMaxChunks) break;
      iov[chunks++] =
          iovec{const_cast<std::byte*>(chunk.data) + chunk.sent, chunk.size - chunk.sent};
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = static_cast<size_t>(chunks);
    const ssize_t sent = sendmsg(peer.fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      BreakLocked(peer, ErrnoMessage("send"), fired);
      return;
    }
    for (size_t left = static_cast<size_t>(sent); left > 0;) {
      OutChunk& chunk = peer.out.front();
      const size_t taken = std::min(left, chunk.size - chunk.sent);
      chunk.sent += taken;
      left -= taken;
      if (chunk.sent == chunk.size) {
        fired.Add(std::move(chunk.on_sent), Status::Ok());
        peer.out.pop_front();
      }
    }
  }
  const bool want_write = !peer.out.empty() && peer.broken.ok();
  if (want_write != peer.want_write && peer.watched) {
    peer.want_write = want_write;
    reactor_.Update(peer.fd, EPOLLIN | (want_write ? EPOLLOUT : 0u));
  }
}

// ---- reading ---------------------------------------------------------------------------

void SocketMesh::ReadLocked(Peer& peer, Fired& fired) {
  while (peer.broken.ok() && peer.fd >= 0) {
    std::byte* into;
    size_t wanted;
    if (!peer.in_payload) {
      into = reinterpret_cast<std::byte*>(&peer.header) + peer.header_got;
      wanted = sizeof(FrameHeader) - peer.header_got;
    } else {
      into = peer.payload + peer.payload_got;
      wanted = peer.header.bytes - peer.payload_got;
    }
    const ssize_t got = recv(peer.fd, into, wanted, MSG_DONTWAIT);
    if (got == 0) {
      BreakLocked(peer, "the connection closed", fired);
      return;
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      BreakLocked(peer, ErrnoMessage("recv"), fired);
      return;
    }
    if (!peer.in_payload) {
      peer.header_got += static_cast<size_t>(got);
      if (peer.header_got == sizeof(FrameHeader)) OnHeaderLocked(peer, fired);
    } else {
      peer.payload_got += static_cast<size_t>(got);
      if (peer.payload_got == peer.header.bytes) OnPayloadLocked(peer, fired);
    }
  }
}

void SocketMesh::OnHeaderLocked(Peer& peer, Fired& fired) {
  const FrameHeader& header = peer.header;
  peer.header_got = 0;
  if ((header.type ^ kFrameMagic) != header.check) {
    BreakLocked(peer, "a message without valid framing arrived", fired);
    return;
  }
  const P2PKey key{header.source, header.destination, header.tag};
  switch (header.type) {
    case kControl:
      if (header.bytes > kMaxControlBytes) {
        BreakLocked(peer, "a control message of " + std::to_string(header.bytes) + " bytes", fired);
        return;
      }
      peer.control.assign(header.bytes, std::byte{0});
      peer.payload = peer.control.data();
      break;
    case kClearToSend: {
      auto sends = peer.sends.find(key);
      if (sends == peer.sends.end()) {
        peer.clearances[key].push_back(header.bytes);
        return;
      }
      Transfer send = std::move(sends->second.front());
      sends->second.pop_front();
      if (sends->second.empty()) peer.sends.erase(sends);
      SendDataLocked(peer, key, std::move(send), header.bytes, fired);
      return;
    }
    case kData: {
      auto recvs = peer.recvs.find(key);
      if (recvs == peer.recvs.end() || recvs->second.front().bytes != header.bytes) {
        BreakLocked(peer, "bytes of " + DescribeKey(key) + " arrived that no receive cleared",
                    fired);
        return;
      }
      peer.receiving = std::move(recvs->second.front());
      recvs->second.pop_front();
      if (recvs->second.empty()) peer.recvs.erase(recvs);
      peer.payload = peer.receiving->data;
      break;
    }
    default:
      BreakLocked(peer, "a message of unknown type " + std::to_string(header.type), fired);
      return;
  }
  peer.payload_got = 0;
  peer.in_payload = true;
  if (header.bytes == 0) OnPayloadLocked(peer, fired);
}

void SocketMesh::OnPayloadLocked(Peer& peer, Fired& fired) {
  peer.in_payload = false;
  if (peer.header.type == kControl) {
    ControlExchange::Effects effects;
    exchange_.Deliver(peer.node,
                      ControlMessage{static_cast<uint32_t>(peer.header.tag), peer.header.source,
                                     std::move(peer.control)},
                      effects);
    peer.control.clear();
    ApplyLocked(effects, fired);
    return;
  }
  fired.Add(std::move(peer.receiving->done), Status::Ok());
  peer.receiving.reset();
}

// ---- failures --------------------------------------------------------------------------

void SocketMesh::BreakLocked(Peer& peer, const std::string& why, Fired& fired) {
  if (!peer.broken.ok() || peer.node == node_rank_) return;
  peer.broken = BrokenStatus(peer, why);
  // A peer never connected to only fails what waited for its connection.
  if (!closed_ && broken_handler_ && (peer.fd >= 0 || peer.connecting)) {
    fired.Add(std::exchange(broken_handler_, nullptr), peer.broken);
  }
  // Level-triggered epoll would report the hang-up again and again: stop watching (outside the
  // lock, since a running handler may be waiting for it) and wake the peer at once.
  if (peer.fd >= 0) shutdown(peer.fd, SHUT_RDWR);
  if (peer.watched) {
    peer.watched = false;
    fired.unwatch.push_back(peer.fd);
  }
  const Status& status = peer.broken;
  for (OutChunk& chunk : peer.out) fired.Add(std::move(chunk.on_sent), status);
  peer.out.clear();
  for (auto* transfers : {&peer.sends, &peer.recvs}) {
    for (auto& [key, queue] : *transfers) {
      for (Transfer& transfer : queue) fired.Add(std::move(transfer.done), status);
    }
    transfers->clear();
  }
  peer.clearances.clear();
  if (peer.receiving) fired.Add(std::move(peer.receiving->done), status);
  peer.receiving.reset();
  ControlExchange::Effects effects;
  exchange_.Break(peer.node, status, effects);
  ApplyLocked(effects, fired);
}

void SocketMesh::Close() {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    if (listening_) {
      listening_ = false;
      fired.unwatch.push_back(handshake_->listener());
    }
    ControlExchange::Effects effects;
    exchange_.Close(closed_status_, effects);
    ApplyLocked(effects, fired);
    for (auto& peer : peers_) BreakLocked(*peer, "closed", fired);
  }
  Run(fired);
}

void SocketMesh::SetBrokenHandler(Done handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  broken_handler_ = std::move(handler);
}

// ---- the control exchange --------------------------------------------------------------

void SocketMesh::StartAllGather(const void* in, void* out, std::vector<size_t> bytes_per_node,
                                uint32_t tag, Done done) {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ControlExchange::Effects effects;
    exchange_.StartAllGather(in, out, std::move(bytes_per_node), tag, std::move(done), effects);
    ApplyLocked(effects, fired);
  }
  Run(fired);
}

void SocketMesh::StartAllReduce(const void* in, void* out, size_t bytes, Combine combine,
                                uint32_t tag, Done done) {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ControlExchange::Effects effects;
    exchange_.StartAllReduce(in, out, bytes, std::move(combine), tag, std::move(done), effects);
    ApplyLocked(effects, fired);
  }
  Run(fired);
}

void SocketMesh::ApplyLocked(ControlExchange::Effects& effects, Fired& fired) {
  for (auto& [node, message] : effects.posts) {
    Peer& peer = *peers_[node];
    if (!peer.broken.ok()) continue;  // the exchange that needs it has failed already
    auto header =
        HeaderBytes(kControl, P2PKey{message.round, 0, 0}, message.tag, message.bytes.size());
    peer.out.push_back(OutChunk{header, header->data(), header->size(), 0, nullptr});
    if (!message.bytes.empty()) {
      auto payload = std::make_shared<std::vector<std::byte>>(std::move(message.bytes));
      peer.out.push_back(OutChunk{payload, payload->data(), payload->size(), 0, nullptr});
    }
    FlushLocked(peer, fired);
  }
  for (auto& [done, status] : effects.callbacks) fired.Add(std::move(done), std::move(status));
}

std::vector<int> SocketMesh::AwaitedNodes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exchange_.AwaitedNodes();
}

// ---- point to point --------------------------------------------------------------------

void SocketMesh::SendDataLocked(Peer& peer, const P2PKey& key, Transfer send, uint64_t cleared,
                                Fired& fired) {
  if (cleared != send.bytes) {
    // Both ends size a message from its envelope: a difference is a bug, not bad input.
    fired.Add(std::move(send.done),
              Status::Internal("group '" + group_ + "': the receiver of " + DescribeKey(key) +
                               " cleared " + std::to_string(cleared) + " bytes for a send of " +
                               std::to_string(send.bytes)));
    return;
  }
  auto header = HeaderBytes(kData, key, key.tag, send.bytes);
  if (send.bytes == 0) {
    peer.out.push_back(OutChunk{header, header->data(), header->size(), 0, std::move(send.done)});
  } else {
    peer.out.push_back(OutChunk{header, header->data(), header->size(), 0, nullptr});
    peer.out.push_back(OutChunk{nullptr, send.data, send.bytes, 0, std::move(send.done)});
  }
  FlushLocked(peer, fired);
}

void SocketMesh::StartSend(const void* data, size_t bytes, int node, const P2PKey& key, Done done) {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (node < 0 || node >= node_count() || node == node_rank_) {
      fired.Add(std::move(done), Status::Internal("send to sidecar node " + std::to_string(node) +
                                                  " of group '" + group_ + "'"));
    } else if (Peer& peer = *peers_[node]; !peer.broken.ok()) {
      fired.Add(std::move(done), peer.broken);
    } else {
      ConnectOnFirstUseLocked(peer);
      Transfer send{static_cast<std::byte*>(const_cast<void*>(data)), bytes, std::move(done)};
      auto cleared = peer.clearances.find(key);
      if (cleared == peer.clearances.end()) {
        peer.sends[key].push_back(std::move(send));
      } else {
        const uint64_t clearance = cleared->second.front();
        cleared->second.pop_front();
        if (cleared->second.empty()) peer.clearances.erase(cleared);
        SendDataLocked(peer, key, std::move(send), clearance, fired);
      }
    }
  }
  Run(fired);
}

void SocketMesh::StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) {
  Fired fired(&callbacks_due_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (node < 0 || node >= node_count() || node == node_rank_) {
      fired.Add(std::move(done),
                Status::Internal("receive from sidecar node " + std::to_string(node) +
                                 " of group '" + group_ + "'"));
    } else if (Peer& peer = *peers_[node]; !peer.broken.ok()) {
      fired.Add(std::move(done), peer.broken);
    } else {
      ConnectOnFirstUseLocked(peer);
      peer.recvs[key].push_back(Transfer{static_cast<std::byte*>(data), bytes, std::move(done)});
      auto frame = HeaderBytes(kClearToSend, key, key.tag, bytes);
      peer.out.push_back(OutChunk{frame, frame->data(), frame->size(), 0, nullptr});
      FlushLocked(peer, fired);
    }
  }
  Run(fired);
}

bool SocketMesh::Idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (callbacks_due_.load() != 0) return false;
  for (const auto& each : peers_) {
    const Peer& peer = *each;
    if (!peer.sends.empty() || !peer.recvs.empty() || peer.receiving) return false;
    for (const OutChunk& chunk : peer.out) {
      if (chunk.on_sent) return false;
    }
  }
  return true;
}

}  // namespace collectived
