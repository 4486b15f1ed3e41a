#include "engine/cuda/interprocess_event_pool.h"

#include "engine/cuda/cuda_errors.h"

namespace collectived {

StatusOr<InterprocessEvent> InterprocessEventPool::Next(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  Ring& ring = rings_[device];
  if (ring.events.empty()) ring.events.resize(per_device_);
  InterprocessEvent& slot = ring.events[ring.next];
  if (slot.event == nullptr) {
    cudaEvent_t event = nullptr;
    COLLECTIVED_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
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
  ring.next = (ring.next + 1) % ring.events.size();
  return slot;
}

}  // namespace collectived
