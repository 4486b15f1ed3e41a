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
// VMM memory (CUDA's cuMemCreate allocations, such as PyTorch's expandable_segments) arrives
// differently: each physical allocation is registered once (RegisterVmm: the client's file
// descriptor is imported and kept for the session's life, at most `max_vmm_registrations` of
// them), and a tensor names the allocations it spans in address order. Each distinct sequence of
// registrations is mapped contiguously once into a reserved address range and cached with the
// IPC mappings under the same bound; the imports are released when the cache is gone and no
// mapping uses them.
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
#include <vector>

#include "engine/memory/device_memory.h"

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

  // VMM: one imported physical allocation, as the opener names it.
  struct VmmImport {
    uint64_t handle = 0;  // the opener's (CUmemGenericAllocationHandle)
    size_t bytes = 0;     // its size, checked against the driver
  };
  // Imports the allocation behind `fd` (taken: closed whatever the outcome), which the client
  // says is `bytes` long, on `device`. InvalidArgument when the driver refuses the descriptor or
  // the size is wrong. The default refuses: an opener without VMM support.
  virtual StatusOr<VmmImport> ImportVmm(int device, int fd, uint64_t bytes);
  virtual void ReleaseVmm(int device, const VmmImport& import);
  // Maps `parts` whole and contiguously, in order, into one fresh address range readable and
  // writable by `device`; the Allocation is the whole range.
  virtual StatusOr<Allocation> MapVmm(int device, const std::vector<VmmImport>& parts);
  // Unmaps and frees the range MapVmm returned (the imports stay, released by ReleaseVmm).
  virtual void UnmapVmm(int device, const Allocation& mapping);
};

class IpcMappingCache final : public DeviceMemoryImporter {
 public:
  static constexpr size_t kDefaultMaxMappings = 256;
  static constexpr size_t kDefaultMaxEvents = 64;
  static constexpr size_t kDefaultMaxVmmRegistrations = 4096;

  explicit IpcMappingCache(std::shared_ptr<IpcOpener> opener,
                           size_t max_mappings = kDefaultMaxMappings,
                           size_t max_events = kDefaultMaxEvents,
                           size_t max_vmm_registrations = kDefaultMaxVmmRegistrations);

  StatusOr<TensorView> Import(const DeviceTensorRef& ref, DType dtype, size_t count) override;
  StatusOr<uint64_t> RegisterVmm(int fd, uint64_t bytes, int device) override;
  Status UnregisterVmm(uint64_t id) override;
  size_t OpenMappings() const override;
  // The VMM allocations registered (for tests and describe).
  size_t VmmRegistrations() const;
  // How many times an allocation was opened (cache misses), for tests and describe.
  uint64_t opens() const;

 private:
  struct Mapping;
  struct VmmRegistration;
  using Key = std::pair<int, std::string>;
  template <typename Value>
  struct Lru {
    std::list<Key> order;  // most recent first
    std::map<Key, std::pair<Value, std::list<Key>::iterator>> entries;
  };

  StatusOr<std::shared_ptr<Mapping>> MappingFor(int device, const std::string& handle);
  StatusOr<std::shared_ptr<DeviceEvent>> EventFor(int device, const std::string& handle);
  // The mapping of `ref.vmm_registrations` (mutex_ held); InvalidArgument naming what is wrong.
  StatusOr<std::shared_ptr<Mapping>> VmmMappingFor(const DeviceTensorRef& ref,
                                                   const std::string& where);

  const std::shared_ptr<IpcOpener> opener_;
  const size_t max_mappings_;
  const size_t max_events_;
  const size_t max_vmm_registrations_;
  mutable std::mutex mutex_;
  Lru<std::shared_ptr<Mapping>> mappings_;                    // guarded by mutex_
  Lru<std::shared_ptr<DeviceEvent>> events_;                  // guarded by mutex_
  uint64_t opens_ = 0;                                        // guarded by mutex_
  uint64_t next_vmm_id_ = 1;                                  // guarded by mutex_
  std::map<uint64_t, std::shared_ptr<VmmRegistration>> vmm_;  // guarded by mutex_
  // Open allocations, cached or not; each Mapping holds it.
  const std::shared_ptr<std::atomic<size_t>> open_count_;
};

}  // namespace collectived
