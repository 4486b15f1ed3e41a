// Device memory a client shares with its sidecar: how a request references it (DeviceTensorRef)
// and the per-session importer that turns a reference into a TensorView the engine can use
// (a CUDA IPC handle opened once and cached, see IpcMappingCache and engine/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/status.h"
#include "engine/tensor.h"

namespace collectived {

// A device tensor as the client names it: an allocation it exported (an opaque handle, 64
// bytes for CUDA IPC), a byte range inside it, the device ordinal, and optionally an event the
// client recorded after its last write (the sidecar's work waits for it).
struct DeviceTensorRef {
  int device = 0;
  std::string memory_handle;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string event_handle;  // empty: no ordering asked for
};

// Opens device memory for one session. Thread-safety: Import may be called from any thread.
class DeviceMemoryImporter {
 public:
  virtual ~DeviceMemoryImporter() = default;
  // A view of `count` elements of `dtype` at `ref` (whose length must be count * size), its
  // mapping held open by the view's owner. InvalidArgument for a handle the driver refuses, a
  // range outside the allocation or a length that does not match; ResourceExhausted when the
  // session holds too many mappings in use.
  virtual StatusOr<TensorView> Import(const DeviceTensorRef& ref, DType dtype, size_t count) = 0;
  // The allocations currently open (for describe and tests).
  virtual size_t OpenMappings() const = 0;
};

// The importer this sidecar was built with: CUDA IPC with the GPU backend; otherwise
// FailedPrecondition-style InvalidArgument naming the missing backend.
StatusOr<std::unique_ptr<DeviceMemoryImporter>> MakeDeviceMemoryImporter();

}  // namespace collectived
