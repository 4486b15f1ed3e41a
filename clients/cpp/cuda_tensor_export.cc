#include "clients/cpp/cuda_tensor_export.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "clients/cpp/cuda_vmm_registrar.h"
#include "clients/cpp/ipc_handle_cache.h"
#include "clients/cpp/lease_slots.h"
#include "engine/cuda/cuda_allocation.h"
#include "engine/cuda/cuda_driver_calls.h"
#include "engine/cuda/cuda_errors.h"
#include "engine/cuda/cuda_ipc_event.h"
#include "engine/cuda/interprocess_event_pool.h"
#include "engine/cuda/pinned_host_pages.h"

namespace collectived {
namespace {

// Per stream: enough that a sidecar rarely waits on a later recording than the one it was
// given, few enough that its per-session event cache (64 entries) keeps those of a few streams
// open. A ring is given to another stream only past 1,024 streams of a device recorded on (its
// events could then name another stream's work to a sidecar that has not waited on them yet):
// PyTorch's streams are pooled, and a stream destroyed leaves its address, and its ring, to
// the next stream made there.
constexpr size_t kEventsPerStream = 16;
constexpr size_t kStreamsPerDevice = 1024;

// The key of `stream`'s ring: cudaStreamPerThread names a different stream on each thread.
const void* RingKey(void* stream) {
  thread_local const char this_thread = 0;
  return stream == cudaStreamPerThread ? static_cast<const void*>(&this_thread) : stream;
}

InterprocessEventPool& Events() {
  // Never destroyed: sidecars may hold its events.
  static auto* pool = new InterprocessEventPool(kEventsPerStream, kStreamsPerDevice);
  return *pool;
}

// The leased ready events (ReadyEventLease), per device: slots numbered by LeaseSlots, each an
// interprocess event made on first use and never destroyed (as the pool's).
class LeasedEvents {
 public:
  // A free slot of `device`, taken (never waits).
  StatusOr<size_t> Take(int device) {
    std::optional<size_t> taken = Of(device).slots.Acquire(std::chrono::milliseconds(0));
    if (!taken) {
      return Status::ResourceExhausted(
          "this process has " + std::to_string(kLeasedEventsPerDevice) + " CUDA ops on device " +
          std::to_string(device) +
          " whose ready events its sidecar has not waited on yet (stream signals), the most it "
          "may");
    }
    return *taken;
  }

  // The event of `device`'s slot `slot` (taken), made on first use; call with `device` current.
  StatusOr<InterprocessEvent> EventOf(int device, size_t slot) {
    Device& mine = Of(device);
    std::lock_guard<std::mutex> lock(mine.mutex);
    if (slot >= mine.events.size()) mine.events.resize(slot + 1);
    InterprocessEvent& event = mine.events[slot];
    if (event.event == nullptr) {
      StatusOr<InterprocessEvent> made = CreateInterprocessEvent();
      if (!made.ok()) return made.status();
      event = std::move(*made);
    }
    return event;
  }

  void Release(int device, size_t slot) { Of(device).slots.Release(slot); }
  size_t Taken(int device) { return Of(device).slots.taken(); }

 private:
  struct Device {
    LeaseSlots slots{kLeasedEventsPerDevice};
    std::mutex mutex;
    std::vector<InterprocessEvent> events;  // guarded by mutex; by slot
  };
  Device& Of(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Device>& found = devices_[device];
    if (!found) found = std::make_unique<Device>();
    return *found;
  }
  std::mutex mutex_;
  std::map<int, std::unique_ptr<Device>> devices_;  // guarded by mutex_; never shrinks
};

LeasedEvents& Leased() {
  static auto* leased = new LeasedEvents();  // never destroyed: sidecars may hold its events
  return *leased;
}

// The sidecars' completion events this process opened, by handle. A sidecar never destroys its
// events (InterprocessEventPool), so a handle keeps naming one event; the bound only matters
// across sidecar restarts, whose old handles are then closed oldest first.
class OpenedEvents {
 public:
  StatusOr<std::shared_ptr<CudaIpcEvent>> Get(int device, const std::string& handle) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = std::to_string(device) + ":" + handle;
    if (auto it = events_.find(key); it != events_.end()) return it->second;
    StatusOr<std::shared_ptr<CudaIpcEvent>> opened = CudaIpcEvent::Open(device, handle);
    if (!opened.ok()) return opened.status();
    if (order_.size() >= kMaxOpened) {
      events_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(key);
    events_.emplace(key, *opened);
    return *opened;
  }

