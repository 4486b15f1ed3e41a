#include "engine/cuda/pinned_host_pages.h"

#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_errors.h"

namespace collectived {

StatusOr<std::shared_ptr<PinnedHostPages>> PinnedHostPages::Register(void* data, size_t bytes) {
  const cudaError_t pinned =
      cudaHostRegister(data, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (pinned != cudaSuccess) {
    return CudaStatus(pinned, "cudaHostRegister of stream-signal words", ErrorKind::kUnavailable);
  }
  return std::shared_ptr<PinnedHostPages>(new PinnedHostPages(data));
}

PinnedHostPages::~PinnedHostPages() {
  if (cudaHostUnregister(data_) != cudaSuccess) cudaGetLastError();
}

StatusOr<CUdeviceptr> PinnedHostPages::DeviceAddress(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, fresh] = device_base_.try_emplace(device, 0);
  if (!fresh) return it->second;
  void* base = nullptr;
  const cudaError_t found = cudaHostGetDevicePointer(&base, data_, 0);
  if (found != cudaSuccess) {
    device_base_.erase(it);
    return CudaStatus(found, "cudaHostGetDevicePointer of stream-signal words",
                      ErrorKind::kUnavailable);
  }
  it->second = reinterpret_cast<CUdeviceptr>(base);
  return it->second;
}

}  // namespace collectived
