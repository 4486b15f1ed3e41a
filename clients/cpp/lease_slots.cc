#include "clients/cpp/lease_slots.h"

#include <algorithm>

namespace collectived {

LeaseSlots::LeaseSlots(size_t max_slots) : max_slots_(std::max<size_t>(max_slots, 1)) {}

std::optional<size_t> LeaseSlots::Acquire(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (free_.empty() && made_ < max_slots_) return made_++;
  if (!released_.wait_for(lock, timeout, [this] { return !free_.empty(); })) return std::nullopt;
  const size_t slot = *free_.begin();
  free_.erase(free_.begin());
  return slot;
}

void LeaseSlots::Release(size_t slot) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (slot >= made_ || !free_.insert(slot).second) return;
  }
  released_.notify_one();
}

size_t LeaseSlots::made() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return made_;
}

size_t LeaseSlots::taken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return made_ - free_.size();
}

}  // namespace collectived
