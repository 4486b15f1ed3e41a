#include "engine/ipc_mapping_cache.h"

#include <atomic>

namespace collectived {

// One open allocation; closed when the cache and every view using it let go.
struct IpcMappingCache::Mapping {
  std::shared_ptr<IpcOpener> opener;
  int device = 0;
  IpcOpener::Allocation allocation;
  std::shared_ptr<std::atomic<size_t>> open_count;
  ~Mapping() {
    opener->CloseMemory(device, allocation);
    open_count->fetch_sub(1);
  }
};

namespace {

// Moves `key` to the front of `lru` and returns its value, or null when it is not cached.
template <typename Lru>
auto* Touch(Lru& lru, const std::pair<int, std::string>& key) {
  auto found = lru.entries.find(key);
  if (found == lru.entries.end()) return static_cast<decltype(&found->second.first)>(nullptr);
  lru.order.splice(lru.order.begin(), lru.order, found->second.second);
  return &found->second.first;
}

template <typename Lru, typename Value>
void Insert(Lru& lru, std::pair<int, std::string> key, Value value, size_t capacity) {
  lru.order.push_front(key);
  lru.entries.emplace(std::move(key), std::make_pair(std::move(value), lru.order.begin()));
  while (lru.entries.size() > capacity) {
    lru.entries.erase(lru.order.back());
    lru.order.pop_back();
  }
}

}  // namespace

IpcMappingCache::IpcMappingCache(std::shared_ptr<IpcOpener> opener, size_t max_mappings,
                                 size_t max_events)
    : opener_(std::move(opener)),
      max_mappings_(max_mappings == 0 ? 1 : max_mappings),
      max_events_(max_events == 0 ? 1 : max_events),
      open_count_(std::make_shared<std::atomic<size_t>>(0)) {}

StatusOr<std::shared_ptr<IpcMappingCache::Mapping>> IpcMappingCache::MappingFor(
    int device, const std::string& handle) {
  Key key{device, handle};
  if (auto* cached = Touch(mappings_, key)) return *cached;
  StatusOr<IpcOpener::Allocation> opened = opener_->OpenMemory(device, handle);
  if (!opened.ok()) return opened.status();
  ++opens_;
  open_count_->fetch_add(1);
  auto mapping = std::make_shared<Mapping>();
  mapping->opener = opener_;
  mapping->device = device;
  mapping->allocation = *opened;
  mapping->open_count = open_count_;
  Insert(mappings_, std::move(key), mapping, max_mappings_);
  return mapping;
}

StatusOr<std::shared_ptr<DeviceEvent>> IpcMappingCache::EventFor(int device,
                                                                 const std::string& handle) {
  Key key{device, handle};
  if (auto* cached = Touch(events_, key)) return *cached;
  StatusOr<std::shared_ptr<DeviceEvent>> opened = opener_->OpenEvent(device, handle);
  if (!opened.ok()) return opened.status();
  Insert(events_, std::move(key), *opened, max_events_);
  return *opened;
}

StatusOr<TensorView> IpcMappingCache::Import(const DeviceTensorRef& ref, DType dtype,
                                             size_t count) {
  const std::string where =
      std::string(DeviceKindName(opener_->kind())) + ":" + std::to_string(ref.device) + " tensor";
  if (ref.device < 0) return Status::InvalidArgument(where + ": negative device ordinal");
  const size_t element = DTypeSize(dtype);
  if (element == 0) return Status::InvalidArgument(where + ": no dtype");
  if (count > ref.length / element || count * element != ref.length) {
    return Status::InvalidArgument(where + ": " + std::to_string(count) + " elements of " +
                                   std::string(DTypeName(dtype)) + " are not " +
                                   std::to_string(ref.length) + " bytes");
  }
  if (ref.offset % element != 0) {
    return Status::InvalidArgument(where + ": offset " + std::to_string(ref.offset) +
                                   " is not aligned to the " + std::to_string(element) +
                                   "-byte elements of " + std::string(DTypeName(dtype)));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  StatusOr<std::shared_ptr<Mapping>> mapping = MappingFor(ref.device, ref.memory_handle);
  if (!mapping.ok()) return mapping.status().WithContext(where);
  const size_t size = (*mapping)->allocation.bytes;
  if (ref.offset > size || ref.length > size - ref.offset) {
    return Status::InvalidArgument(where + ": bytes [" + std::to_string(ref.offset) + ", " +
                                   std::to_string(ref.offset + ref.length) +
                                   ") lie outside its allocation of " + std::to_string(size) +
                                   " bytes");
  }
  TensorView view;
  view.dtype = dtype;
  view.count = count;
  view.data = (*mapping)->allocation.base + ref.offset;
  view.owner = *mapping;
  view.device = Device{opener_->kind(), ref.device};
  if (!ref.event_handle.empty()) {
    StatusOr<std::shared_ptr<DeviceEvent>> event = EventFor(ref.device, ref.event_handle);
    if (!event.ok()) return event.status().WithContext(where);
    view.ready = *event;
  }
  return view;
}

size_t IpcMappingCache::OpenMappings() const {
  return open_count_->load();
}

uint64_t IpcMappingCache::opens() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return opens_;
}

}  // namespace collectived
