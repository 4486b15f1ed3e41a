#include "clients/cpp/cuda_tensor_export.h"

#include <cuda_runtime_api.h>

#include <array>
#include <map>
#include <mutex>

#include "engine/cuda/cuda_allocation.h"
#include "engine/cuda/cuda_errors.h"

namespace collectived {
namespace {

// Enough that a sidecar rarely waits on a later recording than the one it was given, few enough
// that its per-session event cache (64 entries) keeps them all open.
constexpr size_t kEventsPerDevice = 16;

struct PooledEvent {
  cudaEvent_t event = nullptr;
  std::string handle;
};

class EventPool {
 public:
  // The next event of `device`'s pool (created on first use). Call with `device` current.
  StatusOr<PooledEvent> Next(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    Ring& ring = rings_[device];
    PooledEvent& slot = ring.events[ring.next];
    if (slot.event == nullptr) {
      cudaEvent_t event = nullptr;
      COLLECTIVED_RETURN_IF_ERROR(CudaStatus(
          cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
          "creating an interprocess CUDA event", ErrorKind::kInvalidArgument));
      cudaIpcEventHandle_t handle{};
      const cudaError_t exported = cudaIpcGetEventHandle(&handle, event);
      if (exported != cudaSuccess) {
        cudaEventDestroy(event);
        return CudaStatus(exported, "cudaIpcGetEventHandle", ErrorKind::kInvalidArgument);
      }
      slot.event = event;
      slot.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    }
    ring.next = (ring.next + 1) % kEventsPerDevice;
    return slot;
  }

 private:
  struct Ring {
    std::array<PooledEvent, kEventsPerDevice> events;
    size_t next = 0;
  };
  std::mutex mu_;
  std::map<int, Ring> rings_;  // the events live as long as the process
};

EventPool& Events() {
  static EventPool* pool = new EventPool();  // never destroyed: sidecars may hold its events
  return *pool;
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
  StatusOr<PooledEvent> pooled = Events().Next(device);
  if (!pooled.ok()) return pooled.status();
  const PooledEvent event = *pooled;
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

}  // namespace collectived
