// InProcessFabric: the sidecars of groups simulated inside one process, for tests. It is a
// TransportFactory: each simulated sidecar (one GroupRegistry, or a test building Groups by hand)
// connects through it and gets a control channel and a data backend over shared in-memory
// mailboxes instead of sockets. Nothing here uses Gloo.
//
// A group incarnation is a session of node_count nodes. Connect blocks until every node of the
// session has connected. Nodes of one session are matched by the ConnectRequest's store (scoped
// to the incarnation by the registry: the nodes agree on a session id through it) or, without a
// store, by the group name (one forming session per name at a time).
//
// Messages between nodes are byte vectors in FIFO mailboxes, one per (source node, destination
// node, tag); collectives are built from them on the calling thread. Point-to-point transfers
// are matched per (source rank, destination rank, user tag) in start order; their `done`
// callbacks and failures run on the fabric's one worker thread (no thread per transfer), as do
// the control channel's messages (ControlExchange's, sent at once as a socket mesh's control
// frames) and the delayed starts of a slow node's exchanges.
//
// Failures, like closed connections: when a node is closed (its control channel's Close, its
// backend's Abort) or killed (KillNode), every blocked and later call on that node, and every
// call of a peer that waits for it or sends to it, fails promptly with PeerLost. A receive that
// gets nothing within its call's timeout fails with Timeout ("Timeout in ...").
//
// Thread-safety: every method may be called from any thread. The fabric must be owned by a
// std::shared_ptr (Create); the links it hands out keep it alive.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/group/transport/control_exchange.h"
#include "engine/group/transport/data_backend.h"
#include "engine/group/transport/message_transport.h"
#include "engine/group/transport/transport_factory.h"
#include "engine/vocabulary/status.h"