 private:
  static constexpr size_t kMaxOpened = 256;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<CudaIpcEvent>> events_;  // guarded by mu_
  std::deque<std::string> order_;                                // guarded by mu_; oldest first
};

// Host memory registered for stream signals, by start: its length and its pinned pages.
class SignalRegistrations {
 public:
  Status Register(void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = reinterpret_cast<uintptr_t>(data);
    if (registered_.count(key) != 0) return Status::Ok();
    StatusOr<std::shared_ptr<PinnedHostPages>> pinned = PinnedHostPages::Register(data, bytes);
    if (!pinned.ok()) return pinned.status();
    registered_[key] = Registered{bytes, std::move(*pinned)};
    return Status::Ok();
  }

  void Unregister(void* data) {
    std::lock_guard<std::mutex> lock(mu_);
    registered_.erase(reinterpret_cast<uintptr_t>(data));
  }

  // The address at which `device` (current) reaches `word`: InvalidArgument when it lies in no
  // registered memory, Unavailable when the device cannot map it.
  StatusOr<CUdeviceptr> DeviceAddress(const uint32_t* word, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto at = reinterpret_cast<uintptr_t>(word);
    auto it = registered_.upper_bound(at);
    if (it == registered_.begin()) {
      return Status::InvalidArgument("the stream-signal word is in no registered memory");
    }
    --it;
    if (at + sizeof(uint32_t) > it->first + it->second.bytes) {
      return Status::InvalidArgument("the stream-signal word is in no registered memory");
    }
    StatusOr<CUdeviceptr> base = it->second.pages->DeviceAddress(device);
    if (!base.ok()) return base.status();
    return *base + (at - it->first);
  }

 private:
  struct Registered {
    size_t bytes;
    std::shared_ptr<PinnedHostPages> pages;
  };
  std::mutex mu_;
  std::map<uintptr_t, Registered> registered_;  // guarded by mu_
};

SignalRegistrations& Signals() {
  static auto* signals = new SignalRegistrations();  // never destroyed: as the events
  return *signals;
}

OpenedEvents& Opened() {
  static auto* opened = new OpenedEvents();  // never destroyed: the CUDA runtime may go first
  return *opened;
}

// Makes `device` current for its lifetime and restores the caller's device after (unless that
// device has no context yet: see the destructor). Once this
// thread has made `device` current through it (so its primary context is bound to the thread
// for the driver calls that follow), and while `device` stays current, it costs one
// cudaGetDevice, which reads the thread's state without entering the driver. (A thread that
// makes another context current through the driver API meanwhile keeps it: the runtime calls
// that follow bind the device's primary context themselves, and cuPointerGetAttributes needs
// none for unified addresses.)
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      current = -1;
    }
    if (current == device && bound_ == device) return;
    status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")",
                         ErrorKind::kInvalidArgument);
    if (!status_.ok()) return;
    bound_ = device;
    if (current != device) previous_ = current;
  }
  ~DeviceScope() {
    // Not where the previous device has no context yet: on a thread that never chose a device
    // (it reads as device 0), restoring would make GPU 0's context in every trainer of a node.
    // PyTorch leaves the device current the same way (c10::cuda::MaybeSetDevice).
    if (previous_ >= 0 && PrimaryContextActive(previous_) &&
        cudaSetDevice(previous_) == cudaSuccess) {
      bound_ = previous_;
    }
  }
  const Status& status() const { return status_; }

 private:
  static thread_local int bound_;  // the device this thread last made current here; -1: none
  int previous_ = -1;              // the device to make current again; -1: nothing to restore
  Status status_;
};

