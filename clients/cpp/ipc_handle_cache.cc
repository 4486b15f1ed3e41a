#include "clients/cpp/ipc_handle_cache.h"

#include <algorithm>
#include <utility>

namespace collectived {

IpcHandleCache::IpcHandleCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

std::optional<std::string> IpcHandleCache::Find(int device, uint64_t base, uint64_t bytes,
                                                uint64_t buffer_id) {
  if (buffer_id == kNoBufferId) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = entries_.find(Key{device, base});
  if (found == entries_.end() || found->second.buffer_id != buffer_id ||
      found->second.bytes != bytes) {
    return std::nullopt;
  }
  found->second.last_used = ++clock_;
  return found->second.handle;
}

void IpcHandleCache::Put(int device, uint64_t base, uint64_t bytes, uint64_t buffer_id,
                         std::string handle) {
  if (buffer_id == kNoBufferId) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const Key key{device, base};
  if (entries_.count(key) == 0 && entries_.size() >= capacity_) {
    // Rare (thousands of live allocations): a scan for the least recently used is cheap enough.
    auto oldest = std::min_element(
        entries_.begin(), entries_.end(),
        [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
    entries_.erase(oldest);
  }
  entries_[key] = Entry{bytes, buffer_id, std::move(handle), ++clock_};
}

size_t IpcHandleCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace collectived
