// NcclBackend: the communicator, the op stream and its scratch memory, the collectives as NCCL
// calls and the completions. The pinned host-buffer pool and the point-to-point staging are in
// files of their own (nccl_pinned_pool.cc, nccl_point_to_point.cc; nccl_backend_internal.h).
#include "engine/group/transport/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/concurrency/executor.h"
#include "engine/cuda/cuda_driver_calls.h"
#include "engine/cuda/cuda_errors.h"
#include "engine/cuda/cuda_ipc_event.h"
#include "engine/cuda/device_combiner.h"
#include "engine/cuda/interprocess_event_pool.h"
#include "engine/cuda/pinned_host_pages.h"
#include "engine/cuda/stream_completions.h"
#include "engine/group/transport/nccl/nccl_backend_internal.h"
#include "engine/vocabulary/random_id.h"
#include "engine/vocabulary/reduce_kernels.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

constexpr char kUniqueIdKey[] = "nccl_unique_id";

// NCCL's element type for `dtype`, when NCCL has one.
std::optional<ncclDataType_t> NcclTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    default:
      return std::nullopt;
  }
}

// The NCCL reduction that combines node contributions for `op`: AVG and PREMUL_SUM are sums
// here (the algorithms pre-scale and divide around the network call, as on host memory).
std::optional<ncclRedOp_t> NcclOpOf(const ReduceOp& op) {
  switch (op.kind) {
    case ReduceOpKind::kSum:
    case ReduceOpKind::kAvg:
    case ReduceOpKind::kPremulSum:
      return ncclSum;
    case ReduceOpKind::kProduct:
      return ncclProd;
    case ReduceOpKind::kMin:
      return ncclMin;
    case ReduceOpKind::kMax:
      return ncclMax;
    default:
      return std::nullopt;
  }
}