thread_local int DeviceScope::bound_ = -1;

// The IPC handles this process made, by allocation (see IpcHandleCache).
IpcHandleCache& IpcHandles() {
  static auto* handles = new IpcHandleCache();  // never destroyed: as the events
  return *handles;
}

}  // namespace

bool ClientHasCuda() {
  return true;
}

namespace {

Status NotDeviceMemory(bool managed) {
  return Status::InvalidArgument(
      managed ? std::string("the tensor is in CUDA managed memory, which CUDA IPC cannot share")
              : std::string("the tensor's pointer is host memory, not CUDA device memory"));
}

Status OnAnotherDevice(int found, int device) {
  return Status::InvalidArgument("the tensor lives on CUDA device " + std::to_string(found) +
                                 ", not on device " + std::to_string(device) + " as given");
}

// InspectCudaPointer with `device` current, through the runtime: for a driver without
// cuPointerGetAttributes' table (DriverCalls unavailable). No buffer id, so nothing is cached.
StatusOr<CudaPointerFacts> InspectWithRuntime(const void* data, int device) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    cudaGetLastError();
    return Status::InvalidArgument("the CUDA runtime does not know the tensor's pointer");
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return NotDeviceMemory(attributes.type == cudaMemoryTypeManaged);
  }
  if (attributes.device != device) return OnAnotherDevice(attributes.device, device);
  StatusOr<CudaAllocation> found = FindCudaAllocation(data);
  if (!found.ok()) return found.status();
  CudaPointerFacts facts;
  facts.base = reinterpret_cast<uint64_t>(found->base);
  facts.bytes = found->bytes;
  return facts;
}

// InspectCudaPointer with `device` current: every fact in one cuPointerGetAttributes, which
// answers for any pointer (a pointer CUDA does not know gets memory type 0).
StatusOr<CudaPointerFacts> InspectLocked(const void* data, int device) {
  StatusOr<const CudaDriverCalls*> driver = DriverCalls();
  if (!driver.ok()) return InspectWithRuntime(data, device);
  // Zeroed 8-byte slots: the driver writes booleans and enums narrower than that.
  uint64_t memory_type = 0, managed = 0, ipc_capable = 0, buffer_id = 0, start = 0, size = 0;
  int ordinal = -1;
  CUpointer_attribute asked[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,    CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
      CU_POINTER_ATTRIBUTE_BUFFER_ID,      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* answers[] = {&memory_type, &managed, &ordinal, &ipc_capable, &buffer_id, &start, &size};
  static_assert(std::size(asked) == std::size(answers));
  const CUresult queried =
      (*driver)->pointer_get_attributes(static_cast<unsigned int>(std::size(asked)), asked, answers,
                                        reinterpret_cast<CUdeviceptr>(data));
  // A driver that refuses one of the attributes: the runtime's answer and its messages.
  if (queried != CUDA_SUCCESS) return InspectWithRuntime(data, device);
  if (managed != 0) return NotDeviceMemory(true);
  if (static_cast<uint32_t>(memory_type) != CU_MEMORYTYPE_DEVICE) return NotDeviceMemory(false);
  if (ordinal != device) return OnAnotherDevice(ordinal, device);
  CudaPointerFacts facts;
  facts.vmm = ipc_capable == 0;
  facts.base = start;
  facts.bytes = size;
  facts.buffer_id = buffer_id;
  return facts;
}

StatusOr<bool> IsVmmLocked(const CudaDriverCalls& cu, const void* data) {
  int capable = 1;
  const CUresult asked =
      cu.pointer_get_attribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                               reinterpret_cast<CUdeviceptr>(data));
  COLLECTIVED_RETURN_IF_ERROR(CuStatus(asked,
                                       "asking the driver whether the tensor's memory is "
                                       "legacy-IPC capable",
                                       ErrorKind::kInvalidArgument));
  return capable == 0;
}

