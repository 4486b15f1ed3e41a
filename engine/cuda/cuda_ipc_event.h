// CudaIpcEvent: a CUDA event another process recorded and shared with cudaIpcGetEventHandle — a
// trainer's "my writes to this tensor are enqueued before this point". The GPU backend makes its
// stream wait on it (no CPU wait). Only the GPU backend includes this.
//
// Thread-safety: immutable after Open; destroyed on any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string_view>

#include "engine/vocabulary/status.h"
#include "engine/vocabulary/tensor.h"

namespace collectived {

class CudaIpcEvent final : public DeviceEvent {
 public:
  // Opens the 64-byte cudaIpcEventHandle_t in `handle` on `device`. InvalidArgument for a
  // handle of the wrong size or one the driver refuses (naming the CUDA error).
  static StatusOr<std::shared_ptr<CudaIpcEvent>> Open(int device, std::string_view handle);
  ~CudaIpcEvent() override;

  cudaEvent_t event() const { return event_; }
  int device() const { return device_; }

 private:
  CudaIpcEvent(int device, cudaEvent_t event) : device_(device), event_(event) {}
  const int device_;
  const cudaEvent_t event_;
};

}  // namespace collectived
