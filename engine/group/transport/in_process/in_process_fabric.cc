#include "engine/group/transport/in_process/in_process_fabric.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "engine/concurrency/executor.h"
#include "engine/group/core/topology.h"
#include "engine/group/transport/in_process/in_process_backend.h"
#include "engine/group/transport/in_process/in_process_control_channel.h"
#include "engine/group/transport/in_process/in_process_device_backend.h"
#include "engine/vocabulary/work.h"

namespace collectived {

using std::chrono::milliseconds;

// A control message, or the break of a connection (no message), for a node's receiver.
struct InProcessFabric::ControlDelivery {
  int from = 0;
  std::optional<ControlMessage> message;
  Status broken;
};

struct InProcessFabric::Node {
  bool joined = false;
  std::string closed;  // why its connections closed; empty while open
  milliseconds delay{0};
  int outstanding = 0;  // transfers started here whose `done` has not returned
  // The simulated device: each op's completion comes this late, and only while allowed
  // (-1: without limit; n >= 0: n more).
  milliseconds device_delay{0};
  int device_completions_allowed = -1;
  bool device_refuses_signals = false;  // RefuseStreamSignals
  int launches_until_failure = -1;      // FailDeviceCall: -1 none
  Status launch_failure;
  size_t completion_event_ring = 64;  // SetCompletionEventRing
  DeviceWatches watches;
  int device_calls_on_transport_thread = 0;
  InProcessLink::ControlReceiver control_receiver;
  std::deque<ControlDelivery> control_inbox;  // not yet handed to the receiver
};

struct InProcessFabric::Session {
  std::string group;
  int node_count = 0;
  int joined = 0;
  bool formed = false;
  std::vector<Node> nodes;
  // Collective and control messages by (source node, destination node, tag).
  std::map<std::tuple<int, int, uint32_t>, std::deque<std::vector<std::byte>>> mail;
  // Pending point-to-point transfers (ids into transfers_) by (source, destination, user tag).
  std::map<P2PKey, std::deque<uint64_t>> sends, recvs;
};

struct InProcessFabric::Transfer {
  std::shared_ptr<Session> session;
  bool is_send = false;
  int owner = 0;  // the node that started it
  int peer = 0;
  P2PKey key;
  void* data = nullptr;
  size_t bytes = 0;
  DataBackend::Done done;
};

struct InProcessFabric::Delayed {
  std::shared_ptr<Session> session;
  int node = 0;
  std::function<void()> fn;
};

struct InProcessFabric::Completion {
  std::shared_ptr<Session> session;
  int owner = 0;
  DataBackend::Done done;
  Status status;
};

namespace {

// Whether this thread is a fabric's worker (where transfers complete).
thread_local bool on_worker = false;

std::string DescribeTransfer(bool is_send, int peer, const P2PKey& key) {
  return std::string(is_send ? "send to" : "receive from") + " sidecar node " +
         std::to_string(peer) + " (rank " + std::to_string(key.source) + " to rank " +
         std::to_string(key.destination) + ", tag " + std::to_string(key.tag) + ")";
}

}  // namespace

std::shared_ptr<InProcessFabric> InProcessFabric::Create(Clock& clock) {
  return std::shared_ptr<InProcessFabric>(new InProcessFabric(clock));
}

InProcessFabric::InProcessFabric(Clock& clock) : clock_(clock) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

InProcessFabric::~InProcessFabric() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, transfer] : transfers_) {
      PostLocked({transfer.session, transfer.owner, std::move(transfer.done),
                  Status::Aborted("the in-process fabric was destroyed")});
    }
    transfers_.clear();
    delayed_.clear();
    stopping_ = true;
  }
  worker_wakeup_.notify_all();
  // The last link may be dropped by a `done` callback, on the worker itself.
  if (worker_.get_id() == std::this_thread::get_id()) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

Status InProcessFabric::CheckDevice(const std::string&, DeviceKind) const {
  return Status::Ok();  // host memory, and the simulated device for cuda
}

