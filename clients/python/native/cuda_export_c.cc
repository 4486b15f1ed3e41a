// A C interface to the client's CUDA tensor export (clients/cpp/cuda_tensor_export.h), for the
// Python client (collectived/cuda.py opens it with ctypes, as libcollectived_cuda.so, when the
// first CUDA tensor is passed). The tensor's memory is shared through our own CUDA IPC export
// rather than torch's storage._share_cuda_(): torch's ties a storage's release to a reference
// counter in a named /dev/shm file that the receiver must decrement, and a sidecar takes no memory
// by name. Memory of the CUDA VMM API (PyTorch's expandable_segments) is shared as the physical
// allocations it spans, each exported once as a POSIX file descriptor that Python sends on its fd
// channel (collectived_cuda_vmm_*; the registrations are cached in Python, as CudaVmmRegistrar
// caches them in C++).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"

namespace {

// The reason of a failure, cut to fit the caller's `capacity` bytes, NUL-terminated.
void CopyError(const std::string& why, char* error, uint64_t capacity) {
  if (capacity == 0) return;
  const size_t n = std::min<size_t>(why.size(), capacity - 1);
  std::memcpy(error, why.data(), n);
  error[n] = '\0';
}

// The C side of a ready-event lease (see ReadyEventLease): `slot` in/out, null for none. A slot
// >= 0 on entry is the caller's lease of `device`, recorded again and left with the caller;
// otherwise one is taken and, when the call succeeds, handed over in *slot (given back when it
// fails).
class Leased {
 public:
  Leased(int device, int64_t* slot) : slot_(slot), borrowed_(slot != nullptr && *slot >= 0) {
    if (borrowed_) lease_ = collectived::ReadyEventLease(device, static_cast<size_t>(*slot));
  }
  ~Leased() {
    if (borrowed_) lease_.Detach();  // still the caller's
  }
  collectived::ReadyEventLease* get() { return slot_ != nullptr ? &lease_ : nullptr; }
  void Finish(bool ok) {
    if (slot_ == nullptr || borrowed_) return;
    *slot_ = ok && lease_.held() ? static_cast<int64_t>(lease_.Detach()) : -1;
  }

 private:
  int64_t* const slot_;
  const bool borrowed_;
  collectived::ReadyEventLease lease_;
};

}  // namespace

