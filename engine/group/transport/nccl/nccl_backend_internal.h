// NcclBackend::Impl: the state of one NCCL backend, shared by its core (nccl_backend.cc), its
// pinned host-buffer pool (nccl_pinned_pool.cc) and its point-to-point staging
// (nccl_point_to_point.cc). Run, a template, is defined in nccl_backend.cc, where every call is.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/concurrency/executor.h"
#include "engine/cuda/cuda_errors.h"
#include "engine/group/transport/nccl/nccl_backend.h"
#include "engine/memory/shm_segment.h"

namespace collectived {

struct NcclBackend::Impl {
  std::string group;
  int device = 0;
  Executor* executor = nullptr;
  Clock* clock = nullptr;  // deadlines of NCCL's non-blocking calls
  cudaStream_t stream = nullptr;
  cudaStream_t staging_stream = nullptr;  // sends' copies to host memory, in send order
  // Receives' copies to the device, a stream each while it runs: a receive's copy waits for
  // what the op stream held when it was posted, and behind another receive's wait it could
  // wait for an op that waits (through a trainer's stream) for this receive.
  std::mutex receive_streams_mutex;
  std::vector<cudaStream_t> receive_streams;       // guarded: every one made
  std::vector<cudaStream_t> free_receive_streams;  // guarded: those not in use
  ncclComm_t comm = nullptr;
  std::shared_ptr<MessageTransport> p2p;  // host-staged transfers; null with one node
  struct DeviceBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  // [3]: the backend's own (fallback gathers, barrier); [4]: an op's kept outputs (KeptMemory).
  DeviceBuffer scratch[5];
  std::vector<void*> retired_scratch;  // outgrown scratch, freed after the stream (see Buffer)
  struct PinnedBuffer {
    void* data = nullptr;
    size_t size = 0;
  };
  static constexpr size_t kPinnedCacheBytes = size_t{256} << 20;
  std::mutex pinned_mutex;
  std::multimap<size_t, void*> pinned_free;  // guarded by pinned_mutex: by size
  size_t pinned_free_bytes = 0;              // guarded by pinned_mutex: those of the cache's size
  bool oversized_kept = false;  // guarded by pinned_mutex: one larger than the cache is free
  std::atomic<bool> aborted{false};
  std::atomic<bool> abort_requested{false};  // set before Abort takes abort_mutex
  std::mutex abort_mutex;                    // one ncclCommAbort
  std::mutex staging_mutex;
  cudaEvent_t stream_tail = nullptr;  // StagingAfterStream's marker
  // A send whose bytes are being copied to pinned host memory (StartSend).
  struct StagedSend {
    PinnedBuffer staging;
    size_t bytes = 0;
    int node = 0;
    P2PKey key;
    Done done;
    std::optional<Status> copied;  // how the copy ended, once it has
    bool copy_may_run = false;     // a copy was enqueued and not seen to end well
  };
  std::mutex staged_sends_mutex;
  std::deque<std::shared_ptr<StagedSend>> staged_sends;  // in StartSend order
  Status staging_failed;  // guarded by staged_sends_mutex: the first failed copy's status
  // Transfers started here whose `done` has not run yet (Idle).
  std::atomic<int> transfers{0};
  std::mutex retired_pinned_mutex;
  std::vector<void*> retired_pinned;  // guarded by retired_pinned_mutex: freed after the streams

  // Ends a transfer: it stops counting just before its `done` runs.
  void Finish(const Done& done, const Status& status) {
    transfers.fetch_sub(1);
    done(status);
  }

  // Pinned memory a failed copy may still be using: freed with the Impl, after the streams (a
  // cudaFreeHost here would wait for every stream of the device).
  void RetirePinned(void* data);

  // Records that `send`'s copy ended with `status`, then hands the sends at the front whose
  // copies ended to the mesh in StartSend order (the mesh carries the messages of one key in the
  // order it gets them, and the receiver takes them in that order). A failed copy's send ends
  // with its status, and so does every later one: a later send of the same key would otherwise
  // be taken for it. Never waits for the device while holding the lock.
  void SendStaged(const std::shared_ptr<StagedSend>& send, const Status& status);
  std::mutex signalled_mutex;
  // The segments the stream has written stream signals into: released after the stream is
  // drained, when the Impl goes (members go after ~Impl's body).
  std::set<std::shared_ptr<ShmSegment>> signalled;  // guarded by signalled_mutex

  // A stream for one receive's copy (the device current), back with GiveReceiveStream.
  StatusOr<cudaStream_t> TakeReceiveStream();
  void GiveReceiveStream(cudaStream_t given);

  // Orders the staging stream after everything enqueued on the op stream so far (the ready
  // events a transfer's tensor was made to wait on included). Call with the device current.
  Status StagingAfterStream();

  std::string Where(const std::string& what) const {
    return what + " (group '" + group + "', cuda:" + std::to_string(device) + ")";
  }

  // The streams and scratch memory go with the Impl, also when Create fails half way.
  ~Impl();

  // OK, or `error` described with Where(what): an op's calls build no message when they succeed.
  Status Check(cudaError_t error, const char* what) const {
    return error == cudaSuccess ? Status::Ok() : CudaStatus(error, Where(what));
  }

  Status SetDevice() { return Check(cudaSetDevice(device), "cudaSetDevice"); }

  // Pinned host memory to stage a point-to-point transfer through: at least `bytes`, from the
  // buffers of finished transfers where one is large enough. Made anew, cudaMallocHost costs up
  // to milliseconds, and freeing, cudaFreeHost waits for every stream of the device (on a
  // transfer's path, behind a stream that may wait on a trainer). Give it back with GivePinned.
  StatusOr<PinnedBuffer> TakePinned(size_t bytes);

  // Keeps `buffer` for the next transfers: up to kPinnedCacheBytes of them, and besides those
  // one larger than that (a transfer larger than the cache reuses its buffer). Past that, frees
  // it: the rare case of many large transfers at once. Any thread: the device is made current
  // for the free.
  void GivePinned(PinnedBuffer buffer);

  // Scratch slot `slot` of at least `bytes`. An outgrown buffer is not freed here: the stream may
  // still use it, and cudaFree waits for every stream of the device, which on an op's path can
  // wait for ever (another group's stream may wait on a trainer whose stream waits on this op's
  // stream signal). It is freed with the Impl, after the streams; a new buffer is at least twice
  // the old one, so what is retired stays below what is in use.
  StatusOr<std::byte*> Buffer(int slot, size_t bytes);

  // Runs one NCCL call on the communicator unless it was aborted (Abort takes the same lock, so
  // the communicator is never freed under a call). A non-blocking communicator may answer
  // ncclInProgress; the next call may only come once it has left that state.
  template <typename F>
  Status Run(const std::string& what, std::chrono::milliseconds timeout, F call);

  // Gathers every node's `bytes` into scratch slot 3 (node order) and combines them there: the
  // way to reduce what NCCL cannot. The result (count elements) ends in `out`.
  Status GatherAndCombine(const void* in, void* out, size_t count, DType dtype, const ReduceOp& op,
                          int node_count, std::chrono::milliseconds timeout);
};

}  // namespace collectived