StatusOr<GroupTransport> InProcessFabric::Connect(const ConnectRequest& request) {
  const GroupTopology& topology = request.topology;
  COLLECTIVED_RETURN_IF_ERROR(CheckDevice(request.group, request.device));
  const int count = topology.node_count();
  const int me = topology.my_node;
  std::string key = request.group;
  if (request.store) {
    // The store is scoped to this incarnation: the first node's proposal names the session.
    std::string proposal = std::to_string(reinterpret_cast<uintptr_t>(this)) + "/";
    {
      std::lock_guard<std::mutex> lock(mutex_);
      proposal += std::to_string(next_session_id_++);
    }
    StatusOr<std::string> agreed =
        request.store->CompareSet("in_process_fabric/session", "", proposal);
    if (!agreed.ok()) {
      return Status::Unavailable("group '" + request.group +
                                 "': no in-process session id: " + agreed.status().message());
    }
    key += "/" + *agreed;
  }

  std::shared_ptr<Session> session;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    std::shared_ptr<Session>& slot = forming_[key];
    if (!slot) {
      slot = std::make_shared<Session>();
      slot->group = request.group;
      slot->node_count = count;
      slot->nodes.resize(count);
    }
    session = slot;
    if (session->node_count != count) {
      return Status::InvalidArgument("group '" + request.group + "': node " + std::to_string(me) +
                                     " expects " + std::to_string(count) +
                                     " sidecars but the session has " +
                                     std::to_string(session->node_count));
    }
    if (session->nodes[me].joined) {
      return Status::InvalidArgument("group '" + request.group + "': sidecar node " +
                                     std::to_string(me) + " connected twice");
    }
    session->nodes[me].joined = true;
    if (++session->joined == count) {
      session->formed = true;
      forming_.erase(key);
      latest_[request.group] = session;
      changed_.notify_all();
    } else {
      const Clock::TimePoint deadline =
          request.timeout.count() > 0 ? clock_.After(request.timeout) : Clock::TimePoint::max();
      clock_.WaitUntil(changed_, lock, deadline, [&] { return session->formed; });
      if (!session->formed) {
        std::vector<int> missing;
        for (int node = 0; node < count; ++node) {
          if (!session->nodes[node].joined) missing.push_back(node);
        }
        session->nodes[me].joined = false;
        if (--session->joined == 0) forming_.erase(key);
        return Status::Unavailable("group '" + request.group + "': sidecar nodes " +
                                   FormatRanks(missing) + " never connected within " +
                                   std::to_string(request.timeout.count()) + " ms");
      }
    }
  }
  auto link = std::make_shared<InProcessLink>(shared_from_this(), session, me);
  GroupTransport transport;
  transport.control = std::make_unique<InProcessControlChannel>(link);
  if (count > 1) transport.transfers = link;
  if (request.device == DeviceKind::kCuda) {
    transport.data = std::make_unique<InProcessDeviceBackend>(link);
  } else {
    transport.data = std::make_unique<InProcessBackend>(link);
  }
  return transport;
}

std::shared_ptr<InProcessFabric::Session> InProcessFabric::LatestLocked(
    const std::string& group) const {
  auto it = latest_.find(group);
  return it == latest_.end() ? nullptr : it->second.lock();
}

StatusOr<std::shared_ptr<InProcessFabric::Session>> InProcessFabric::NodeSessionLocked(
    const std::string& group, int node) const {
  std::shared_ptr<Session> session = LatestLocked(group);
  if (!session) return Status::NotFound("no in-process session of group '" + group + "'");
  if (node < 0 || node >= session->node_count) {
    return Status::InvalidArgument("group '" + group + "' has no sidecar node " +
                                   std::to_string(node));
  }
  return session;
}

Status InProcessFabric::KillNode(const std::string& group, int node) {
  std::lock_guard<std::mutex> lock(mutex_);
  StatusOr<std::shared_ptr<Session>> session = NodeSessionLocked(group, node);
  if (!session.ok()) return session.status();
  CloseLocked(*session, node, "sidecar node " + std::to_string(node) + " was killed");
  return Status::Ok();
}

