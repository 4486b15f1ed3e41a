// How a trainer hands a CUDA tensor to its sidecar: the CUDA IPC handle of the allocation the
// tensor lies in, the tensor's offset in it, and an interprocess event recorded on the caller's
// stream after the work already queued there, so that the sidecar's stream waits for the tensor's
// producer without a CPU synchronisation; and the way back, a stream ordered after the sidecar's
// completion event of an op (WaitForSidecarEvent). Built with CUDA when the GPU backend is;
// otherwise every export fails with a message saying so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/status.h"

namespace collectived {

struct ExportedCudaTensor {
  int device = 0;
  std::string memory_handle;  // cudaIpcMemHandle_t of the allocation (64 bytes)
  uint64_t offset = 0;        // of the tensor in the allocation
  uint64_t length = 0;
  std::string event_handle;  // cudaIpcEventHandle_t, recorded on the caller's stream
};

// Whether this client library was built with CUDA (it can export CUDA tensors).
bool ClientHasCuda();

// Exports `bytes` bytes of device memory at `data` on CUDA device `device`, ordered after the work
// queued so far on `stream` (a cudaStream_t; nullptr = the legacy default stream). The events
// come from a small per-device pool of the process, reused round-robin: a sidecar that waits on a
// later recording of one waits for more, never for less. The calling thread's current device is
// left as it was. InvalidArgument when `data` is not device memory of `device` (host, managed or
// another device's memory), names memory the legacy IPC API cannot share, or the library has no
// CUDA; the CUDA error's words are in the message.
//
// Thread-safety: may be called from any thread.
StatusOr<ExportedCudaTensor> ExportCudaTensor(const void* data, size_t bytes, int device,
                                              void* stream);

// Makes `stream` (a cudaStream_t; nullptr = the legacy default stream) of CUDA device `device`
// wait, without a CPU wait, for the work a sidecar enqueued before it recorded the event whose
// 64-byte handle is `event_handle` (CollectiveResponse.completion_event). Each handle is opened
// once and cached. The calling thread's current device is left as it was. InvalidArgument with
// CUDA's words when the handle cannot be opened or waited on, or the library has no CUDA.
//
// Thread-safety: may be called from any thread.
Status WaitForSidecarEvent(int device, void* stream, const std::string& event_handle);

}  // namespace collectived
