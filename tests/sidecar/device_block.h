// CUDA device memory for the GPU tests of the sidecar: a cudaMalloc'd block freed with the
// object, and copies between it and host memory. Without the GPU backend every call fails,
// saying so (the GPU tests skip before they get here).
#pragma once

#include <cstddef>
#include <memory>

#include "engine/vocabulary/status.h"

namespace collectived::sidecar_test {

class DeviceBlock {
 public:
  // `bytes` bytes of device memory on CUDA device `device`, holding `bytes` bytes of `init`.
  static StatusOr<std::shared_ptr<DeviceBlock>> Allocate(int device, size_t bytes,
                                                         const void* init);
  ~DeviceBlock();
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }

 private:
  DeviceBlock(int device, std::byte* data, size_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  int device_;
  std::byte* data_;
  size_t bytes_;
};

// A CUDA stream of its own on `device` that does not synchronise with the legacy default stream:
// one per trainer where trainers share a process, as they would each have their own in theirs.
class DeviceStream {
 public:
  static StatusOr<std::unique_ptr<DeviceStream>> Create(int device);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  void* get() const { return stream_; }  // a cudaStream_t

 private:
  DeviceStream(int device, void* stream) : device_(device), stream_(stream) {}
  int device_;
  void* stream_;
};

// Copies `bytes` bytes of device memory of `device` at `source` to host memory at `target`,
// after every stream of the device has finished (the sidecar's work is in another process:
// completion of its op was reported before this is called).
Status CopyFromDevice(int device, const void* source, void* target, size_t bytes);

}  // namespace collectived::sidecar_test