// The allocation mapped at `address`, retained, or 0 where nothing is mapped.
CUmemGenericAllocationHandle HandleAt(const CudaDriverCalls& cu, CUdeviceptr address) {
  CUmemGenericAllocationHandle handle = 0;
  if (cu.retain_allocation_handle(&handle, reinterpret_cast<void*>(address)) != CUDA_SUCCESS) {
    return 0;
  }
  return handle;
}

// Whether `address` is mapped to `handle` (then the mapping continues across it).
bool MapsHandle(const CudaDriverCalls& cu, CUdeviceptr address,
                CUmemGenericAllocationHandle handle) {
  const CUmemGenericAllocationHandle found = HandleAt(cu, address);
  if (found == 0) return false;
  cu.release(found);
  return found == handle;
}

// The range [base, base + size) where `handle` is mapped around `at`, which must be the whole
// allocation, mapped once: the sidecar maps allocations whole from their start, so a part of
// one would show it other bytes than the trainer's. The driver's cuMemGetAddressRange gives it
// for a mapping made by one cuMemMap (as torch's); when its answer is not exactly where the
// handle is mapped, the mapping's edges are found granule by granule instead.
StatusOr<std::pair<CUdeviceptr, size_t>> MappingOf(const CudaDriverCalls& cu, CUdeviceptr at,
                                                   CUmemGenericAllocationHandle handle) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (cu.get_address_range(&base, &size, at) == CUDA_SUCCESS && size > 0 && base <= at &&
      at - base < size && MapsHandle(cu, base, handle) && MapsHandle(cu, base + size - 1, handle) &&
      !(base > 0 && MapsHandle(cu, base - 1, handle)) && !MapsHandle(cu, base + size, handle)) {
    return std::pair{base, size};
  }
  CUmemAllocationProp props{};
  size_t granularity = 0;
  COLLECTIVED_RETURN_IF_ERROR(CuStatus(cu.get_allocation_properties(&props, handle),
                                       "reading its properties", ErrorKind::kInvalidArgument));
  COLLECTIVED_RETURN_IF_ERROR(CuStatus(
      cu.get_allocation_granularity(&granularity, &props, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      "reading its granularity", ErrorKind::kInvalidArgument));
  if (granularity == 0) return Status::InvalidArgument("the driver reports a granularity of 0");
  // At most 64 GiB of 2 MiB granules either way: far past any allocation torch makes.
  constexpr int kMaxGranules = 1 << 15;
  CUdeviceptr low = at - at % granularity;
  CUdeviceptr high = low + granularity;
  int steps = 0;
  while (low >= granularity && MapsHandle(cu, low - granularity, handle) &&
         ++steps < kMaxGranules) {
    low -= granularity;
  }
  while (MapsHandle(cu, high, handle) && ++steps < kMaxGranules) high += granularity;
  if (steps >= kMaxGranules) {
    return Status::InvalidArgument("the allocation is mapped over more than " +
                                   std::to_string(kMaxGranules) + " granules");
  }
  return std::pair{low, static_cast<size_t>(high - low)};
}

}  // namespace

StatusOr<bool> IsCudaVmmMemory(const void* data, int device) {
  StatusOr<const CudaDriverCalls*> cu = DriverCalls();
  if (!cu.ok()) return cu.status();
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  return IsVmmLocked(**cu, data);
}

