// A C interface to the client's CUDA tensor export (clients/cpp/cuda_tensor_export.h), for the
// Python client (collectived/cuda.py opens it with ctypes, as libcollectived_cuda.so, when the
// first CUDA tensor is passed). The tensor's memory is shared through our own CUDA IPC export
// rather than torch's storage._share_cuda_(): torch's ties a storage's release to a reference
// counter in a named /dev/shm file that the receiver must decrement, and a sidecar takes no memory
// by name.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "clients/cpp/cuda_tensor_export.h"

namespace {

// The reason of a failure, cut to fit the caller's `capacity` bytes, NUL-terminated.
void CopyError(const std::string& why, char* error, uint64_t capacity) {
  if (capacity == 0) return;
  const size_t n = std::min<size_t>(why.size(), capacity - 1);
  std::memcpy(error, why.data(), n);
  error[n] = '\0';
}

}  // namespace

extern "C" {

// 1 when the library was built with CUDA.
int collectived_cuda_available() {
  return collectived::ClientHasCuda() ? 1 : 0;
}

// Exports `bytes` bytes at device pointer `data` of `device`, ordered after the work queued on
// `stream` (a cudaStream_t as an integer; 0 = the legacy default stream). On success returns 0
// and fills the 64-byte memory and event handles and the offset in the allocation; otherwise
// returns -1 with the reason in `error`.
int collectived_cuda_export(uint64_t data, uint64_t bytes, int device, uint64_t stream,
                            char* memory_handle, char* event_handle, uint64_t* offset, char* error,
                            uint64_t error_capacity) {
  collectived::StatusOr<collectived::ExportedCudaTensor> exported = collectived::ExportCudaTensor(
      reinterpret_cast<const void*>(data), bytes, device, reinterpret_cast<void*>(stream));
  if (!exported.ok()) {
    CopyError(exported.status().message(), error, error_capacity);
    return -1;
  }
  // Both handles are 64 bytes (cudaIpcMemHandle_t, cudaIpcEventHandle_t).
  if (exported->memory_handle.size() != 64 || exported->event_handle.size() != 64) return -1;
  std::memcpy(memory_handle, exported->memory_handle.data(), 64);
  std::memcpy(event_handle, exported->event_handle.data(), 64);
  *offset = exported->offset;
  return 0;
}

// Makes `stream` of `device` wait for the sidecar's completion event whose handle is the
// `handle_bytes` bytes at `handle` (collectived::WaitForSidecarEvent). Returns 0, or -1 with the
// reason in `error`.
int collectived_cuda_wait_sidecar_event(int device, uint64_t stream, const char* handle,
                                        uint64_t handle_bytes, char* error,
                                        uint64_t error_capacity) {
  const collectived::Status waited = collectived::WaitForSidecarEvent(
      device, reinterpret_cast<void*>(stream), std::string(handle, handle_bytes));
  if (waited.ok()) return 0;
  CopyError(waited.message(), error, error_capacity);
  return -1;
}

}  // extern "C"
