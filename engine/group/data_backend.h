// DataBackend: moves the node-level part of a group's ops among the group's sidecars, on memory
// of one device kind — the seam between the node-aware algorithms (engine/group/*.cc: they
// combine the local ranks' tensors and make one network call per node) and a transport.
//
// GlooBackend (engine/group/gloo/) serves host memory over Gloo's TCP transport. A device
// backend (NCCL) fits the same shape: memory operations run on the backend's device (on its
// stream), network calls may be enqueued asynchronously, and Flush completes what an op
// enqueued; Abort tears the communicator down without waiting for the peers.
//
// The group's executor calls the collective methods one op at a time, in the same order on
// every sidecar (sequence-number order), with tags from OpTags. Point-to-point transfers may be
// started from any thread, concurrently with collectives.
//
// Errors: PeerLost when a peer's connection broke (or the backend was aborted), Timeout when the
// call's timeout passed first, InvalidArgument for requests the backend cannot serve, Internal
// for failures of the library underneath.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "engine/reduce_op.h"
#include "engine/status.h"
#include "engine/tensor.h"

namespace collectived {

class DataBackend {
 public:
  using Ms = std::chrono::milliseconds;

  virtual ~DataBackend() = default;

  // The memory this backend's ops read and write.
  virtual DeviceKind device_kind() const = 0;
  // This sidecar's index among the group's sidecars, and their number. With one node the
  // collectives below have nothing to move and return at once (the algorithms rely on it).
  virtual int node_rank() const = 0;
  virtual int node_count() const = 0;

  // --- memory of the backend's device (executor thread only; for host memory, Copy, Combine,
  // PreScale and Finalize may also run on helper threads the executor starts for one op) ---

  // Scratch memory of at least `bytes`, one buffer per `slot` (0..2), reused across ops; the
  // pointer is valid until the next call with the same slot.
  virtual std::byte* Scratch(int slot, size_t bytes) = 0;
  // dst = src (non-overlapping, `bytes` bytes).
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  // out[i] = a[i] (op) b[i]; `out` may alias `a` or `b` (see CombineFn).
  virtual Status Combine(const ReduceOp& op, DType dtype, void* out, const void* a, const void* b,
                         size_t count) = 0;
  // PREMUL_SUM's scaling of a node's contribution (PreScale) and AVG's division by the number
  // of contributions (Finalize); no-ops for the other reduce ops.
  virtual Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) = 0;
  virtual Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                          int contributions) = 0;
  // Orders the current op's work after the producer of `tensor` (its `ready` event): a device
  // backend makes its stream wait on the event, with no CPU wait. Called by the executor for
  // every tensor of an op before the op's algorithm runs. Host memory needs nothing.
  virtual Status AwaitReady(const TensorView& tensor) {
    (void)tensor;
    return Status::Ok();
  }
  // A device backend's interprocess event, recorded on its stream after everything the current
  // op enqueued; returns the event's handle for another process (cudaIpcEventHandle_t for
  // CUDA). Empty for host memory, whose ops are done when their calls return. The events come
  // from a pool reused round-robin: a process that waits on a handle after a later op recorded
  // the same event waits for that later op, longer but never too little.
  virtual StatusOr<std::string> RecordCompletionEvent() { return std::string(); }
  // Completes everything the current op enqueued (a device backend's stream work). Host
  // backends run synchronously and return OK at once.
  virtual Status Flush(Ms timeout) = 0;

  // --- collectives among the group's sidecars (executor thread only, same order everywhere) ---

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

  // Identifies one stream of messages: from group rank `source` to group rank `destination`
  // with the user's tag. Messages of one key arrive in the order they were sent.
  struct P2PKey {
    int source = 0;
    int destination = 0;
    int64_t tag = 0;
  };
  using Done = std::function<void(const Status&)>;
  // Starts moving `bytes` bytes to (from) node `node`; `done` runs exactly once, on a thread of
  // the backend, when the transfer completed or failed (Timeout after `timeout`, PeerLost when
  // the connection broke or the backend was aborted). The memory must stay valid until then.
  virtual void StartSend(const void* data, size_t bytes, int node, P2PKey key, Ms timeout,
                         Done done) = 0;
  virtual void StartRecv(void* data, size_t bytes, int node, P2PKey key, Ms timeout, Done done) = 0;
  // Whether every transfer started here has finished (its `done` has returned).
  virtual bool Idle() const = 0;

  // Closes every connection: blocked calls here and on the peers fail promptly. Transfers in
  // flight complete with an error (some transports only when their own timeout passes).
  virtual void Abort() = 0;
};

}  // namespace collectived
