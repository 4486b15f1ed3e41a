#include "clients/cpp/cuda_tensor_export.h"

#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/cuda/cuda_allocation.h"
#include "engine/cuda/cuda_errors.h"
#include "engine/cuda/cuda_ipc_event.h"
#include "engine/cuda/interprocess_event_pool.h"

namespace collectived {
namespace {

// Enough that a sidecar rarely waits on a later recording than the one it was given, few enough
// that its per-session event cache (64 entries) keeps them all open.
constexpr size_t kEventsPerDevice = 16;

InterprocessEventPool& Events() {
  static auto* pool = new InterprocessEventPool(kEventsPerDevice);  // never destroyed: sidecars
  return *pool;                                                     // may hold its events
}

// The sidecars' completion events this process opened, by handle. A sidecar never destroys its
// events (InterprocessEventPool), so a handle keeps naming one event; the bound only matters
// across sidecar restarts, whose old handles are then closed oldest first.
class OpenedEvents {
 public:
  StatusOr<std::shared_ptr<CudaIpcEvent>> Get(int device, const std::string& handle) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = std::to_string(device) + ":" + handle;
    if (auto it = events_.find(key); it != events_.end()) return it->second;
    StatusOr<std::shared_ptr<CudaIpcEvent>> opened = CudaIpcEvent::Open(device, handle);
    if (!opened.ok()) return opened.status();
    if (order_.size() >= kMaxOpened) {
      events_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(key);
    events_.emplace(key, *opened);
    return *opened;
  }

 private:
  static constexpr size_t kMaxOpened = 256;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<CudaIpcEvent>> events_;  // guarded by mu_
  std::deque<std::string> order_;                                // guarded by mu_; oldest first
};

OpenedEvents& Opened() {
  static auto* opened = new OpenedEvents();  // never destroyed: the CUDA runtime may go first
  return *opened;
}

// Makes `device` current for its lifetime and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")",
                         ErrorKind::kInvalidArgument);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

}  // namespace

bool ClientHasCuda() {
  return true;
}

StatusOr<ExportedCudaTensor> ExportCudaTensor(const void* data, size_t bytes, int device,
                                              void* stream) {
  if (data == nullptr) return Status::InvalidArgument("CUDA tensor without a device pointer");
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    cudaGetLastError();
    return Status::InvalidArgument("the CUDA runtime does not know the tensor's pointer");
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return Status::InvalidArgument(
        attributes.type == cudaMemoryTypeManaged
            ? std::string("the tensor is in CUDA managed memory, which CUDA IPC cannot share")
            : std::string("the tensor's pointer is host memory, not CUDA device memory"));
  }
  if (attributes.device != device) {
    return Status::InvalidArgument("the tensor lives on CUDA device " +
                                   std::to_string(attributes.device) + ", not on device " +
                                   std::to_string(device) + " as given");
  }
  StatusOr<CudaAllocation> found = FindCudaAllocation(data);
  if (!found.ok()) return found.status();
  const CudaAllocation allocation = *found;
  const size_t offset = static_cast<size_t>(static_cast<const std::byte*>(data) - allocation.base);
  if (offset > allocation.bytes || bytes > allocation.bytes - offset) {
    return Status::InvalidArgument("the tensor's " + std::to_string(bytes) + " bytes at offset " +
                                   std::to_string(offset) + " overrun its CUDA allocation of " +
                                   std::to_string(allocation.bytes) + " bytes");
  }
  cudaIpcMemHandle_t memory{};
  const cudaError_t shared = cudaIpcGetMemHandle(&memory, allocation.base);
  if (shared != cudaSuccess) {
    cudaGetLastError();
    Status why = CudaStatus(shared, "cudaIpcGetMemHandle", ErrorKind::kInvalidArgument);
    return Status::InvalidArgument(why.message() + kLegacyIpcHint);
  }
  StatusOr<InterprocessEvent> pooled = Events().Next(device);
  if (!pooled.ok()) return pooled.status();
  const InterprocessEvent event = *pooled;
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(event.event, static_cast<cudaStream_t>(stream)),
                 "recording the tensor's CUDA event on its stream", ErrorKind::kInvalidArgument));

  ExportedCudaTensor exported;
  exported.device = device;
  exported.memory_handle.assign(reinterpret_cast<const char*>(&memory), sizeof(memory));
  exported.offset = offset;
  exported.length = bytes;
  exported.event_handle = event.handle;
  return exported;
}

Status WaitForSidecarEvent(int device, void* stream, const std::string& event_handle) {
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  StatusOr<std::shared_ptr<CudaIpcEvent>> event = Opened().Get(device, event_handle);
  if (!event.ok()) return event.status().WithContext("the sidecar's completion event");
  return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), (*event)->event(), 0),
                    "ordering the stream after the sidecar's completion event",
                    ErrorKind::kInvalidArgument);
}

}  // namespace collectived
