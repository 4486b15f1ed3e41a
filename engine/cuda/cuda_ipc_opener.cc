#include "engine/cuda/cuda_ipc_opener.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "engine/cuda/cuda_allocation.h"
#include "engine/cuda/cuda_errors.h"
#include "engine/cuda/cuda_ipc_event.h"

namespace collectived {

StatusOr<IpcOpener::Allocation> CudaIpcOpener::OpenMemory(int device, std::string_view handle) {
  cudaIpcMemHandle_t ipc{};
  if (handle.size() != sizeof(ipc)) {
    return Status::InvalidArgument("CUDA IPC memory handle of " + std::to_string(handle.size()) +
                                   " bytes; cudaIpcMemHandle_t has " + std::to_string(sizeof(ipc)));
  }
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                                         "cudaSetDevice(" + std::to_string(device) + ")",
                                         ErrorKind::kInvalidArgument));
  void* base = nullptr;
  const cudaError_t opened = cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    cudaGetLastError();
    Status status =
        CudaStatus(opened, "opening the CUDA IPC memory handle", ErrorKind::kInvalidArgument);
    return Status::InvalidArgument(status.message() + kLegacyIpcHint);
  }
  StatusOr<CudaAllocation> allocation = FindCudaAllocation(base);
  if (!allocation.ok()) {
    cudaIpcCloseMemHandle(base);
    return Status::Internal("the CUDA driver did not report the size of a shared allocation: " +
                            allocation.status().message());
  }
  // The handle names the start of the allocation; whatever precedes `base` is not the client's.
  const size_t before = static_cast<size_t>(static_cast<std::byte*>(base) - allocation->base);
  return Allocation{static_cast<std::byte*>(base), allocation->bytes - before};
}

void CudaIpcOpener::CloseMemory(int device, const Allocation& allocation) {
  cudaSetDevice(device);
  cudaIpcCloseMemHandle(allocation.base);
}

StatusOr<std::shared_ptr<DeviceEvent>> CudaIpcOpener::OpenEvent(int device,
                                                                std::string_view handle) {
  StatusOr<std::shared_ptr<CudaIpcEvent>> event = CudaIpcEvent::Open(device, handle);
  if (!event.ok()) return event.status();
  return std::shared_ptr<DeviceEvent>(*event);
}

}  // namespace collectived