void InProcessFabric::SetLinkLatency(milliseconds latency) {
  std::lock_guard<std::mutex> lock(mutex_);
  link_latency_ = latency;
}

Status InProcessFabric::DelayNode(const std::string& group, int node, milliseconds delay) {
  return ChangeNode(group, node, [delay](Node& n) { n.delay = delay; });
}

Status InProcessFabric::ChangeNode(const std::string& group, int node,
                                   const std::function<void(Node&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  StatusOr<std::shared_ptr<Session>> session = NodeSessionLocked(group, node);
  if (!session.ok()) return session.status();
  change((*session)->nodes[node]);
  changed_.notify_all();
  return Status::Ok();
}

Status InProcessFabric::SetDeviceDelay(const std::string& group, int node, milliseconds delay) {
  return ChangeNode(group, node, [delay](Node& n) { n.device_delay = delay; });
}

Status InProcessFabric::HoldDevice(const std::string& group, int node) {
  return ChangeNode(group, node, [](Node& n) { n.device_completions_allowed = 0; });
}

Status InProcessFabric::AllowDeviceCompletions(const std::string& group, int node, int count) {
  return ChangeNode(group, node, [count](Node& n) {
    if (n.device_completions_allowed >= 0) n.device_completions_allowed += count;
  });
}

Status InProcessFabric::ReleaseDevice(const std::string& group, int node) {
  return ChangeNode(group, node, [](Node& n) { n.device_completions_allowed = -1; });
}

Status InProcessFabric::RefuseStreamSignals(const std::string& group, int node) {
  return ChangeNode(group, node, [](Node& n) { n.device_refuses_signals = true; });
}

Status InProcessFabric::FailDeviceCall(const std::string& group, int node, int after,
                                       Status failure) {
  return ChangeNode(group, node, [after, &failure](Node& n) {
    n.launches_until_failure = std::max(after, 0);
    n.launch_failure = failure;
  });
}

Status InProcessFabric::SetCompletionEventRing(const std::string& group, int node, size_t size) {
  return ChangeNode(group, node,
                    [size](Node& n) { n.completion_event_ring = std::max<size_t>(1, size); });
}

StatusOr<InProcessFabric::DeviceWatches> InProcessFabric::DeviceWatchesOf(const std::string& group,
                                                                          int node) const {
  std::lock_guard<std::mutex> lock(mutex_);
  StatusOr<std::shared_ptr<Session>> session = NodeSessionLocked(group, node);
  if (!session.ok()) return session.status();
  return (*session)->nodes[node].watches;
}

StatusOr<int> InProcessFabric::DeviceCallsOnTransportThread(const std::string& group,
                                                            int node) const {
  std::lock_guard<std::mutex> lock(mutex_);
  StatusOr<std::shared_ptr<Session>> session = NodeSessionLocked(group, node);
  if (!session.ok()) return session.status();
  return (*session)->nodes[node].device_calls_on_transport_thread;
}

void InProcessFabric::CloseLocked(const std::shared_ptr<Session>& session, int node,
                                  const std::string& reason) {
  if (!session->nodes[node].closed.empty()) return;
  session->nodes[node].closed = reason;
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    Transfer& t = it->second;
    if (t.session != session || (t.owner != node && t.peer != node)) {
      ++it;
      continue;
    }
    auto& pending = t.is_send ? session->sends : session->recvs;
    if (auto queue = pending.find(t.key); queue != pending.end()) {
      std::erase(queue->second, it->first);
      if (queue->second.empty()) pending.erase(queue);
    }
    PostLocked({t.session, t.owner, std::move(t.done),
                Status::PeerLost("group '" + session->group +
                                 "': " + DescribeTransfer(t.is_send, t.peer, t.key) +
                                 ": the connection closed (" + reason + ")")});
    it = transfers_.erase(it);
  }
  // Every control receiver hears of it after what already arrived; the closed node's drops
  // what it had not taken yet.
  for (int peer = 0; peer < session->node_count; ++peer) {
    if (peer == node) continue;
    QueueControlLocked(
        session, peer,
        ControlDelivery{
            node, std::nullopt,
            Status::PeerLost("group '" + session->group + "': the connection to sidecar node " +
                             std::to_string(node) + " closed (" + reason + ")")});
  }
  session->nodes[node].control_inbox.clear();
  QueueControlLocked(
      session, node,
      ControlDelivery{
          node, std::nullopt,
          Status::PeerLost("group '" + session->group + "': the connections of sidecar node " +
                           std::to_string(node) + " are closed (" + reason + ")")});
  // The closed node's delayed starts run at once (and fail).
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    if (it->second.session != session || it->second.node != node) {
      ++it;
      continue;
    }
    auto entry = delayed_.extract(it++);
    entry.key() = Clock::TimePoint::min();
    delayed_.insert(std::move(entry));
  }
  changed_.notify_all();
  WakeWorkerLocked();
}

