// DataBackend: moves the node-level part of a group's ops among the group's sidecars, on memory
// of one device kind — the seam between the node-aware algorithms (engine/group/*.cc: they
// combine the local ranks' tensors and make one network call per node) and a transport.
//
// GlooBackend (engine/group/transport/gloo/) serves host memory over Gloo's TCP transport: its
// calls run the op and return when it is done. A device backend (NCCL) is asynchronous: memory
// operations and collectives are enqueued on the backend's stream and return at once, and
// WhenComplete reports when everything an op enqueued has run, so the group can start its next op
// while the device works (a bounded number in flight). The algorithms ask what a backend can do
// through capabilities(), never through its device kind.
//
// The group calls the collective and memory methods from one op at a time, in the same op order
// on every sidecar (sequence-number order), with tags from OpTags. Point-to-point transfers may
// be started from any thread, concurrently with collectives, and so may the AwaitReady, Copy and
// WhenComplete of a point-to-point copy between two ranks of this sidecar (device backends order
// them on their stream; a WhenComplete then also covers collective work enqueued before it).
//
// Errors: every call returns its own error at once (a launch that failed, a peer lost during a
// host call), never stashed for a later call. PeerLost when a peer's connection broke (or the
// backend was aborted), Timeout when the call's timeout passed first, InvalidArgument for
// requests the backend cannot serve, Internal for failures of the library or device underneath.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/group/transport/message_transport.h"
#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_op.h"
#include "engine/vocabulary/status.h"
#include "engine/vocabulary/stream_signal.h"
#include "engine/vocabulary/tensor.h"

namespace collectived {

// What a backend can do, for the algorithms and the group to choose their path by.
struct BackendCapabilities {
  // The CPU may read and write the tensors directly while an op runs: host memory whose calls
  // complete synchronously. Such backends get the host shortcuts: a small allreduce carried by
  // the agreement itself, local passes split into cache-sized chunks and across the executor,
  // pipelined network calls, and a barrier that is the agreement alone.
  bool cpu_accessible = true;
  // Calls enqueue work that completes later (WhenComplete); the group keeps several ops in
  // flight. Otherwise an op is done once its calls returned.
  bool asynchronous = false;
};

// A marker a device backend recorded on its stream after an op's work (RecordCompletionEvent).
struct CompletionEvent {
  std::string handle;      // for another process; empty: none (host memory)
  void* native = nullptr;  // the backend's own (a cudaEvent_t), for WhenCompleteAt
  // The event is recorded again by the stream's n-th recording after this one (its ring's size).
  size_t recorded_again_at = 0;
};

class DataBackend {
 public:
  using Ms = std::chrono::milliseconds;
  using Done = std::function<void(const Status&)>;

  virtual ~DataBackend() = default;

  // The memory this backend's ops read and write, and what it can do.
  virtual DeviceKind device_kind() const = 0;
  virtual BackendCapabilities capabilities() const = 0;
  // This sidecar's index among the group's sidecars, and their number. With one node the
  // collectives below have nothing to move and return at once (the algorithms rely on it).
  virtual int node_rank() const = 0;
  virtual int node_count() const = 0;

  // --- memory of the backend's device (one op at a time; for cpu_accessible backends, Copy,
  // Combine, PreScale and Finalize may also run on executor tasks the op splits its passes
  // into) ---