StatusOr<std::vector<CudaVmmChunk>> FindCudaVmmChunks(const void* data, size_t bytes, int device) {
  StatusOr<const CudaDriverCalls*> found = DriverCalls();
  if (!found.ok()) return found.status();
  const CudaDriverCalls& cu = **found;
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  const CUdeviceptr start = reinterpret_cast<CUdeviceptr>(data);
  if (bytes > UINT64_MAX - start) {
    return Status::InvalidArgument("the tensor's range overflows the address space");
  }
  const CUdeviceptr end = start + (bytes == 0 ? 1 : bytes);
  std::vector<CudaVmmChunk> chunks;
  auto fail = [&](Status status) {
    for (const CudaVmmChunk& chunk : chunks) {
      cu.release(static_cast<CUmemGenericAllocationHandle>(chunk.handle));
    }
    return status;
  };
  for (CUdeviceptr at = start; at < end;) {
    if (chunks.size() == kMaxVmmChunks) {
      return fail(Status::InvalidArgument(
          "the tensor spans more than " + std::to_string(kMaxVmmChunks) +
          " VMM allocations, the most one tensor may (split it, or use larger segments)"));
    }
    const CUmemGenericAllocationHandle handle = HandleAt(cu, at);
    if (handle == 0) {
      return fail(Status::InvalidArgument("no VMM allocation is mapped at byte " +
                                          std::to_string(at - start) + " of the tensor"));
    }
    chunks.push_back(CudaVmmChunk{0, 0, static_cast<uint64_t>(handle)});
    StatusOr<std::pair<CUdeviceptr, size_t>> range = MappingOf(cu, at, handle);
    if (!range.ok()) {
      return fail(range.status().WithContext("the VMM mapping at byte " +
                                             std::to_string(at - start) + " of the tensor"));
    }
    const auto [base, size] = *range;
    chunks.back().base = base;
    chunks.back().bytes = size;
    at = base + size;
  }
  return chunks;
}

StatusOr<int> ExportCudaVmmChunk(const CudaVmmChunk& chunk, int device) {
  StatusOr<const CudaDriverCalls*> cu = DriverCalls();
  if (!cu.ok()) return cu.status();
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  int fd = -1;
  const CUresult exported = (*cu)->export_to_shareable_handle(
      &fd, static_cast<CUmemGenericAllocationHandle>(chunk.handle),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  Status status = CuStatus(exported,
                           "exporting a VMM allocation of " + std::to_string(chunk.bytes) +
                               " bytes as a file descriptor",
                           ErrorKind::kInvalidArgument);
  if (!status.ok()) {
    return Status::InvalidArgument(status.message() +
                                   " (the allocation was not created shareable as a POSIX file "
                                   "descriptor; PyTorch's expandable_segments are from torch 2.5 "
                                   "on; otherwise run with "
                                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)");
  }
  if (fd < 0) return Status::Internal("the CUDA driver exported no file descriptor");
  return fd;
}

bool CudaVmmChunkMapped(const CudaVmmChunk& chunk, int device) {
  StatusOr<const CudaDriverCalls*> cu = DriverCalls();
  if (!cu.ok()) return true;
  DeviceScope scope(device);
  if (!scope.status().ok()) return true;
  return MapsHandle(**cu, chunk.base, static_cast<CUmemGenericAllocationHandle>(chunk.handle));
}

void ReleaseCudaVmmChunk(const CudaVmmChunk& chunk, int device) {
  StatusOr<const CudaDriverCalls*> cu = DriverCalls();
  if (!cu.ok()) return;
  DeviceScope scope(device);
  (*cu)->release(static_cast<CUmemGenericAllocationHandle>(chunk.handle));
}

namespace {

// RecordCudaEvent with `device` current; from the leased pool where `lease` is not null (the
// slot it holds of `device`, else one taken into it).
StatusOr<std::string> RecordLocked(int device, void* stream, ReadyEventLease* lease) {
  if (lease != nullptr && !(lease->held() && lease->device() == device)) {
    StatusOr<size_t> slot = Leased().Take(device);
    if (!slot.ok()) return slot.status();
    *lease = ReadyEventLease(device, *slot);
  }
  StatusOr<InterprocessEvent> pooled = lease != nullptr ? Leased().EventOf(device, lease->slot())
                                                        : Events().Next(device, RingKey(stream));
  if (!pooled.ok()) return pooled.status();
  const InterprocessEvent event = *pooled;
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(event.event, static_cast<cudaStream_t>(stream)),
                 "recording the tensor's CUDA event on its stream", ErrorKind::kInvalidArgument));
  return event.handle;
}