// Waits for a non-blocking communicator to leave ncclInProgress, or for `deadline`. NCCL reports
// the end of a non-blocking call (communicator creation, the lazy connection of a first op) only
// through ncclCommGetAsyncError: no event or callback to wait on, so this asks again every
// 100 us, as c10d does. Op completion does not come through here (WhenComplete: the process's
// StreamCompletions poller).
Status AwaitCommunicator(ncclComm_t comm, Clock::TimePoint deadline, const std::string& what,
                         milliseconds timeout, const std::atomic<bool>& abandoned,
                         const Clock& clock) {
  Executor::Blocking blocking;
  while (true) {
    // The pause between queries paces a real device (real time); the deadline is the group's.
    // Abort waits for this call's lock: give it up at once (a dead peer keeps NCCL in progress).
    if (abandoned.load()) return Status::PeerLost(what + ": the communicator was aborted");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) return NcclStatus(asked, what, comm);
    if (state != ncclInProgress) return NcclStatus(state, what, comm);
    if (clock.Now() >= deadline) {
      return Status::Timeout(what + " Timed out after " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// The completion events of the sidecar's groups, a ring per group stream: one pool, never
// destroyed, as trainers cache the events they opened by handle, which must not come to name
// another event (see InterprocessEventPool). A group gives its ring back when it goes.
constexpr size_t kCompletionEventsPerStream = 64;

InterprocessEventPool& CompletionEvents() {
  static auto* pool = new InterprocessEventPool(kCompletionEventsPerStream,
                                                /*streams_per_device=*/SIZE_MAX);
  return *pool;
}

}  // namespace

NcclBackend::Impl::~Impl() {
  cudaSetDevice(device);
  std::vector<cudaStream_t> streams = receive_streams;
  streams.push_back(stream);
  streams.push_back(staging_stream);
  for (cudaStream_t s : streams) {
    if (s == nullptr) continue;
    cudaStreamSynchronize(s);
    if (s == stream) CompletionEvents().Release(device, s);
    cudaStreamDestroy(s);
  }
  for (auto& buffer : scratch) {
    if (buffer.data != nullptr) cudaFree(buffer.data);
  }
  for (void* data : retired_scratch) cudaFree(data);
  for (const auto& [size, host] : pinned_free) cudaFreeHost(host);
  for (void* host : retired_pinned) cudaFreeHost(host);
  if (stream_tail != nullptr) cudaEventDestroy(stream_tail);
}

StatusOr<std::byte*> NcclBackend::Impl::Buffer(int slot, size_t bytes) {
  DeviceBuffer& buffer = scratch[slot];
  if (buffer.bytes >= bytes && buffer.data != nullptr) return static_cast<std::byte*>(buffer.data);
  const size_t wanted = std::max<size_t>(bytes, 256);
  size_t size = std::max(wanted, 2 * buffer.bytes);
  void* data = nullptr;
  cudaError_t allocated = cudaMalloc(&data, size);
  if (allocated != cudaSuccess && size > wanted) {
    cudaGetLastError();
    size = wanted;
    allocated = cudaMalloc(&data, size);
  }
  if (allocated != cudaSuccess) {
    return CudaStatus(allocated,
                      Where("allocating " + std::to_string(bytes) + " bytes of scratch memory"),
                      ErrorKind::kResourceExhausted);
  }
  if (buffer.data != nullptr) retired_scratch.push_back(buffer.data);
  buffer = {data, size};
  return static_cast<std::byte*>(data);
}

template <typename F>
Status NcclBackend::Impl::Run(const std::string& what, milliseconds timeout, F call) {
  std::lock_guard<std::mutex> lock(abort_mutex);
  if (aborted.load() || comm == nullptr) {
    return Status::PeerLost(Where(what) + ": the communicator was aborted");
  }
  const ncclResult_t result = call(comm);
  if (result == ncclInProgress) {
    return AwaitCommunicator(comm, clock->After(timeout), Where(what), timeout, abort_requested,
                             *clock);
  }
  return NcclStatus(result, Where(what), comm);
}

Status NcclBackend::Impl::GatherAndCombine(const void* in, void* out, size_t count, DType dtype,
                                           const ReduceOp& op, int node_count,
                                           milliseconds timeout) {
  const size_t bytes = count * DTypeSize(dtype);
  StatusOr<std::byte*> gathered = Buffer(3, bytes * static_cast<size_t>(node_count));
  if (!gathered.ok()) return gathered.status();
  COLLECTIVED_RETURN_IF_ERROR(Run("ncclAllGather (fallback)", timeout, [&](ncclComm_t c) {
    return ncclAllGather(in, *gathered, bytes, ncclInt8, c, stream);
  }));
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(out, *gathered, bytes, cudaMemcpyDeviceToDevice, stream),
                 Where("cudaMemcpyAsync")));
  for (int node = 1; node < node_count; ++node) {
    const int launched =
        device_kernels::Combine(device_kernels::CombinerOf(op.kind), dtype, out, out,
                                *gathered + static_cast<size_t>(node) * bytes, count, stream);
    COLLECTIVED_RETURN_IF_ERROR(CudaStatus(static_cast<cudaError_t>(launched),
                                           Where("combining the nodes' contributions")));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::Create(
    const std::string& group, int device, int node_rank, int node_count,
    std::shared_ptr<MessageTransport> transfers, Store& store, Ms timeout, Executor& executor,
    Clock& clock) {
  const Clock::TimePoint deadline = clock.After(timeout);
  auto impl = std::make_unique<Impl>();
  impl->clock = &clock;
  impl->group = group;
  impl->device = device;
  impl->executor = &executor;
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device), impl->Where("cudaSetDevice"), ErrorKind::kInvalidArgument));
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking),
                 impl->Where("cudaStreamCreateWithFlags")));
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&impl->staging_stream, cudaStreamNonBlocking),
                 impl->Where("cudaStreamCreateWithFlags")));
  if (node_count > 1) {
    ncclUniqueId id{};
    if (node_rank == 0) {
      COLLECTIVED_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), impl->Where("ncclGetUniqueId")));
      COLLECTIVED_RETURN_IF_ERROR(store.Set(
          kUniqueIdKey, ToHex(std::string_view(reinterpret_cast<const char*>(&id), sizeof id))));
    } else {
      StatusOr<std::string> published = store.Get(kUniqueIdKey, timeout);
      if (!published.ok()) {
        return published.status().WithContext(impl->Where("waiting for node 0's NCCL unique id"));
      }
      if (!FromHex(*published, &id, sizeof id)) {
        return Status::Internal(
            impl->Where("node 0 published an NCCL unique id that cannot be read"));
      }
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started =
        ncclCommInitRankConfig(&impl->comm, node_count, id, node_rank, &config);
    Status created = NcclStatus(started, impl->Where("ncclCommInitRankConfig"), impl->comm);
    if (created.ok() && impl->comm != nullptr) {
      created = AwaitCommunicator(impl->comm, deadline,
                                  impl->Where("creating the NCCL communicator of " +
                                              std::to_string(node_count) + " sidecars"),
                                  timeout, impl->abort_requested, clock);
    }
    if (!created.ok()) {
      if (impl->comm != nullptr) ncclCommAbort(impl->comm);
      impl->comm = nullptr;
      return created;
    }
    impl->p2p = std::move(transfers);
  }
  return std::unique_ptr<NcclBackend>(new NcclBackend(std::move(impl), node_rank, node_count));
}