namespace collectived {

class InProcessFabric final : public TransportFactory,
                              public std::enable_shared_from_this<InProcessFabric> {
 public:
  // Every wait, deadline, delay and link latency of the fabric is read on `clock`, which must
  // outlive it: on a ManualClock, time in the fabric moves only when the test moves it.
  static std::shared_ptr<InProcessFabric> Create(Clock& clock = Clock::Real());
  // Fails the transfers still pending with Aborted and joins the worker thread.
  ~InProcessFabric() override;
  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

  // Joins the calling node (request.topology.my_node) to its session and blocks until all
  // request.topology.node_count() nodes joined, or request.timeout passed (0 = no limit).
  // CUDA groups get a simulated device (InProcessDeviceBackend) over host memory. Returns
  // InvalidArgument for nodes that disagree on the node count and for a node that joins a
  // forming session twice; Unavailable naming the nodes
  // that never connected when the timeout passed.
  Status CheckDevice(const std::string& group, DeviceKind device) const override;
  StatusOr<GroupTransport> Connect(const ConnectRequest& request) override;

  // --- fault injection (the last session formed under the group's name) ---

  // Node `node` of `group` dies: its connections close with the reason "killed", so its peers'
  // blocked and later calls fail with PeerLost at once (and so do its own). Returns NotFound
  // for an unknown group, InvalidArgument for a node out of range.
  Status KillNode(const std::string& group, int node);
  // Every later collective and control call of node `node` first waits `delay` (zero: none),
  // as a slow sidecar would; a close cuts the wait short. Errors as KillNode.
  Status DelayNode(const std::string& group, int node, std::chrono::milliseconds delay);

  // Every later point-to-point transfer completes `latency` after both of its ends were posted,
  // and every control message arrives `latency` after it was sent, as across a network: a
  // benchmark's model of the time an exchange spends on the wire (zero: none).
  void SetLinkLatency(std::chrono::milliseconds latency);

  // --- the simulated device of CUDA groups (InProcessDeviceBackend) ---

  // Every later op of node `node`'s device completes `delay` after its stream reached it.
  Status SetDeviceDelay(const std::string& group, int node, std::chrono::milliseconds delay);
  // Node `node`'s device stops before the next op's completion (its work may run; it does not
  // complete) until AllowDeviceCompletions or ReleaseDevice.
  Status HoldDevice(const std::string& group, int node);
  // `count` more ops of a held device complete.
  Status AllowDeviceCompletions(const std::string& group, int node, int count);
  // The device completes ops again without limit.
  Status ReleaseDevice(const std::string& group, int node);
  // Node `node`'s device refuses to write stream signals from now on (as a driver without
  // stream memory operations would): the group stores them when the ops conclude.
  Status RefuseStreamSignals(const std::string& group, int node);
  // After `after` more calls that launch work on node `node`'s device (copies, combines,
  // collectives), the next one fails with `failure` at once, as a kernel launch or an NCCL call
  // may, with the work of the calls before it still on the stream.
  Status FailDeviceCall(const std::string& group, int node, int after, Status failure);
  // Node `node`'s device takes its ops' completion events from a ring of `size` (at least 1)
  // per stream, recorded again round-robin, as NcclBackend's (64, the default). Before the
  // device's first op.
  Status SetCompletionEventRing(const std::string& group, int node, size_t size);

  // How node `node`'s device watched its ops' completions: at the op's completion event
  // (WhenCompleteAt) or with a mark of its own (WhenComplete); and how many completion events
  // were recorded again while a watch of their earlier recording was pending (a watch that
  // would end late: never, in a group that checks its depth).
  struct DeviceWatches {
    int at_completion_events = 0;
    int own = 0;
    int recorded_while_watched = 0;
  };
  StatusOr<DeviceWatches> DeviceWatchesOf(const std::string& group, int node) const;

  // How many of node `node`'s device calls that may wait on a real GPU (a transfer's start, a
  // wait for a trainer's event) ran on the fabric's worker, where transfers complete: the
  // stand-in for a socket mesh's I/O thread, which such a call would stall for every group.
  StatusOr<int> DeviceCallsOnTransportThread(const std::string& group, int node) const;

 private:
  friend class InProcessLink;
  struct Node;
  struct Session;
  struct Transfer;
  struct Completion;
  struct ControlDelivery;
  explicit InProcessFabric(Clock& clock);
  // Queues `delivery` for node `node`'s control receiver and has the worker hand it over.
  void QueueControlLocked(const std::shared_ptr<Session>& session, int node,
                          ControlDelivery delivery);
  // `delivery` reaches node `node` after the link's latency (at once without one).
  void ArriveLocked(const std::shared_ptr<Session>& session, int node, ControlDelivery delivery);
  // On the worker: hands node `node`'s queued deliveries to its receiver, in order.
  void DrainControl(const std::shared_ptr<Session>& session, int node);
  std::shared_ptr<Session> LatestLocked(const std::string& group) const;
  // Runs `change` on node `node` of the latest session of `group`, then wakes every wait.
  Status ChangeNode(const std::string& group, int node, const std::function<void(Node&)>& change);
  // The latest session of `group` if it has node `node`; NotFound / InvalidArgument otherwise.
  StatusOr<std::shared_ptr<Session>> NodeSessionLocked(const std::string& group, int node) const;
  // Marks `node` closed with `reason` and fails the session's pending transfers touching it.
  void CloseLocked(const std::shared_ptr<Session>& session, int node, const std::string& reason);
  void PostLocked(Completion completion);
  // Makes the worker look at its completions and delayed calls again.
  void WakeWorkerLocked();
  void WorkerLoop();

  Clock& clock_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;        // messages, closes, joins: wakes blocked calls
  std::condition_variable worker_wakeup_;  // completions and deadlines
  std::map<std::string, std::shared_ptr<Session>> forming_;  // by session key
  std::map<std::string, std::weak_ptr<Session>> latest_;     // by group name
  std::map<uint64_t, Transfer> transfers_;                   // pending point-to-point, by id
  struct Delayed;
  std::multimap<Clock::TimePoint, Delayed> delayed_;  // AfterDelay's calls
  std::deque<Completion> completions_;
  std::chrono::milliseconds link_latency_{0};  // guarded by mutex_
  uint64_t next_transfer_id_ = 1;
  uint64_t next_session_id_ = 1;
  uint64_t worker_wakeups_ = 0;  // guarded by mutex_: counts WakeWorkerLocked
  bool stopping_ = false;
  std::thread worker_;
};

// InProcessLink: one node's end of a session: the message primitives its control channel and
// data backend are built from. `what` names the call in error messages ("allreduce among
// sidecars").
//
// Thread-safety: every method may be called from any thread.
class InProcessLink final : public MessageTransport {
 public:
  InProcessLink(std::shared_ptr<InProcessFabric> fabric,
                std::shared_ptr<InProcessFabric::Session> session, int node);