// InvalidArgument unless [at, at + bytes) lies in the allocation [base, base + size).
Status CheckInAllocation(uint64_t at, size_t bytes, uint64_t base, uint64_t size) {
  if (at >= base && at - base <= size && bytes <= size - (at - base)) return Status::Ok();
  return Status::InvalidArgument("the tensor's " + std::to_string(bytes) + " bytes at offset " +
                                 std::to_string(at - base) + " overrun its CUDA allocation of " +
                                 std::to_string(size) + " bytes");
}

// ExportCudaIpcTensor with `device` current.
StatusOr<ExportedCudaTensor> ExportIpcLocked(const void* data, size_t bytes, int device,
                                             void* stream, const CudaPointerFacts& facts,
                                             ReadyEventLease* lease) {
  const auto at = reinterpret_cast<uint64_t>(data);
  COLLECTIVED_RETURN_IF_ERROR(CheckInAllocation(at, bytes, facts.base, facts.bytes));
  ExportedCudaTensor exported;
  exported.device = device;
  exported.length = bytes;
  exported.offset = at - facts.base;
  std::optional<std::string> cached =
      IpcHandles().Find(device, facts.base, facts.bytes, facts.buffer_id);
  if (cached) {
    exported.memory_handle = std::move(*cached);
  } else {
    // Once per allocation: the range the query gave must be the allocation that
    // cuMemGetAddressRange names (what the IPC handle shares); where it is not, that one is used
    // and nothing is cached.
    CudaPointerFacts checked = facts;
    StatusOr<CudaAllocation> allocation = FindCudaAllocation(data);
    if (allocation.ok() && (reinterpret_cast<uint64_t>(allocation->base) != facts.base ||
                            allocation->bytes != facts.bytes)) {
      checked.base = reinterpret_cast<uint64_t>(allocation->base);
      checked.bytes = allocation->bytes;
      checked.buffer_id = IpcHandleCache::kNoBufferId;
      COLLECTIVED_RETURN_IF_ERROR(CheckInAllocation(at, bytes, checked.base, checked.bytes));
      exported.offset = at - checked.base;
    }
    cudaIpcMemHandle_t memory{};
    const cudaError_t shared = cudaIpcGetMemHandle(&memory, reinterpret_cast<void*>(checked.base));
    if (shared != cudaSuccess) {
      Status why = CudaStatus(shared, "cudaIpcGetMemHandle", ErrorKind::kInvalidArgument);
      return Status::InvalidArgument(why.message() + kLegacyIpcHint);
    }
    exported.memory_handle.assign(reinterpret_cast<const char*>(&memory), sizeof(memory));
    IpcHandles().Put(device, checked.base, checked.bytes, checked.buffer_id,
                     exported.memory_handle);
  }
  StatusOr<std::string> event = RecordLocked(device, stream, lease);
  if (!event.ok()) return event.status();
  exported.event_handle = std::move(*event);
  return exported;
}

}  // namespace

StatusOr<std::string> RecordCudaEvent(int device, void* stream, ReadyEventLease* lease) {
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  return RecordLocked(device, stream, lease);
}

void ReleaseReadyEvent(int device, size_t slot) {
  Leased().Release(device, slot);
}

size_t LeasedReadyEvents(int device) {
  return Leased().Taken(device);
}