NcclBackend::NcclBackend(std::unique_ptr<Impl> impl, int node_rank, int node_count)
    : impl_(std::move(impl)), node_rank_(node_rank), node_count_(node_count) {}

NcclBackend::~NcclBackend() {
  Abort();  // the Impl then frees streams and memory
}

int NcclBackend::device() const {
  return impl_->device;
}

StatusOr<std::byte*> NcclBackend::Scratch(int slot, size_t bytes) {
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  return impl_->Buffer(slot, bytes);
}

Status NcclBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const cudaError_t copied =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream);
  return impl_->Check(copied, "cudaMemcpyAsync");
}

StatusOr<std::byte*> NcclBackend::KeptMemory(size_t bytes) {
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  return impl_->Buffer(4, bytes);
}

Status NcclBackend::RestoreKept(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  COLLECTIVED_RETURN_IF_ERROR(
      impl_->Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream),
                   "cudaMemcpyAsync (restoring an op's kept outputs)"));
  return impl_->Check(cudaStreamSynchronize(impl_->stream),
                      "cudaStreamSynchronize (restoring an op's kept outputs)");
}

Status NcclBackend::Combine(const ReduceOp& op, DType dtype, void* out, const void* a,
                            const void* b, size_t count) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const int launched = device_kernels::Combine(device_kernels::CombinerOf(op.kind), dtype, out, a,
                                               b, count, impl_->stream);
  return impl_->Check(static_cast<cudaError_t>(launched), "combine kernel");
}

Status NcclBackend::PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  if (op.kind != ReduceOpKind::kPremulSum) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const int launched = device_kernels::Scale(dtype, data, count, op.scale, impl_->stream);
  return impl_->Check(static_cast<cudaError_t>(launched), "PREMUL_SUM scale kernel");
}

Status NcclBackend::Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                             int contributions) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  if (op.kind != ReduceOpKind::kAvg) return Status::Ok();
  if (contributions < 1) return Status::InvalidArgument("AVG over no contributions");
  if (contributions == 1) return Status::Ok();  // a division by 1: no launch
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const int launched = device_kernels::Divide(dtype, data, count, contributions, impl_->stream);
  return impl_->Check(static_cast<cudaError_t>(launched), "AVG division kernel");
}