  int node() const { return node_; }
  int node_count() const;
  // The fabric's clock: deadlines of Receive are read on it.
  Clock& clock() const;
  const std::string& group() const;

  // Queues a copy of `bytes` bytes for node `to` under `tag`. PeerLost if either end is closed.
  Status Send(int to, uint32_t tag, const void* data, size_t bytes, std::string_view what);
  // Takes the oldest message from node `from` under `tag` into `data`, blocking until one
  // arrives (PeerLost if either end is closed first, Timeout at `deadline`; Internal if it is
  // not exactly `bytes` long). `timeout` is the call's, for the message.
  Status Receive(int from, uint32_t tag, void* data, size_t bytes, Clock::TimePoint deadline,
                 std::chrono::milliseconds timeout, std::string_view what);
  // Node i contributes bytes_per_node[i] bytes; `out` receives them in node order. With one
  // node, copies `in` to `out`.
  Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                    uint32_t tag, std::chrono::milliseconds timeout, std::string_view what);
  // Waits out this node's injected delay (DelayNode). PeerLost if the node is closed meanwhile.
  Status Delay(std::string_view what);
  // The simulated device's gate before an op's completion: its delay (SetDeviceDelay), then
  // while it is held (HoldDevice). PeerLost if the node is closed meanwhile.
  Status AwaitDeviceCompletion();
  // Whether the simulated device refuses stream signals (RefuseStreamSignals).
  bool DeviceRefusesSignals() const;
  // Counts a launch of the simulated device: OK, or the failure FailDeviceCall set up for it.
  Status NextDeviceLaunch();
  // The simulated device's ring of completion events (SetCompletionEventRing).
  size_t CompletionEventRing() const;
  // Adds `more` to the device's counts (DeviceWatchesOf).
  void CountDeviceWatches(const InProcessFabric::DeviceWatches& more);
  // Called by the simulated device at a call that may wait: counts it when it runs on the
  // fabric's worker (DeviceCallsOnTransportThread).
  void NoteDeviceCall();

  // Runs `fn` on the fabric's worker once this node's injected delay (DelayNode) passed, at once
  // (here) without one; a close of the node cuts the delay short.
  void AfterDelay(std::function<void()> fn);

  // MessageTransport towards node `node`; `done` runs on the fabric's worker. A send and a recv
  // of different sizes both fail with Internal (MessageTransport's contract).
  void StartSend(const void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  // Whether every transfer started here has finished (its `done` returned).
  bool Idle() const override;

  // Closes this node's connections (first reason wins).
  void Close(const std::string& reason);

  // --- the control channel's carrier, as a socket mesh's control frames ---

  // Where this node's control messages go: each message, and each break of a connection (a
  // peer's: `node` is that peer; this node's own close: `node` is this node), in the order they
  // happened per peer, on the fabric's worker. Messages and breaks that came before a receiver
  // was set wait for it; an empty receiver stops deliveries.
  struct ControlReceiver {
    std::function<void(int from, ControlMessage message)> on_message;
    std::function<void(int node, const Status& why)> on_broken;
  };
  void SetControlReceiver(ControlReceiver receiver);
  // Sends `message` to node `to` at once (no receive waits for it), arriving after the link's
  // latency, before the news of a close of this node that follows; dropped when either end is
  // closed already (the receiver hears of the close instead).
  void PostControl(int to, ControlMessage message);

 private:
  // PeerLost if this node or `peer` (-1: none) is closed; OK otherwise. Requires the mutex.
  Status BrokenLocked(int peer, std::string_view what) const;
  void StartTransfer(bool is_send, void* data, size_t bytes, int peer, const P2PKey& key,
                     Done done);

  const std::shared_ptr<InProcessFabric> fabric_;
  const std::shared_ptr<InProcessFabric::Session> session_;
  const int node_;
};

}  // namespace collectived
