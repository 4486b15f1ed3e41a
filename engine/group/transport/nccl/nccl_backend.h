// NcclBackend: the data backend for CUDA device memory. One NCCL rank per sidecar (on the GPU the
// group's local ranks share), on a stream of the sidecar's own: memory operations are device
// kernels and copies on that stream, collectives among the sidecars are NCCL calls on it, and
// nothing waits for the stream on the CPU: WhenComplete records an event that the process's
// completion poller (StreamCompletions) watches, and the op's completion (or NCCL's asynchronous
// error, checked while it waits) goes to the executor once the GPU got there, so the group keeps
// several ops in flight. With one node there is no communicator: the
// local ranks are combined on the device and every collective is a no-op.
//
// (op, dtype) pairs NCCL cannot reduce (int16, bool, complex, the bitwise ops) are gathered
// from every node with ncclAllGather and combined by our kernels, so every pair the host path
// serves is served here too. Point-to-point transfers between ranks on different sidecars are
// staged through host memory over the group's mesh (MessageTransport): NCCL matches sends and
// receives by call order per peer, which concurrent streams of different tags cannot promise.
//
// Failures: a timeout or an asynchronous NCCL error aborts the communicator (ncclCommAbort)
// without waiting for the peers; the sidecar lives on and the group can be created again.
//
// Thread-safety: as DataBackend. Abort may be called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "engine/concurrency/clock.h"
#include "engine/concurrency/executor.h"
#include "engine/group/transport/data_backend.h"
#include "engine/store/store.h"

namespace collectived {

class NcclBackend final : public DataBackend {
 public:
  // Builds the backend of `group` on CUDA device `device` among `node_count` sidecars. With
  // more than one node, node 0 publishes an NCCL unique id in `store` (scoped to this
  // incarnation of the group) and every node creates its communicator without blocking, within
  // `timeout`. `transfers` carries the point-to-point transfers (null with one node); completions
  // and unstaged receives run on `executor`, which must outlive the backend, as must `clock`
  // (the deadlines of NCCL's non-blocking calls).
  static StatusOr<std::unique_ptr<NcclBackend>> Create(const std::string& group, int device,
                                                       int node_rank, int node_count,
                                                       std::shared_ptr<MessageTransport> transfers,
                                                       Store& store, Ms timeout, Executor& executor,
                                                       Clock& clock = Clock::Real());
  ~NcclBackend() override;

  DeviceKind device_kind() const override { return DeviceKind::kCuda; }
  BackendCapabilities capabilities() const override { return {false, true}; }
  int node_rank() const override { return node_rank_; }
  int node_count() const override { return node_count_; }
  int device() const;

  StatusOr<std::byte*> Scratch(int slot, size_t bytes) override;
  Status Copy(void* dst, const void* src, size_t bytes) override;
  StatusOr<std::byte*> KeptMemory(size_t bytes) override;
  // On the group's stream, which a communicator's abort leaves usable; waits for it.
  Status RestoreKept(void* dst, const void* src, size_t bytes) override;
  Status Combine(const ReduceOp& op, DType dtype, void* out, const void* a, const void* b,
                 size_t count) override;
  Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) override;
  Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                  int contributions) override;
  Status AwaitReady(const TensorView& tensor) override;
  StatusOr<CompletionEvent> RecordCompletionEvent() override;
  // cuStreamWriteValue32 into the signal's segment, registered with CUDA (cudaHostRegister,
  // mapped and portable) on first use for the segment's life; the backend keeps the segment
  // until it is destroyed (after its stream drained), whatever becomes of the op.
  Status EnqueueSignal(const StreamSignal& signal) override;
  void WhenComplete(Done done) override;
  // Watches the op's completion event itself: one cudaEventRecord less per op.
  void WhenCompleteAt(const CompletionEvent& event, Done done) override;

  Status AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op, uint32_t tag,
                   Ms timeout) override;
  Status Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout) override;
  Status Reduce(void* data, size_t count, DType dtype, const ReduceOp& op, int root_node,
                uint32_t tag, Ms timeout) override;
  Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                    uint32_t tag, Ms timeout) override;
  Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                   const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) override;
  Status Barrier(uint32_t tag, Ms timeout) override;

  void StartSend(const void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  bool Idle() const override;

  void Abort() override;

 private:
  struct Impl;
  explicit NcclBackend(std::unique_ptr<Impl> impl, int node_rank, int node_count);
  // WhenComplete, at the cudaEvent_t `recorded` when not null.
  void WatchStream(void* recorded, Done done);

  const std::unique_ptr<Impl> impl_;
  const int node_rank_;
  const int node_count_;
};

}  // namespace collectived