Status NcclBackend::AwaitReady(const TensorView& tensor) {
  if (!tensor.ready) return Status::Ok();
  const auto* event = dynamic_cast<const CudaIpcEvent*>(tensor.ready.get());
  if (event == nullptr) {
    return Status::InvalidArgument(impl_->Where("a tensor's ready event is not a CUDA event"));
  }
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  return impl_->Check(cudaStreamWaitEvent(impl_->stream, event->event(), 0),
                      "waiting on the trainer's CUDA event");
}

StatusOr<CompletionEvent> NcclBackend::RecordCompletionEvent() {
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  StatusOr<InterprocessEvent> event = CompletionEvents().Next(impl_->device, impl_->stream);
  if (!event.ok()) return event.status().WithContext(impl_->Where("the op's completion event"));
  COLLECTIVED_RETURN_IF_ERROR(impl_->Check(cudaEventRecord(event->event, impl_->stream),
                                           "recording the op's completion event"));
  return CompletionEvent{event->handle, event->event, kCompletionEventsPerStream};
}

namespace {

// A segment's pages pinned for the devices; unregistered when the segment drops the attachment,
// before it unmaps them.
StatusOr<ShmSegment::Attachment> RegisterHostPages(std::byte* data, size_t size) {
  StatusOr<std::shared_ptr<PinnedHostPages>> pinned = PinnedHostPages::Register(data, size);
  if (!pinned.ok()) return pinned.status();
  return ShmSegment::Attachment(std::move(*pinned));
}

}  // namespace

Status NcclBackend::EnqueueSignal(const StreamSignal& signal) {
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  StatusOr<const CudaDriverCalls*> driver = DriverCalls();
  if (!driver.ok()) return driver.status();
  StatusOr<ShmSegment::Attachment> attached = signal.segment->Attach(RegisterHostPages);
  if (!attached.ok()) return attached.status().WithContext(impl_->Where("stream signal"));
  StatusOr<CUdeviceptr> base =
      std::static_pointer_cast<PinnedHostPages>(*attached)->DeviceAddress(impl_->device);
  if (!base.ok()) return base.status().WithContext(impl_->Where("stream signal"));
  {
    // Held until the stream is drained (~Impl): an op that fails may conclude, and its session
    // unregister the buffer, before the stream got to the write.
    std::lock_guard<std::mutex> lock(impl_->signalled_mutex);
    impl_->signalled.insert(signal.segment);
  }
  // The default flags fence the op's writes before the word's (CU_STREAM_WRITE_VALUE_DEFAULT).
  const CUresult written = (*driver)->stream_write_value32(
      reinterpret_cast<CUstream>(impl_->stream), *base + signal.offset, signal.value,
      CU_STREAM_WRITE_VALUE_DEFAULT);
  if (written == CUDA_SUCCESS) return Status::Ok();
  return CuStatus(written, impl_->Where("cuStreamWriteValue32 (stream signal)"));
}

namespace {

// The communicator's asynchronous error, ncclInProgress (ops still running) counting as none.
ncclResult_t PendingAsyncError(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
  return asked != ncclSuccess ? asked : (state == ncclInProgress ? ncclSuccess : state);
}

}  // namespace

void NcclBackend::WhenComplete(Done done) {
  WatchStream(nullptr, std::move(done));
}

void NcclBackend::WhenCompleteAt(const CompletionEvent& event, Done done) {
  WatchStream(event.native, std::move(done));
}

