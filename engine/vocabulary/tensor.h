// TensorView: a dtype, an element count, the device the memory lives on and the memory the engine
// reads and writes in place (a range of a registered shared-memory segment, a heap buffer holding
// inline bytes, or, for a GPU backend, device memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "engine/vocabulary/dtype.h"

namespace collectived {

// The kind of memory a tensor lives in; a group's data backend serves exactly one kind.
enum class DeviceKind : int32_t {
  kCpu = 0,   // host memory: shared memory or heap
  kCuda = 1,  // device memory of a CUDA GPU
};

std::string_view DeviceKindName(DeviceKind kind);  // "cpu", "cuda"

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // GPU ordinal for kCuda; 0 for kCpu
  bool operator==(const Device&) const = default;
};

// Marks the point in a producer's stream after which a device tensor may be read (a CUDA event
// the trainer recorded). Opaque to the engine: the device backend that serves the tensor's
// device knows the concrete type.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

struct TensorView {
  DType dtype = DType::kUnspecified;
  size_t count = 0;
  std::byte* data = nullptr;
  // Keeps the memory alive while an op uses it (the mapping of a segment, an inline buffer).
  std::shared_ptr<void> owner;
  Device device;
  // Device tensors: the backend's work on this op waits for it (DataBackend::AwaitReady).
  std::shared_ptr<DeviceEvent> ready;

  size_t bytes() const { return count * DTypeSize(dtype); }
  // A view of `n` elements starting at element `first`, sharing the owner and the device.
  TensorView Slice(size_t first, size_t n) const {
    return TensorView{dtype, n, data + first * DTypeSize(dtype), owner, device, ready};
  }
};

inline std::string_view DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kCuda ? "cuda" : "cpu";
}

}  // namespace collectived