extern "C" {

// 1 when the library was built with CUDA.
int collectived_cuda_available() {
  return collectived::ClientHasCuda() ? 1 : 0;
}

// Exports `bytes` bytes at device pointer `data` of `device`, ordered after the work queued on
// `stream` (a cudaStream_t as an integer; 0 = the legacy default stream). On success returns 0
// and fills the 64-byte memory and event handles and the offset in the allocation. VMM memory
// (no legacy IPC handle): returns 1 and exports nothing where `vmm_elsewhere` (the caller shares
// it through collectived_cuda_vmm_*), else -1 with the reason. Otherwise -1 with the reason in
// `error`. One driver query per call; the allocation's IPC handle is made once and cached. With
// `ready_lease` (not null) the ready event is leased (collectived::ReadyEventLease): the caller's
// slot where *ready_lease >= 0 (one per device and op), else one taken and stored there, to give
// back with collectived_cuda_release_ready (-1 there when none was taken).
int collectived_cuda_export(uint64_t data, uint64_t bytes, int device, uint64_t stream,
                            int vmm_elsewhere, char* memory_handle, char* event_handle,
                            uint64_t* offset, int64_t* ready_lease, char* error,
                            uint64_t error_capacity) {
  const auto* pointer = reinterpret_cast<const void*>(data);
  auto* cuda_stream = reinterpret_cast<void*>(stream);
  collectived::StatusOr<collectived::CudaPointerFacts> facts =
      collectived::InspectCudaPointer(pointer, device);
  if (!facts.ok()) {
    CopyError(facts.status().message(), error, error_capacity);
    return -1;
  }
  if (facts->vmm && vmm_elsewhere != 0) return 1;
  Leased lease(device, ready_lease);
  collectived::StatusOr<collectived::ExportedCudaTensor> exported =
      facts->vmm
          ? collectived::ExportCudaTensor(pointer, bytes, device, cuda_stream, nullptr, lease.get())
          : collectived::ExportCudaIpcTensor(pointer, bytes, device, cuda_stream, *facts,
                                             lease.get());
  lease.Finish(exported.ok());
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

// Gives back a ready event that collectived_cuda_export or collectived_cuda_record_event leased.
void collectived_cuda_release_ready(int device, int64_t slot) {
  if (slot >= 0) collectived::ReleaseReadyEvent(device, static_cast<size_t>(slot));
}

// Whether the device memory at `data` of `device` is VMM memory (no legacy IPC handle): 1 when
// it is, 0 when not, -1 with the reason in `error` when the driver cannot say.
int collectived_cuda_is_vmm(uint64_t data, int device, char* error, uint64_t error_capacity) {
  collectived::StatusOr<bool> vmm =
      collectived::IsCudaVmmMemory(reinterpret_cast<const void*>(data), device);
  if (!vmm.ok()) {
    CopyError(vmm.status().message(), error, error_capacity);
    return -1;
  }
  return *vmm ? 1 : 0;
}

// The physical allocations that `bytes` bytes of VMM memory at `data` of `device` span, in
// address order: their mapped bases, sizes and retained handles (give each back with
// collectived_cuda_vmm_release, or keep it while registered) in the arrays of `capacity`
// entries. Returns their number, or -1 with the reason in `error` (then nothing is retained).
int collectived_cuda_vmm_chunks(uint64_t data, uint64_t bytes, int device, uint64_t* bases,
                                uint64_t* sizes, uint64_t* handles, uint64_t capacity, char* error,
                                uint64_t error_capacity) {
  collectived::StatusOr<std::vector<collectived::CudaVmmChunk>> chunks =
      collectived::FindCudaVmmChunks(reinterpret_cast<const void*>(data), bytes, device);
  if (!chunks.ok()) {
    CopyError(chunks.status().message(), error, error_capacity);
    return -1;
  }
  if (chunks->size() > capacity) {
    for (const auto& chunk : *chunks) collectived::ReleaseCudaVmmChunk(chunk, device);
    CopyError("the tensor spans " + std::to_string(chunks->size()) +
                  " VMM allocations, more than the caller's " + std::to_string(capacity),
              error, error_capacity);
    return -1;
  }
  for (size_t i = 0; i < chunks->size(); ++i) {
    bases[i] = (*chunks)[i].base;
    sizes[i] = (*chunks)[i].bytes;
    handles[i] = (*chunks)[i].handle;
  }
  return static_cast<int>(chunks->size());
}

// A POSIX file descriptor for the allocation `handle` (mapped at `base`, `bytes` long) of
// `device`, which the caller closes; -1 with the reason in `error`.
int collectived_cuda_vmm_export(uint64_t base, uint64_t bytes, uint64_t handle, int device,
                                char* error, uint64_t error_capacity) {
  collectived::StatusOr<int> fd =
      collectived::ExportCudaVmmChunk(collectived::CudaVmmChunk{base, bytes, handle}, device);
  if (!fd.ok()) {
    CopyError(fd.status().message(), error, error_capacity);
    return -1;
  }
  return *fd;
}

// 1 while the allocation `handle` is still mapped at `base` in this process, 0 once it is not
// (collectived::CudaVmmChunkMapped).
int collectived_cuda_vmm_mapped(uint64_t base, uint64_t handle, int device) {
  return collectived::CudaVmmChunkMapped(collectived::CudaVmmChunk{base, 0, handle}, device) ? 1
                                                                                             : 0;
}

// Gives back the reference collectived_cuda_vmm_chunks took on `handle`.
void collectived_cuda_vmm_release(uint64_t handle, int device) {
  collectived::ReleaseCudaVmmChunk(collectived::CudaVmmChunk{0, 0, handle}, device);
}

// Records an interprocess event on `stream` of `device` after the work queued there and fills
// its 64-byte handle; leased as collectived_cuda_export leases with `ready_lease`. Returns 0, or
// -1 with the reason in `error`.
int collectived_cuda_record_event(int device, uint64_t stream, char* event_handle,
                                  int64_t* ready_lease, char* error, uint64_t error_capacity) {
  Leased lease(device, ready_lease);
  collectived::StatusOr<std::string> event =
      collectived::RecordCudaEvent(device, reinterpret_cast<void*>(stream), lease.get());
  lease.Finish(event.ok());
  if (!event.ok()) {
    CopyError(event.status().message(), error, error_capacity);
    return -1;
  }
  if (event->size() != 64) return -1;
  std::memcpy(event_handle, event->data(), 64);
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

// Registers the stream-signal words at `data` (`bytes`, page-aligned host memory shared with the
// sidecar) with CUDA, `device` current (collectived::RegisterSignalWords). Returns 0, or -1 with
// the reason.
int collectived_cuda_register_signal_words(uint64_t data, uint64_t bytes, int device, char* error,
                                           uint64_t error_capacity) {
  const collectived::Status registered =
      collectived::RegisterSignalWords(reinterpret_cast<void*>(data), bytes, device);
  if (registered.ok()) return 0;
  CopyError(registered.message(), error, error_capacity);
  return -1;
}

// Makes `stream` of `device` wait until the word at `word` reaches `value`
// (collectived::WaitForSignal). Returns 0; 1 with the reason when the driver cannot wait on a
// word (the caller waits on the CPU instead); -1 with the reason for other failures.
int collectived_cuda_wait_signal(int device, uint64_t stream, uint64_t word, uint32_t value,
                                 char* error, uint64_t error_capacity) {
  const collectived::Status waited = collectived::WaitForSignal(
      device, reinterpret_cast<void*>(stream), reinterpret_cast<const uint32_t*>(word), value);
  if (waited.ok()) return 0;
  CopyError(waited.message(), error, error_capacity);
  return waited.kind() == collectived::ErrorKind::kUnavailable ? 1 : -1;
}

}  // extern "C"
