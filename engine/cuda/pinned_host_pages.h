// PinnedHostPages: host pages registered with CUDA (cudaHostRegister, mapped and portable) so that
// GPU streams can read and write them, such as the stream-signal words a trainer and its sidecar
// share; unregistered when the last holder lets go, before the caller unmaps them. Each device
// reaches the pages at an address of its own, looked up once per device.
//
// Thread-safety: DeviceAddress may be called from any thread.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "engine/vocabulary/status.h"

namespace collectived {

class PinnedHostPages {
 public:
  // Registers `bytes` bytes of page-aligned host memory at `data`. Unavailable with CUDA's words
  // when the driver refuses; no CUDA error is left pending for the thread's next launch.
  static StatusOr<std::shared_ptr<PinnedHostPages>> Register(void* data, size_t bytes);

  PinnedHostPages(const PinnedHostPages&) = delete;
  PinnedHostPages& operator=(const PinnedHostPages&) = delete;
  ~PinnedHostPages();

  // The address at which `device` (current) reaches the pages' start. Unavailable with CUDA's
  // words when the device cannot map them (no CUDA error left pending).
  StatusOr<CUdeviceptr> DeviceAddress(int device);

 private:
  explicit PinnedHostPages(void* data) : data_(data) {}

  void* const data_;
  std::mutex mutex_;
  std::map<int, CUdeviceptr> device_base_;  // guarded by mutex_
};

}  // namespace collectived
