// IpcMappingCache: a session's open device allocations, keyed by (device, handle bytes), so that
// each allocation a client shares is opened once and reused by later ops. A handle names one
// allocation for its whole life: an allocation the client freed and the next one it makes at the
// same address have different handles, so a stale mapping is never found for a new tensor.
//
// Bounded: at most `max_mappings` allocations stay cached; past that the least recently used
// one is dropped from the cache and closed as soon as no op in flight still uses it (every
// TensorView holds its mapping). The same holds for events. Everything closes when the cache
// and the last op using it are gone (the session ended).
//
// The device calls go through an IpcOpener: CudaIpcOpener (engine/cuda/) in the sidecar.
//
// Thread-safety: Import may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "engine/device_memory.h"

namespace collectived {

// The device operations behind an IpcMappingCache.
class IpcOpener {
 public:
  struct Allocation {
    std::byte* base = nullptr;  // where the allocation is mapped in this process
    size_t bytes = 0;           // its real size, as the driver reports it
  };
  virtual ~IpcOpener() = default;
  virtual DeviceKind kind() const = 0;
  // Opens the allocation behind `handle` on `device`; InvalidArgument when the driver refuses.
  virtual StatusOr<Allocation> OpenMemory(int device, std::string_view handle) = 0;
  virtual void CloseMemory(int device, const Allocation& allocation) = 0;
  virtual StatusOr<std::shared_ptr<DeviceEvent>> OpenEvent(int device, std::string_view handle) = 0;
};

class IpcMappingCache final : public DeviceMemoryImporter {
 public:
  static constexpr size_t kDefaultMaxMappings = 256;
  static constexpr size_t kDefaultMaxEvents = 64;

  explicit IpcMappingCache(std::shared_ptr<IpcOpener> opener,
                           size_t max_mappings = kDefaultMaxMappings,
                           size_t max_events = kDefaultMaxEvents);

  StatusOr<TensorView> Import(const DeviceTensorRef& ref, DType dtype, size_t count) override;
  size_t OpenMappings() const override;
  // How many times an allocation was opened (cache misses), for tests and describe.
  uint64_t opens() const;

 private:
  struct Mapping;
  using Key = std::pair<int, std::string>;
  template <typename Value>
  struct Lru {
    std::list<Key> order;  // most recent first
    std::map<Key, std::pair<Value, std::list<Key>::iterator>> entries;
  };

  StatusOr<std::shared_ptr<Mapping>> MappingFor(int device, const std::string& handle);
  StatusOr<std::shared_ptr<DeviceEvent>> EventFor(int device, const std::string& handle);

  const std::shared_ptr<IpcOpener> opener_;
  const size_t max_mappings_;
  const size_t max_events_;
  mutable std::mutex mutex_;
  Lru<std::shared_ptr<Mapping>> mappings_;    // guarded by mutex_
  Lru<std::shared_ptr<DeviceEvent>> events_;  // guarded by mutex_
  uint64_t opens_ = 0;                        // guarded by mutex_
  // Open allocations, cached or not; each Mapping holds it.
  const std::shared_ptr<std::atomic<size_t>> open_count_;
};

}  // namespace collectived
