#include "engine/memory/ipc_mapping_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace collectived {

// One imported VMM physical allocation; released when the cache and every mapping of it let go.
struct IpcMappingCache::VmmRegistration {
  std::shared_ptr<IpcOpener> opener;
  int device = 0;
  IpcOpener::VmmImport import;
  ~VmmRegistration() { opener->ReleaseVmm(device, import); }
};

// One open allocation (or VMM allocations mapped together); closed when the cache and every
// view using it let go.
struct IpcMappingCache::Mapping {
  std::shared_ptr<IpcOpener> opener;
  int device = 0;
  IpcOpener::Allocation allocation;
  std::vector<std::shared_ptr<VmmRegistration>> vmm_parts;  // empty: a CUDA IPC mapping
  std::shared_ptr<std::atomic<size_t>> open_count;
  ~Mapping() {
    if (vmm_parts.empty()) {
      opener->CloseMemory(device, allocation);
    } else {
      opener->UnmapVmm(device, allocation);
    }
    open_count->fetch_sub(1);
  }
};

StatusOr<IpcOpener::VmmImport> IpcOpener::ImportVmm(int, int fd, uint64_t) {
  close(fd);
  return Status::InvalidArgument("this sidecar's " + std::string(DeviceKindName(kind())) +
                                 " backend cannot import VMM memory");
}

void IpcOpener::ReleaseVmm(int, const VmmImport&) {}

StatusOr<IpcOpener::Allocation> IpcOpener::MapVmm(int, const std::vector<VmmImport>&) {
  return Status::InvalidArgument("this sidecar's " + std::string(DeviceKindName(kind())) +
                                 " backend cannot map VMM memory");
}

void IpcOpener::UnmapVmm(int, const Allocation&) {}

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
                                 size_t max_events, size_t max_vmm_registrations)
    : opener_(std::move(opener)),
      max_mappings_(max_mappings == 0 ? 1 : max_mappings),
      max_events_(max_events == 0 ? 1 : max_events),
      max_vmm_registrations_(max_vmm_registrations),
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

StatusOr<std::shared_ptr<IpcMappingCache::Mapping>> IpcMappingCache::VmmMappingFor(
    const DeviceTensorRef& ref, const std::string& where) {
  const std::vector<uint64_t>& ids = ref.vmm_registrations;
  if (ids.size() > kMaxVmmAllocationsPerTensor) {
    return Status::InvalidArgument(where + ": spans " + std::to_string(ids.size()) +
                                   " VMM allocations; at most " +
                                   std::to_string(kMaxVmmAllocationsPerTensor) + " are accepted");
  }
  // VMM mappings share the LRU with IPC ones under a key whose device is ~device (negative, so
  // never an IPC key) and whose bytes are the registration ids.
  std::string handle(ids.size() * sizeof(uint64_t), '\0');
  std::memcpy(handle.data(), ids.data(), handle.size());
  Key key{~ref.device, handle};
  if (auto* cached = Touch(mappings_, key)) return *cached;
  std::vector<std::shared_ptr<VmmRegistration>> parts;
  std::vector<IpcOpener::VmmImport> imports;
  for (uint64_t id : ids) {
    auto found = vmm_.find(id);
    if (found == vmm_.end()) {
      return Status::InvalidArgument(where + ": VMM registration " + std::to_string(id) +
                                     " is not one of this session's");
    }
    if (found->second->device != ref.device) {
      return Status::InvalidArgument(
          where + ": VMM registration " + std::to_string(id) + " is memory of device " +
          std::to_string(found->second->device) + ", not of device " + std::to_string(ref.device));
    }
    parts.push_back(found->second);
    imports.push_back(found->second->import);
  }
  StatusOr<IpcOpener::Allocation> mapped = opener_->MapVmm(ref.device, imports);
  if (!mapped.ok()) return mapped.status().WithContext(where);
  ++opens_;
  open_count_->fetch_add(1);
  auto mapping = std::make_shared<Mapping>();
  mapping->opener = opener_;
  mapping->device = ref.device;
  mapping->allocation = *mapped;
  mapping->vmm_parts = std::move(parts);
  mapping->open_count = open_count_;
  Insert(mappings_, std::move(key), mapping, max_mappings_);
  return mapping;
}

StatusOr<uint64_t> IpcMappingCache::RegisterVmm(int fd, uint64_t bytes, int device) {
  const std::string where = std::string(DeviceKindName(opener_->kind())) + ":" +
                            std::to_string(device) + " VMM allocation";
  if (device < 0) {
    close(fd);
    return Status::InvalidArgument(where + ": negative device ordinal");
  }
  if (bytes == 0) {
    close(fd);
    return Status::InvalidArgument(where + ": size 0");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (vmm_.size() >= max_vmm_registrations_) {
    close(fd);
    return Status::ResourceExhausted(where + ": the session has registered " +
                                     std::to_string(vmm_.size()) +
                                     " VMM allocations already, the most a session may");
  }
  StatusOr<IpcOpener::VmmImport> imported = opener_->ImportVmm(device, fd, bytes);
  if (!imported.ok()) return imported.status().WithContext(where);
  auto registration = std::make_shared<VmmRegistration>();
  registration->opener = opener_;
  registration->device = device;
  registration->import = *imported;
  const uint64_t id = next_vmm_id_++;
  vmm_.emplace(id, std::move(registration));
  return id;
}

Status IpcMappingCache::UnregisterVmm(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = vmm_.find(id);
  if (found == vmm_.end()) {
    return Status::NotFound("VMM registration " + std::to_string(id) +
                            " is not one of this session's");
  }
  const VmmRegistration* gone = found->second.get();
  vmm_.erase(found);
  // The cached mappings that use it go too (ops in flight keep theirs until they complete).
  for (auto it = mappings_.order.begin(); it != mappings_.order.end();) {
    auto entry = mappings_.entries.find(*it);
    const auto& parts = entry->second.first->vmm_parts;
    bool uses = false;
    for (const auto& part : parts) uses = uses || part.get() == gone;
    if (uses) {
      mappings_.entries.erase(entry);
      it = mappings_.order.erase(it);
    } else {
      ++it;
    }
  }
  return Status::Ok();
}

size_t IpcMappingCache::VmmRegistrations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return vmm_.size();
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
  const bool vmm = !ref.vmm_registrations.empty();
  StatusOr<std::shared_ptr<Mapping>> mapping =
      vmm ? VmmMappingFor(ref, where) : MappingFor(ref.device, ref.memory_handle);
  if (!mapping.ok()) return vmm ? mapping.status() : mapping.status().WithContext(where);
  const size_t size = (*mapping)->allocation.bytes;
  if (ref.offset > size || ref.length > size - ref.offset) {
    return Status::InvalidArgument(
        where + ": bytes [" + std::to_string(ref.offset) + ", " + std::to_string(ref.offset) +
        " + " + std::to_string(ref.length) + ") lie outside its " +
        (vmm ? std::to_string(ref.vmm_registrations.size()) + " VMM allocations of " +
                   std::to_string(size) + " bytes in all"
             : "allocation of " + std::to_string(size) + " bytes"));
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