void InProcessFabric::QueueControlLocked(const std::shared_ptr<Session>& session, int node,
                                         ControlDelivery delivery) {
  session->nodes[node].control_inbox.push_back(std::move(delivery));
  delayed_.emplace(Clock::TimePoint::min(),
                   Delayed{session, -1, [this, session, node] { DrainControl(session, node); }});
  WakeWorkerLocked();
}

void InProcessFabric::ArriveLocked(const std::shared_ptr<Session>& session, int node,
                                   ControlDelivery delivery) {
  if (link_latency_.count() == 0) {
    QueueControlLocked(session, node, std::move(delivery));
    return;
  }
  // On the wire for the link's latency; a close that follows arrives after it, as a socket's
  // end of stream comes after the bytes sent before it.
  delayed_.emplace(
      clock_.After(link_latency_),
      Delayed{session, -1, [this, session, node, delivery = std::move(delivery)]() mutable {
                std::lock_guard<std::mutex> lock(mutex_);
                if (delivery.message && !session->nodes[node].closed.empty()) return;
                QueueControlLocked(session, node, std::move(delivery));
              }});
  WakeWorkerLocked();
}

void InProcessFabric::DrainControl(const std::shared_ptr<Session>& session, int node) {
  std::unique_lock<std::mutex> lock(mutex_);
  Node& me = session->nodes[node];
  while (!me.control_inbox.empty() && me.control_receiver.on_message) {
    ControlDelivery delivery = std::move(me.control_inbox.front());
    me.control_inbox.pop_front();
    InProcessLink::ControlReceiver receiver = me.control_receiver;
    lock.unlock();
    if (delivery.message) {
      receiver.on_message(delivery.from, std::move(*delivery.message));
    } else {
      receiver.on_broken(delivery.from, delivery.broken);
    }
    receiver = {};  // drops what it holds outside the lock
    lock.lock();
  }
}

void InProcessFabric::PostLocked(Completion completion) {
  completions_.push_back(std::move(completion));
  WakeWorkerLocked();
}

void InProcessFabric::WakeWorkerLocked() {
  ++worker_wakeups_;
  worker_wakeup_.notify_all();
}

void InProcessFabric::WorkerLoop() {
  on_worker = true;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (!completions_.empty()) {
      Completion c = std::move(completions_.front());
      completions_.pop_front();
      lock.unlock();
      c.done(c.status);
      c.done = nullptr;  // drops what the callback held, outside the lock
      lock.lock();
      --c.session->nodes[c.owner].outstanding;
      continue;
    }
    if (stopping_) break;
    if (!delayed_.empty() && delayed_.begin()->first <= clock_.Now()) {
      std::function<void()> fn = std::move(delayed_.begin()->second.fn);
      delayed_.erase(delayed_.begin());
      lock.unlock();
      fn();
      fn = nullptr;
      lock.lock();
      continue;
    }
    // Until the earliest delayed call is due (a copy: the entry may be erased meanwhile), or
    // anything else changes.
    const Clock::TimePoint due =
        delayed_.empty() ? Clock::TimePoint::max() : delayed_.begin()->first;
    const uint64_t wakeups = worker_wakeups_;
    clock_.WaitUntil(worker_wakeup_, lock, due,
                     [&] { return worker_wakeups_ != wakeups || stopping_; });
  }
}

