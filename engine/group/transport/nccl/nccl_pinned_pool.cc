// NcclBackend::Impl's pool of the pinned host buffers that point-to-point transfers are staged
// through, reused because cudaMallocHost and cudaFreeHost are slow and may wait for the device:
// a concern of its own, apart from the backend's core (nccl_backend.cc).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>

#include "engine/cuda/cuda_errors.h"
#include "engine/group/transport/nccl/nccl_backend_internal.h"

namespace collectived {

void NcclBackend::Impl::RetirePinned(void* data) {
  if (data == nullptr) return;
  std::lock_guard<std::mutex> lock(retired_pinned_mutex);
  retired_pinned.push_back(data);
}

StatusOr<NcclBackend::Impl::PinnedBuffer> NcclBackend::Impl::TakePinned(size_t bytes) {
  // Powers of two from 4 KiB, so that transfers of nearby sizes share buffers.
  size_t size = 4096;
  while (size < bytes) size *= 2;
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    auto found = pinned_free.lower_bound(size);
    // At most twice the size: a small transfer does not hold a large buffer.
    if (found != pinned_free.end() && found->first / 2 <= size) {
      PinnedBuffer buffer{found->second, found->first};
      if (buffer.size > kPinnedCacheBytes) {
        oversized_kept = false;
      } else {
        pinned_free_bytes -= buffer.size;
      }
      pinned_free.erase(found);
      return buffer;
    }
  }
  COLLECTIVED_RETURN_IF_ERROR(SetDevice());
  void* host = nullptr;
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(
      cudaMallocHost(&host, size), Where("pinned staging buffer"), ErrorKind::kResourceExhausted));
  return PinnedBuffer{host, size};
}

void NcclBackend::Impl::GivePinned(PinnedBuffer buffer) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    const bool oversized = buffer.size > kPinnedCacheBytes;
    if (oversized ? !oversized_kept : pinned_free_bytes + buffer.size <= kPinnedCacheBytes) {
      pinned_free.emplace(buffer.size, buffer.data);
      if (oversized) {
        oversized_kept = true;
      } else {
        pinned_free_bytes += buffer.size;
      }
      return;
    }
  }
  cudaSetDevice(device);  // on an executor thread with none, CUDA would make GPU 0's context
  cudaFreeHost(buffer.data);
}

}  // namespace collectived
