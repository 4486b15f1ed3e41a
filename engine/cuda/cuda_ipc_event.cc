#include "engine/cuda/cuda_ipc_event.h"

#include <cstring>
#include <string>

#include "engine/cuda/cuda_driver_calls.h"
#include "engine/cuda/cuda_errors.h"

namespace collectived {

StatusOr<std::shared_ptr<CudaIpcEvent>> CudaIpcEvent::Open(int device, std::string_view handle) {
  cudaIpcEventHandle_t ipc{};
  if (handle.size() != sizeof(ipc)) {
    return Status::InvalidArgument("CUDA IPC event handle of " + std::to_string(handle.size()) +
                                   " bytes; cudaIpcEventHandle_t has " +
                                   std::to_string(sizeof(ipc)));
  }
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                                         "cudaSetDevice(" + std::to_string(device) + ")",
                                         ErrorKind::kInvalidArgument));
  cudaEvent_t event = nullptr;
  const cudaError_t opened = cudaIpcOpenEventHandle(&event, ipc);
  if (opened != cudaSuccess) {
    return CudaStatus(opened, "opening the tensor's CUDA IPC event handle",
                      ErrorKind::kInvalidArgument);
  }
  return std::shared_ptr<CudaIpcEvent>(new CudaIpcEvent(device, event));
}

CudaIpcEvent::~CudaIpcEvent() {
  // Leaves the caller's device as it was: in a trainer, an event may go (evicted from a cache)
  // while torch's device is current, and a device switched behind torch's back moves its work.
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    previous = -1;
  }
  // A failure here is nobody's to see: it is taken, not left for the caller's next launch.
  auto quietly = [](cudaError_t error) {
    if (error != cudaSuccess) cudaGetLastError();
  };
  if (previous != device_) quietly(cudaSetDevice(device_));
  quietly(cudaEventDestroy(event_));
  if (previous >= 0 && previous != device_ && PrimaryContextActive(previous)) {
    quietly(cudaSetDevice(previous));
  }
}

}  // namespace collectived