InProcessLink::InProcessLink(std::shared_ptr<InProcessFabric> fabric,
                             std::shared_ptr<InProcessFabric::Session> session, int node)
    : fabric_(std::move(fabric)), session_(std::move(session)), node_(node) {}

Clock& InProcessLink::clock() const {
  return fabric_->clock_;
}

int InProcessLink::node_count() const {
  return session_->node_count;
}

const std::string& InProcessLink::group() const {
  return session_->group;
}

Status InProcessLink::BrokenLocked(int peer, std::string_view what) const {
  const std::string& mine = session_->nodes[node_].closed;
  if (!mine.empty()) {
    return Status::PeerLost(std::string(what) + " on group '" + session_->group +
                            "': the connections of sidecar node " + std::to_string(node_) +
                            " are closed (" + mine + ")");
  }
  if (peer >= 0 && !session_->nodes[peer].closed.empty()) {
    return Status::PeerLost(std::string(what) + " on group '" + session_->group +
                            "': the connection to sidecar node " + std::to_string(peer) +
                            " closed (" + session_->nodes[peer].closed + ")");
  }
  return Status::Ok();
}

Status InProcessLink::Send(int to, uint32_t tag, const void* data, size_t bytes,
                           std::string_view what) {
  std::vector<std::byte> message(bytes);
  if (bytes > 0) std::memcpy(message.data(), data, bytes);
  {
    std::lock_guard<std::mutex> lock(fabric_->mutex_);
    COLLECTIVED_RETURN_IF_ERROR(BrokenLocked(to, what));
    session_->mail[{node_, to, tag}].push_back(std::move(message));
  }
  fabric_->changed_.notify_all();
  return Status::Ok();
}

Status InProcessLink::Receive(int from, uint32_t tag, void* data, size_t bytes,
                              Clock::TimePoint deadline, milliseconds timeout,
                              std::string_view what) {
  // Waits for a peer's call, as a transport does: the executor lends a thread meanwhile.
  Executor::Blocking blocking;
  std::unique_lock<std::mutex> lock(fabric_->mutex_);
  const std::tuple<int, int, uint32_t> key{from, node_, tag};
  auto ready = [&] {
    auto it = session_->mail.find(key);
    return (it != session_->mail.end() && !it->second.empty()) ||
           !session_->nodes[node_].closed.empty() || !session_->nodes[from].closed.empty();
  };
  fabric_->clock_.WaitUntil(fabric_->changed_, lock, deadline, ready);
  if (!session_->nodes[node_].closed.empty()) return BrokenLocked(from, what);
  auto it = session_->mail.find(key);
  if (it == session_->mail.end() || it->second.empty()) {
    COLLECTIVED_RETURN_IF_ERROR(BrokenLocked(from, what));
    return Status::Timeout("Timeout in " + std::string(what) + " on group '" + session_->group +
                           "' Timed out after " + std::to_string(timeout.count()) +
                           " ms: sidecar node " + std::to_string(node_) +
                           " got nothing from node " + std::to_string(from));
  }
  std::vector<std::byte> message = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) session_->mail.erase(it);
  lock.unlock();
  if (message.size() != bytes) {
    return Status::Internal(std::string(what) + " on group '" + session_->group +
                            "': sidecar node " + std::to_string(from) + " sent " +
                            std::to_string(message.size()) + " bytes but node " +
                            std::to_string(node_) + " expected " + std::to_string(bytes));
  }
  if (bytes > 0) std::memcpy(data, message.data(), bytes);
  return Status::Ok();
}

