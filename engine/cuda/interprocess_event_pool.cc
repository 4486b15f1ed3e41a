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

StatusOr<InterprocessEvent> InterprocessEventPool::Next(int device, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = rings_.find({device, reinterpret_cast<uintptr_t>(stream)});
  if (found == rings_.end()) {
    size_t rings_of_device = 0;
    auto least_used = rings_.end();
    for (auto it = rings_.lower_bound({device, 0}); it != rings_.end() && it->first.first == device;
         ++it) {
      ++rings_of_device;
      if (least_used == rings_.end() || it->second.last_use < least_used->second.last_use) {
        least_used = it;
      }
    }
    if (rings_of_device >= streams_per_device_ && least_used != rings_.end()) {
      ReleaseLocked(least_used);
    }
    found = rings_.emplace(Key{device, reinterpret_cast<uintptr_t>(stream)}, Ring{}).first;
    found->second.events.resize(per_stream_);
  }
  Ring& ring = found->second;
  ring.last_use = ++uses_;
  InterprocessEvent& slot = ring.events[ring.next];
  if (slot.event == nullptr) {
    std::vector<InterprocessEvent>& spare = free_[device];
    if (!spare.empty()) {
      slot = std::move(spare.back());
      spare.pop_back();
    } else {
      StatusOr<InterprocessEvent> made = make_();
      if (!made.ok()) return made.status();
      slot = std::move(*made);
    }
  }
  ring.next = (ring.next + 1) % ring.events.size();
  return slot;
}

void InterprocessEventPool::Release(int device, const void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = rings_.find({device, reinterpret_cast<uintptr_t>(stream)});
  if (found != rings_.end()) ReleaseLocked(found);
}

void InterprocessEventPool::ReleaseLocked(std::map<Key, Ring>::iterator ring) {
  std::vector<InterprocessEvent>& spare = free_[ring->first.first];
  for (InterprocessEvent& event : ring->second.events) {
    if (event.event != nullptr) spare.push_back(std::move(event));
  }
  rings_.erase(ring);
}

size_t InterprocessEventPool::EventsOf(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t events = 0;
  for (const auto& [key, ring] : rings_) {
    if (key.first != device) continue;
    for (const InterprocessEvent& event : ring.events) events += event.event != nullptr ? 1 : 0;
  }
  auto spare = free_.find(device);
  return events + (spare == free_.end() ? 0 : spare->second.size());
}

}  // namespace collectived