void NcclBackend::WatchStream(void* recorded, Done done) {
  Status refused = impl_->SetDevice();
  if (refused.ok() && impl_->aborted.load()) {
    refused = Status::PeerLost(impl_->Where("the op") + ": the communicator was aborted");
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  Impl* impl = impl_.get();
  const int nodes = node_count_;
  // The stream ran everything enqueued before: tell success from an abort or an asynchronous
  // NCCL error (a peer that failed mid-op).
  auto outcome = [impl, nodes]() -> Status {
    if (impl->aborted.load()) {
      return Status::PeerLost(impl->Where("the op") + ": the communicator was aborted");
    }
    return nodes > 1 ? impl->Run("NCCL", milliseconds(1), PendingAsyncError) : Status::Ok();
  };
  // While the stream waits: a peer that died leaves NCCL's kernels waiting for it forever, and
  // only NCCL's asynchronous error says so. Skipped while a call holds the communicator; none
  // with one node (no communicator).
  StreamCompletions::Health health;
  if (nodes > 1) {
    health = [impl]() -> Status {
      std::unique_lock<std::mutex> lock(impl->abort_mutex, std::try_to_lock);
      if (!lock.owns_lock() || impl->aborted.load() || impl->comm == nullptr) return Status::Ok();
      return NcclStatus(PendingAsyncError(impl->comm), impl->Where("NCCL (while the op ran)"),
                        impl->comm);
    };
  }
  Executor* executor = impl->executor;
  auto shared_done = std::make_shared<Done>(std::move(done));
  auto reached = [executor, outcome, shared_done](const Status& reached) {
    // No CUDA or NCCL call on the poller's thread beyond its queries: to the executor.
    executor->Post(
        [outcome, shared_done, reached] { (*shared_done)(reached.ok() ? outcome() : reached); });
  };
  StreamCompletions& completions = StreamCompletions::Instance();
  if (recorded != nullptr) {
    completions.WatchRecorded(impl->device, impl->stream, static_cast<cudaEvent_t>(recorded),
                              std::move(health), std::move(reached));
    return;
  }
  Status watched =
      completions.Watch(impl->device, impl->stream, std::move(health), std::move(reached));
  if (!watched.ok()) (*shared_done)(Status::Internal(impl->Where(watched.message())));
}

Status NcclBackend::AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op, uint32_t,
                              Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const std::optional<ncclDataType_t> type = NcclTypeOf(dtype);
  const std::optional<ncclRedOp_t> nccl_op = NcclOpOf(op);
  if (type && nccl_op) {
    return impl_->Run("ncclAllReduce", timeout, [&](ncclComm_t c) {
      return ncclAllReduce(data, data, count, *type, *nccl_op, c, impl_->stream);
    });
  }
  if (dtype == DType::kComplex64 || dtype == DType::kComplex128) {
    // A complex sum is a sum of twice as many real parts.
    if (nccl_op == ncclSum) {
      const ncclDataType_t part = dtype == DType::kComplex64 ? ncclFloat32 : ncclFloat64;
      return impl_->Run("ncclAllReduce", timeout, [&](ncclComm_t c) {
        return ncclAllReduce(data, data, count * 2, part, ncclSum, c, impl_->stream);
      });
    }
  }
  return impl_->GatherAndCombine(data, data, count, dtype, op, node_count_, timeout);
}

Status NcclBackend::Broadcast(void* data, size_t bytes, int root_node, uint32_t, Ms timeout) {
  if (node_count_ == 1 || bytes == 0) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  return impl_->Run("ncclBroadcast", timeout, [&](ncclComm_t c) {
    return ncclBroadcast(data, data, bytes, ncclInt8, root_node, c, impl_->stream);
  });
}

Status NcclBackend::Reduce(void* data, size_t count, DType dtype, const ReduceOp& op, int root_node,
                           uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const std::optional<ncclDataType_t> type = NcclTypeOf(dtype);
  const std::optional<ncclRedOp_t> nccl_op = NcclOpOf(op);
  if (type && nccl_op) {
    return impl_->Run("ncclReduce", timeout, [&](ncclComm_t c) {
      return ncclReduce(data, data, count, *type, *nccl_op, root_node, c, impl_->stream);
    });
  }
  // Elsewhere than on the root the buffer is scratch: an allreduce is a valid reduce.
  return AllReduce(data, count, dtype, op, tag, timeout);
}