Status InProcessLink::AllGatherV(const void* in, void* out,
                                 const std::vector<size_t>& bytes_per_node, uint32_t tag,
                                 milliseconds timeout, std::string_view what) {
  const int count = node_count();
  std::vector<size_t> offsets(count, 0);
  for (int node = 1; node < count; ++node)
    offsets[node] = offsets[node - 1] + bytes_per_node[node - 1];
  auto* bytes_out = static_cast<std::byte*>(out);
  if (count > 1) COLLECTIVED_RETURN_IF_ERROR(Delay(what));
  for (int node = 0; node < count; ++node) {
    if (node != node_)
      COLLECTIVED_RETURN_IF_ERROR(Send(node, tag, in, bytes_per_node[node_], what));
  }
  if (bytes_per_node[node_] > 0 && in != bytes_out + offsets[node_])
    std::memmove(bytes_out + offsets[node_], in, bytes_per_node[node_]);
  const Clock::TimePoint deadline = clock().After(timeout);
  for (int node = 0; node < count; ++node) {
    if (node == node_) continue;
    COLLECTIVED_RETURN_IF_ERROR(Receive(node, tag, bytes_out + offsets[node], bytes_per_node[node],
                                        deadline, timeout, what));
  }
  return Status::Ok();
}

Status InProcessLink::Delay(std::string_view what) {
  Executor::Blocking blocking;
  std::unique_lock<std::mutex> lock(fabric_->mutex_);
  const milliseconds delay = session_->nodes[node_].delay;
  if (delay.count() > 0) {
    fabric_->clock_.WaitUntil(fabric_->changed_, lock, fabric_->clock_.After(delay),
                              [&] { return !session_->nodes[node_].closed.empty(); });
  }
  return BrokenLocked(-1, what);
}

bool InProcessLink::DeviceRefusesSignals() const {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  return session_->nodes[node_].device_refuses_signals;
}

size_t InProcessLink::CompletionEventRing() const {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  return session_->nodes[node_].completion_event_ring;
}

void InProcessLink::CountDeviceWatches(const InProcessFabric::DeviceWatches& more) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  InProcessFabric::DeviceWatches& watches = session_->nodes[node_].watches;
  watches.at_completion_events += more.at_completion_events;
  watches.own += more.own;
  watches.recorded_while_watched += more.recorded_while_watched;
}

void InProcessLink::NoteDeviceCall() {
  if (!on_worker) return;
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  ++session_->nodes[node_].device_calls_on_transport_thread;
}

Status InProcessLink::NextDeviceLaunch() {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  InProcessFabric::Node& me = session_->nodes[node_];
  if (me.launches_until_failure < 0) return Status::Ok();
  if (me.launches_until_failure-- > 0) return Status::Ok();
  return me.launch_failure;
}

Status InProcessLink::AwaitDeviceCompletion() {
  std::unique_lock<std::mutex> lock(fabric_->mutex_);
  InProcessFabric::Node& me = session_->nodes[node_];
  if (me.device_delay.count() > 0) {
    fabric_->clock_.WaitUntil(fabric_->changed_, lock, fabric_->clock_.After(me.device_delay),
                              [&] { return !me.closed.empty(); });
  }
  fabric_->changed_.wait(lock,
                         [&] { return !me.closed.empty() || me.device_completions_allowed != 0; });
  COLLECTIVED_RETURN_IF_ERROR(BrokenLocked(-1, "the simulated device"));
  if (me.device_completions_allowed > 0) --me.device_completions_allowed;
  return Status::Ok();
}

void InProcessLink::AfterDelay(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(fabric_->mutex_);
    const milliseconds delay = session_->nodes[node_].delay;
    if (delay.count() > 0 && session_->nodes[node_].closed.empty()) {
      fabric_->delayed_.emplace(fabric_->clock_.After(delay),
                                InProcessFabric::Delayed{session_, node_, std::move(fn)});
      fabric_->WakeWorkerLocked();
      return;
    }
  }
  fn();
}

void InProcessLink::StartSend(const void* data, size_t bytes, int node, const P2PKey& key,
                              Done done) {
  StartTransfer(true, const_cast<void*>(data), bytes, node, key, std::move(done));
}

void InProcessLink::StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) {
  StartTransfer(false, data, bytes, node, key, std::move(done));
}

