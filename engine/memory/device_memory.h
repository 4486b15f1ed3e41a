// Device memory a client shares with its sidecar: how a request references it (DeviceTensorRef)
// and the per-session importer that turns a reference into a TensorView the engine can use
// (a CUDA IPC handle opened once and cached, see IpcMappingCache and engine/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/vocabulary/status.h"
#include "engine/vocabulary/tensor.h"

namespace collectived {

// A device tensor as the client names it: an allocation it exported (an opaque handle, 64
// bytes for CUDA IPC), a byte range inside it, the device ordinal, and optionally an event the
// client recorded after its last write (the sidecar's work waits for it). VMM memory is named
// instead by the registrations of its physical allocations (RegisterVmm), in address order; the
// range is then counted from the first one's start and memory_handle is unused.
struct DeviceTensorRef {
  int device = 0;
  std::string memory_handle;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string event_handle;                 // empty: no ordering asked for
  std::vector<uint64_t> vmm_registrations;  // non-empty: a VMM tensor
};

// The most physical allocations one VMM tensor may span (CudaVmmRef.registration_ids).
inline constexpr size_t kMaxVmmAllocationsPerTensor = 64;

// Opens device memory for one session. Thread-safety: Import may be called from any thread.
class DeviceMemoryImporter {
 public:
  virtual ~DeviceMemoryImporter() = default;
  // A view of `count` elements of `dtype` at `ref` (whose length must be count * size), its
  // mapping held open by the view's owner. InvalidArgument for a handle the driver refuses, a
  // range outside the allocation or a length that does not match; ResourceExhausted when the
  // session holds too many mappings in use.
  // For a VMM ref: InvalidArgument naming the unknown registration, a device that is not the
  // registrations', or more than kMaxVmmAllocationsPerTensor of them.
  virtual StatusOr<TensorView> Import(const DeviceTensorRef& ref, DType dtype, size_t count) = 0;
  // Imports the VMM physical allocation behind `fd` (a POSIX file descriptor the client
  // exported; taken and closed whatever the outcome), of `bytes` bytes on `device`, for the
  // session's life, and returns the id that DeviceTensorRef::vmm_registrations names it by.
  // InvalidArgument when the driver refuses the descriptor or `bytes` is not its real size;
  // ResourceExhausted past the session's bound of registrations.
  virtual StatusOr<uint64_t> RegisterVmm(int fd, uint64_t bytes, int device) = 0;
  // Forgets the registration `id` (the client freed the memory): the allocation is released as
  // soon as no op in flight uses it. NotFound for an id that is not registered.
  virtual Status UnregisterVmm(uint64_t id) = 0;
  // The allocations currently open (for describe and tests).
  virtual size_t OpenMappings() const = 0;
};

// The importer this sidecar was built with: CUDA IPC with the GPU backend; otherwise
// FailedPrecondition-style InvalidArgument naming the missing backend.
StatusOr<std::unique_ptr<DeviceMemoryImporter>> MakeDeviceMemoryImporter();

}  // namespace collectived
