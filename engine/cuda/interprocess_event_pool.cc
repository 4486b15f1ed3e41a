#include "engine/cuda/interprocess_event_pool.h"

#include <utility>

#include "engine/cuda/cuda_errors.h"

namespace collectived {

StatusOr<InterprocessEvent> CreateInterprocessEvent() {
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
  InterprocessEvent made;
  made.event = event;
  made.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return made;
}

StatusOr<InterprocessEvent> InterprocessEventPool::Next(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  Ring& ring = rings_[device];
  if (ring.events.empty()) ring.events.resize(per_device_);
  InterprocessEvent& slot = ring.events[ring.next];
  if (slot.event == nullptr) {
    StatusOr<InterprocessEvent> made = CreateInterprocessEvent();
    if (!made.ok()) return made.status();
    slot = std::move(*made);
  }
  ring.next = (ring.next + 1) % ring.events.size();
  return slot;
}

}  // namespace collectived