void InProcessLink::StartTransfer(bool is_send, void* data, size_t bytes, int peer,
                                  const P2PKey& key, Done done) {
  using Transfer = InProcessFabric::Transfer;
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  ++session_->nodes[node_].outstanding;
  Status broken = BrokenLocked(peer, DescribeTransfer(is_send, peer, key));
  if (!broken.ok()) {
    fabric_->PostLocked({session_, node_, std::move(done), broken});
    return;
  }
  // Keys are not reused across ops (tags carry the sequence): an emptied queue goes, or the
  // maps would grow with every op.
  auto& opposites = is_send ? session_->recvs : session_->sends;
  auto opposite = opposites.find(key);
  if (opposite == opposites.end()) {
    const uint64_t id = fabric_->next_transfer_id_++;
    Transfer transfer{session_, is_send, node_, peer, key, data, bytes, std::move(done)};
    fabric_->transfers_.emplace(id, std::move(transfer));
    (is_send ? session_->sends : session_->recvs)[key].push_back(id);
    fabric_->WakeWorkerLocked();
    return;
  }
  const uint64_t other_id = opposite->second.front();
  opposite->second.pop_front();
  if (opposite->second.empty()) opposites.erase(opposite);
  auto it = fabric_->transfers_.find(other_id);
  Transfer other = std::move(it->second);
  fabric_->transfers_.erase(it);
  const size_t send_bytes = is_send ? bytes : other.bytes;
  const size_t recv_bytes = is_send ? other.bytes : bytes;
  Status status;
  if (send_bytes != recv_bytes) {
    status = Status::Internal("group '" + session_->group + "': the send from rank " +
                              std::to_string(key.source) + " to rank " +
                              std::to_string(key.destination) + " (tag " + std::to_string(key.tag) +
                              ") has " + std::to_string(send_bytes) +
                              " bytes but the matching recv expects " + std::to_string(recv_bytes));
  } else if (send_bytes > 0) {
    std::memcpy(is_send ? other.data : data, is_send ? data : other.data, send_bytes);
  }
  InProcessFabric::Completion theirs{session_, other.owner, std::move(other.done), status};
  InProcessFabric::Completion mine{session_, node_, std::move(done), status};
  if (fabric_->link_latency_.count() == 0) {
    fabric_->PostLocked(std::move(theirs));
    fabric_->PostLocked(std::move(mine));
    return;
  }
  // On the wire for the link's latency: both ends complete once it passed (on the worker).
  InProcessFabric* fabric = fabric_.get();
  fabric_->delayed_.emplace(
      fabric_->clock_.After(fabric_->link_latency_),
      InProcessFabric::Delayed{session_, node_, [fabric, theirs, mine]() mutable {
                                 std::lock_guard<std::mutex> lock(fabric->mutex_);
                                 fabric->PostLocked(std::move(theirs));
                                 fabric->PostLocked(std::move(mine));
                               }});
  fabric_->WakeWorkerLocked();
}

bool InProcessLink::Idle() const {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  return session_->nodes[node_].outstanding == 0;
}

void InProcessLink::SetControlReceiver(ControlReceiver receiver) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  InProcessFabric::Node& me = session_->nodes[node_];
  me.control_receiver = std::move(receiver);
  if (me.control_receiver.on_message && !me.control_inbox.empty()) {
    fabric_->delayed_.emplace(
        Clock::TimePoint::min(),
        InProcessFabric::Delayed{session_, -1,
                                 [fabric = fabric_.get(), session = session_, node = node_] {
                                   fabric->DrainControl(session, node);
                                 }});
    fabric_->WakeWorkerLocked();
  }
}

void InProcessLink::PostControl(int to, ControlMessage message) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  // A closed end already queued its break for this node's receiver.
  if (to < 0 || to >= session_->node_count || to == node_ || !BrokenLocked(to, "").ok()) return;
  fabric_->ArriveLocked(session_, to,
                        InProcessFabric::ControlDelivery{node_, std::move(message), Status::Ok()});
}

void InProcessLink::Close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  fabric_->CloseLocked(session_, node_, reason);
}

}  // namespace collectived