Status NcclBackend::AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                               uint32_t, Ms timeout) {
  if (node_count_ == 1) {
    if (bytes_per_node[0] > 0 && in != out) return Copy(out, in, bytes_per_node[0]);
    return Status::Ok();
  }
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  const bool equal = std::all_of(bytes_per_node.begin(), bytes_per_node.end(),
                                 [&](size_t b) { return b == bytes_per_node[0]; });
  if (equal) {
    return impl_->Run("ncclAllGather", timeout, [&](ncclComm_t c) {
      return ncclAllGather(in, out, bytes_per_node[0], ncclInt8, c, impl_->stream);
    });
  }
  // Unequal sizes: one broadcast per node, fused into one NCCL group.
  return impl_->Run("ncclBroadcast (allgather)", timeout, [&](ncclComm_t c) {
    ncclResult_t result = ncclGroupStart();
    size_t offset = 0;
    for (int node = 0; node < node_count_ && result == ncclSuccess; ++node) {
      std::byte* slice = static_cast<std::byte*>(out) + offset;
      const size_t bytes = bytes_per_node[static_cast<size_t>(node)];
      if (bytes > 0) {
        result = ncclBroadcast(node == node_rank_ ? in : slice, slice, bytes, ncclInt8, node, c,
                               impl_->stream);
      }
      offset += bytes;
    }
    const ncclResult_t ended = ncclGroupEnd();
    return result == ncclSuccess ? ended : result;
  });
}

Status NcclBackend::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                              const std::vector<int64_t>& recv_bytes, uint32_t, Ms timeout) {
  if (node_count_ == 1) {
    if (send_bytes[0] > 0) return Copy(out, in, static_cast<size_t>(send_bytes[0]));
    return Status::Ok();
  }
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  return impl_->Run("ncclSend/ncclRecv (alltoall)", timeout, [&](ncclComm_t c) {
    ncclResult_t result = ncclGroupStart();
    int64_t send_offset = 0;
    int64_t recv_offset = 0;
    for (int node = 0; node < node_count_ && result == ncclSuccess; ++node) {
      const auto i = static_cast<size_t>(node);
      if (send_bytes[i] > 0) {
        result = ncclSend(static_cast<const std::byte*>(in) + send_offset,
                          static_cast<size_t>(send_bytes[i]), ncclInt8, node, c, impl_->stream);
      }
      if (result == ncclSuccess && recv_bytes[i] > 0) {
        result = ncclRecv(static_cast<std::byte*>(out) + recv_offset,
                          static_cast<size_t>(recv_bytes[i]), ncclInt8, node, c, impl_->stream);
      }
      send_offset += send_bytes[i];
      recv_offset += recv_bytes[i];
    }
    const ncclResult_t ended = ncclGroupEnd();
    return result == ncclSuccess ? ended : result;
  });
}

Status NcclBackend::Barrier(uint32_t, Ms timeout) {
  if (node_count_ == 1) return Status::Ok();
  COLLECTIVED_RETURN_IF_ERROR(impl_->SetDevice());
  StatusOr<std::byte*> word = impl_->Buffer(3, sizeof(int32_t));
  if (!word.ok()) return word.status();
  return impl_->Run("ncclAllReduce (barrier)", timeout, [&](ncclComm_t c) {
    return ncclAllReduce(*word, *word, 1, ncclInt32, ncclSum, c, impl_->stream);
  });
}

void NcclBackend::Abort() {
  // A call waiting for NCCL under the lock (ncclInProgress: a peer died) gives it up first.
  impl_->abort_requested.store(true);
  std::lock_guard<std::mutex> lock(impl_->abort_mutex);
  if (impl_->aborted.exchange(true)) return;
  if (impl_->comm != nullptr) {
    cudaSetDevice(impl_->device);
    ncclCommAbort(impl_->comm);
    impl_->comm = nullptr;
  }
}

}  // namespace collectived