StatusOr<ReadyEventLease> LeaseReadyEvent(int device) {
  StatusOr<size_t> slot = Leased().Take(device);
  if (!slot.ok()) return slot.status();
  return ReadyEventLease(device, *slot);
}

StatusOr<CudaPointerFacts> InspectCudaPointer(const void* data, int device) {
  if (data == nullptr) return Status::InvalidArgument("CUDA tensor without a device pointer");
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  return InspectLocked(data, device);
}

StatusOr<ExportedCudaTensor> ExportCudaIpcTensor(const void* data, size_t bytes, int device,
                                                 void* stream, const CudaPointerFacts& facts,
                                                 ReadyEventLease* lease) {
  if (facts.vmm) {
    return Status::InvalidArgument(std::string("the tensor is in CUDA VMM memory, which has no "
                                               "legacy IPC handle") +
                                   kLegacyIpcHint);
  }
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  return ExportIpcLocked(data, bytes, device, stream, facts, lease);
}

StatusOr<ExportedCudaTensor> ExportCudaTensor(const void* data, size_t bytes, int device,
                                              void* stream, CudaVmmRegistrar* vmm,
                                              ReadyEventLease* lease) {
  if (data == nullptr) return Status::InvalidArgument("CUDA tensor without a device pointer");
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  StatusOr<CudaPointerFacts> facts = InspectLocked(data, device);
  if (!facts.ok()) return facts.status();
  if (!facts->vmm) return ExportIpcLocked(data, bytes, device, stream, *facts, lease);
  // VMM memory has no legacy IPC handle: its physical allocations go to the sidecar as fds.
  if (vmm == nullptr) {
    return Status::InvalidArgument(
        "the tensor is in CUDA VMM memory, and this export has no fd channel to share it "
        "through" +
        std::string(kLegacyIpcHint));
  }
  StatusOr<std::vector<CudaVmmChunk>> chunks = FindCudaVmmChunks(data, bytes, device);
  if (!chunks.ok()) return chunks.status();
  const uint64_t first = (*chunks)[0].base;
  ExportedCudaTensor exported;
  exported.device = device;
  exported.length = bytes;
  StatusOr<std::vector<uint64_t>> ids = vmm->Register(std::move(*chunks), device);
  if (!ids.ok()) return ids.status();
  exported.vmm_registrations = std::move(*ids);
  exported.offset = reinterpret_cast<uint64_t>(data) - first;
  StatusOr<std::string> event = RecordLocked(device, stream, lease);
  if (!event.ok()) return event.status();
  exported.event_handle = std::move(*event);
  return exported;
}

Status WaitForSidecarEvent(int device, void* stream, const std::string& event_handle) {
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  StatusOr<std::shared_ptr<CudaIpcEvent>> event = Opened().Get(device, event_handle);
  if (!event.ok()) return event.status().WithContext("the sidecar's completion event");
  return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), (*event)->event(), 0),
                    "ordering the stream after the sidecar's completion event",
                    ErrorKind::kInvalidArgument);
}

Status RegisterSignalWords(void* data, size_t bytes, int device) {
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  return Signals().Register(data, bytes);
}

void UnregisterSignalWords(void* data) {
  Signals().Unregister(data);
}

Status WaitForSignal(int device, void* stream, const uint32_t* word, uint32_t value) {
  StatusOr<const CudaDriverCalls*> driver = DriverCalls();
  if (!driver.ok()) return Status::Unavailable(driver.status().message());
  DeviceScope scope(device);
  COLLECTIVED_RETURN_IF_ERROR(scope.status());
  StatusOr<CUdeviceptr> address = Signals().DeviceAddress(word, device);
  if (!address.ok()) return address.status();
  return CuStatus((*driver)->stream_wait_value32(reinterpret_cast<CUstream>(stream), *address,
                                                 value, CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue32 on the op's stream-signal word", ErrorKind::kUnavailable);
}

}  // namespace collectived