  // Scratch memory of at least `bytes`, one buffer per `slot` (0..2), reused across ops; the
  // pointer is valid until the next call with the same slot. ResourceExhausted when the memory
  // cannot be had.
  virtual StatusOr<std::byte*> Scratch(int slot, size_t bytes) = 0;
  // dst = src (non-overlapping, `bytes` bytes).
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // out[i] = a[i] (op) b[i]; `out` may alias `a` or `b` (see CombineFn).
  virtual Status Combine(const ReduceOp& op, DType dtype, void* out, const void* a, const void* b,
                         size_t count) = 0;
  // PREMUL_SUM's scaling of a node's contribution (PreScale) and AVG's division by the number
  // of contributions (Finalize); no-ops for the other reduce ops.
  virtual Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) = 0;
  virtual Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                          int contributions) = 0;
  // Orders the current op's work after the producer of `tensor` (its `ready` event): a device
  // backend makes its stream wait on the event, with no CPU wait. Called for every tensor of an
  // op before the op's algorithm runs. A tensor without an event, and host memory, need nothing.
  virtual Status AwaitReady(const TensorView& tensor) {
    (void)tensor;
    return Status::Ok();
  }
  // A device backend's interprocess event, recorded on its stream after everything the current
  // op enqueued; its handle is for another process (cudaIpcEventHandle_t for CUDA). An empty
  // handle for host memory, whose ops are done when their calls return. The events come from a
  // pool reused round-robin: a process that waits on a handle after a later op recorded the
  // same event waits for that later op, longer but never too little.
  virtual StatusOr<CompletionEvent> RecordCompletionEvent() { return CompletionEvent{}; }
  // Asynchronous backends: sets `signal`'s word to its value on the stream, after everything
  // the current op enqueued (and with its results visible to the signal's waiter). The segment
  // must stay alive until the op completes (the request holds it). An error leaves the word to
  // the group, which stores it when the op concludes.
  virtual Status EnqueueSignal(const StreamSignal& signal) {
    (void)signal;
    return Status::InvalidArgument("this backend's ops complete when their calls return");
  }
  // Asynchronous backends: `done` runs exactly once, on a thread of the backend, when everything
  // enqueued since the previous call has run (OK) or failed (Internal for a device error,
  // PeerLost once the backend was aborted). Calls complete in the order they were made. The
  // group watches the op's deadline and aborts the backend when it passes. Synchronous backends
  // (the default) call `done` with OK at once.
  virtual void WhenComplete(Done done) { done(Status::Ok()); }
  // As WhenComplete, for the op whose last work on the stream is `event` (its
  // RecordCompletionEvent, just made on this thread): a backend may watch that event instead of
  // recording one more. The caller guarantees that no earlier watch of the event is still
  // pending, as a group does whose depth is at most event.recorded_again_at (a watch of an
  // event recorded again meanwhile would end with the later recording: late, never early).
  virtual void WhenCompleteAt(const CompletionEvent& event, Done done) {
    (void)event;
    WhenComplete(std::move(done));
  }

  // --- committing groups on an asynchronous backend (docs/fault-tolerance.md, losing a
  // sidecar): an op's outputs are copied aside (Copy, on the stream) before its data phase
  // overwrites them, and put back if a lost sidecar makes it run again ---

  // Memory of the device of at least `bytes` for the outputs of the one op a committing group
  // runs at a time; reused by the next op, valid until the next call. ResourceExhausted when
  // the memory cannot be had.
  virtual StatusOr<std::byte*> KeptMemory(size_t bytes) {
    (void)bytes;
    return Status::InvalidArgument("this backend keeps no outputs on a device");
  }
  // dst = src on the device, after everything enqueued before it, done when it returns — also
  // once the backend was aborted (its communicator is gone, its memory and stream are not).
  virtual Status RestoreKept(void* dst, const void* src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return Status::InvalidArgument("this backend keeps no outputs on a device");
  }

  // --- collectives among the group's sidecars (one op at a time, same order everywhere) ---

  // In place: data (count elements) becomes the combination over all nodes.
  virtual Status AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op, uint32_t tag,
                           Ms timeout) = 0;
  // In place: the root node's bytes are copied to every node.
  virtual Status Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout) = 0;
  // In place: on root_node data becomes the combination over all nodes; elsewhere it is scratch.
  virtual Status Reduce(void* data, size_t count, DType dtype, const ReduceOp& op, int root_node,
                        uint32_t tag, Ms timeout) = 0;
  // Node i contributes bytes_per_node[i] bytes; `out` receives them concatenated in node order.
  virtual Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                            uint32_t tag, Ms timeout) = 0;
  // Sends send_bytes[i] bytes (consecutive in `in`) to node i and receives recv_bytes[i] bytes
  // from node i into consecutive ranges of `out`.
  virtual Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                           const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) = 0;
  virtual Status Barrier(uint32_t tag, Ms timeout) = 0;

  // --- point to point between ranks on different nodes (any thread) ---

  using P2PKey = collectived::P2PKey;
  // Starts moving `bytes` bytes to (from) node `node` as MessageTransport does (a device
  // backend stages device memory through host memory around it); `done` runs exactly once, on a
  // thread of the backend, when the transfer completed or failed. The memory must stay valid
  // until then. Timeouts are the caller's. A receive into null takes the bytes and drops them
  // (a send of another size than its receive expects, taken to keep the stream in step).
  virtual void StartSend(const void* data, size_t bytes, int node, const P2PKey& key,
                         Done done) = 0;
  virtual void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) = 0;
  // Whether every transfer started here has finished (its `done` has returned).
  virtual bool Idle() const = 0;

  // Closes the backend's own connections: its blocked calls here and on the peers fail promptly
  // and pending completions end with PeerLost. (Point-to-point transfers end when the group's
  // MessageTransport closes: ControlChannel::Close.)
  virtual void Abort() = 0;
};

}  // namespace collectived
