// How a trainer hands a CUDA tensor to its sidecar: the CUDA IPC handle of the allocation the
// tensor lies in, the tensor's offset in it, and an interprocess event recorded on the caller's
// stream after the work already queued there, so that the sidecar's stream waits for the tensor's
// producer without a CPU synchronisation; and the way back, a stream ordered after the sidecar's
// completion event of an op (WaitForSidecarEvent). Built with CUDA when the GPU backend is;
// otherwise every export fails with a message saying so.
//
// Memory of the CUDA VMM API (cuMemCreate + cuMemMap, such as PyTorch's expandable_segments)
// has no legacy IPC handle: a tensor there is exported as the physical allocations it spans
// (FindCudaVmmChunks), each handed to the sidecar once as a POSIX file descriptor
// (ExportCudaVmmChunk, through a CudaVmmRegistrar), and the tensor's offset from the first.
// The driver's calls are reached through the runtime (engine/cuda/cuda_driver_calls.h), so the
// library links no libcuda.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

class CudaVmmRegistrar;

struct ExportedCudaTensor {
  int device = 0;
  std::string memory_handle;  // cudaIpcMemHandle_t of the allocation (64 bytes); empty for VMM
  uint64_t offset = 0;        // of the tensor in the allocation (VMM: from the first one's start)
  uint64_t length = 0;
  std::string event_handle;  // cudaIpcEventHandle_t, recorded on the caller's stream
  // VMM memory: the sidecar's registration ids of the physical allocations the tensor spans,
  // in address order (CudaVmmRef.registration_ids); empty for legacy IPC memory.
  std::vector<uint64_t> vmm_registrations;
};

// One physical allocation of VMM memory as this process maps it.
struct CudaVmmChunk {
  uint64_t base = 0;    // the address where it is mapped
  uint64_t bytes = 0;   // the mapping's size: the whole allocation
  uint64_t handle = 0;  // its CUmemGenericAllocationHandle, retained (ReleaseCudaVmmChunk)
};

// Whether this client library was built with CUDA (it can export CUDA tensors).
bool ClientHasCuda();

// Gives back a leased ready event (see ReadyEventLease).
void ReleaseReadyEvent(int device, size_t slot);

class ReadyEventLease;
// How many ready events of `device` are leased now (0 without CUDA): for diagnostics and tests.
size_t LeasedReadyEvents(int device);

// A ready event of `device` leased now, for an export to record later. ResourceExhausted naming
// the device when kLeasedEventsPerDevice are out; InvalidArgument without CUDA.
StatusOr<ReadyEventLease> LeaseReadyEvent(int device);

// A ready event that an export recorded from the process's leased pool: it is not recorded again
// until the lease is given back, which the holder does once the sidecar has waited on it (the
// op's early response) or never will (the op completed, or was not submitted). Trainers whose
// streams wait on stream-signal words export with leases: a sidecar's stream that waits on a
// ready event recorded again after such a wait could wait on the trainer's stream for ever (see
// engine/cuda/interprocess_event_pool.h). The lowest free event is taken first, so the events in
// use stay about as many as the ops in flight (the sidecar caches 64 a session; more cost it an
// open per op); a new one is made where none is free, up to kLeasedEventsPerDevice per device,
// past which an export fails at once (it never waits: a completion callback may submit).
// Destroying the lease gives it back. Move-only.
inline constexpr size_t kLeasedEventsPerDevice = 4096;
class ReadyEventLease {
 public:
  ReadyEventLease() = default;
  ReadyEventLease(int device, size_t slot) : device_(device), slot_(slot) {}
  ReadyEventLease(ReadyEventLease&& other) noexcept : device_(other.device_), slot_(other.slot_) {
    other.device_ = -1;
  }
  ReadyEventLease& operator=(ReadyEventLease&& other) noexcept {
    if (this != &other) {
      Reset();
      device_ = other.device_;
      slot_ = other.slot_;
      other.device_ = -1;
    }
    return *this;
  }
  ~ReadyEventLease() { Reset(); }

  bool held() const { return device_ >= 0; }
  int device() const { return device_; }
  size_t slot() const { return slot_; }
  // Gives the lease back now.
  void Reset() {
    if (device_ >= 0) ReleaseReadyEvent(device_, slot_);
    device_ = -1;
  }
  // Hands the slot to the caller, who gives it back with ReleaseReadyEvent (the C interface).
  size_t Detach() {
    device_ = -1;
    return slot_;
  }

 private:
  int device_ = -1;  // -1: holds nothing
  size_t slot_ = 0;
};

// What the driver says of a device pointer, asked in one call (InspectCudaPointer).
struct CudaPointerFacts {
  bool vmm = false;        // VMM memory: no legacy IPC handle (see FindCudaVmmChunks)
  uint64_t base = 0;       // the allocation the pointer lies in
  uint64_t bytes = 0;      //   and its size
  uint64_t buffer_id = 0;  // the driver's id of that allocation, unique in the process; 0: none
};

// The facts of `data` on CUDA device `device`: InvalidArgument when it is not device memory of
// `device` (host, managed or another device's memory), or the library has no CUDA.
StatusOr<CudaPointerFacts> InspectCudaPointer(const void* data, int device);

// ExportCudaTensor for memory whose `facts` InspectCudaPointer gave: legacy IPC memory only
// (InvalidArgument for VMM memory). The allocation's IPC handle is made once and cached by its
// buffer id, so that an op costs no cudaIpcGetMemHandle.
StatusOr<ExportedCudaTensor> ExportCudaIpcTensor(const void* data, size_t bytes, int device,
                                                 void* stream, const CudaPointerFacts& facts,
                                                 ReadyEventLease* lease = nullptr);

// Exports `bytes` bytes of device memory at `data` on CUDA device `device`, ordered after the work
// queued so far on `stream` (a cudaStream_t; nullptr = the legacy default stream). The events
// come from a small per-device pool of the process, reused round-robin (a sidecar that waits on a
// later recording of one waits for more, never for less), or, with `lease`, from the leased pool
// (ReadyEventLease; for trainers that wait on stream signals). The calling thread's current device
// is left as it was. InvalidArgument when `data` is not device memory of `device` (host, managed or
// another device's memory), names VMM memory and `vmm` is null (the message names the setting
// that avoids it) or `vmm` refuses it, or the library has no CUDA; the CUDA error's words are in
// the message. VMM memory is registered through `vmm` (not owned), once per physical allocation.
//
// Thread-safety: may be called from any thread.
// With `lease` (not null), the ready event comes from the leased pool: the one *lease holds
// already (LeaseReadyEvent) if it is of `device`, else one leased into *lease.
StatusOr<ExportedCudaTensor> ExportCudaTensor(const void* data, size_t bytes, int device,
                                              void* stream, CudaVmmRegistrar* vmm = nullptr,
                                              ReadyEventLease* lease = nullptr);

// The ready events one op leased: one per (device, stream) of its CUDA tensors, since one
// recording after the op's producers covers every tensor of that stream (and an op with many
// tensors holds few leases). Destroying it, or Clear, gives them back. Move-only.
class OpReadyLeases {
 public:
  // The lease for tensors on `stream` of `device`: held once TakeFor or an export filled it.
  ReadyEventLease* For(int device, void* stream) {
    for (Entry& entry : entries_) {
      if (entry.device == device && entry.stream == stream) return &entry.lease;
    }
    entries_.push_back(Entry{device, stream, ReadyEventLease()});
    return &entries_.back().lease;
  }
  // Leases an event for `stream` of `device` now unless one is held (see LeaseReadyEvent).
  Status TakeFor(int device, void* stream) {
    ReadyEventLease* lease = For(device, stream);
    if (lease->held()) return Status::Ok();
    StatusOr<ReadyEventLease> taken = LeaseReadyEvent(device);
    if (!taken.ok()) return taken.status();
    *lease = std::move(*taken);
    return Status::Ok();
  }
  void Clear() { entries_.clear(); }
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    int device;
    void* stream;
    ReadyEventLease lease;
  };
  std::vector<Entry> entries_;
};

// Whether `data` (device memory of `device`) is VMM memory: the driver's
// CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE is 0. InvalidArgument when the driver does not
// know the pointer; Unavailable when there is no driver or no CUDA in this library.
StatusOr<bool> IsCudaVmmMemory(const void* data, int device);

// The physical allocations that [data, data + bytes) of VMM memory on `device` spans, in address
// order, each found with cuMemGetAddressRange and retained with cuMemRetainAllocationHandle
// (the caller releases each with ReleaseCudaVmmChunk, or hands them to a CudaVmmRegistrar).
// InvalidArgument for more than kMaxVmmChunks allocations, for a mapping that is not one whole
// allocation (the same allocation on both sides of a chunk's edge), or what the driver refuses.
inline constexpr size_t kMaxVmmChunks = 64;
StatusOr<std::vector<CudaVmmChunk>> FindCudaVmmChunks(const void* data, size_t bytes, int device);

// A POSIX file descriptor for `chunk`'s allocation (cuMemExportToShareableHandle), which the
// caller closes. InvalidArgument with the driver's words when the allocation was not created
// shareable as a file descriptor.
StatusOr<int> ExportCudaVmmChunk(const CudaVmmChunk& chunk, int device);

// Whether `chunk`'s allocation is still mapped at its base in this process (false once the
// trainer unmapped it, e.g. torch's empty_cache; true where it cannot be told).
bool CudaVmmChunkMapped(const CudaVmmChunk& chunk, int device);

// Gives back the reference FindCudaVmmChunks took on `chunk`'s allocation.
void ReleaseCudaVmmChunk(const CudaVmmChunk& chunk, int device);

// Records an event of the process's pool (see ExportCudaTensor; the leased pool with `lease`, as
// ExportCudaTensor's) on `stream` of `device` and returns its 64-byte cudaIpcEventHandle_t.
// InvalidArgument with CUDA's words on failure.
StatusOr<std::string> RecordCudaEvent(int device, void* stream, ReadyEventLease* lease = nullptr);

// Makes `stream` (a cudaStream_t; nullptr = the legacy default stream) of CUDA device `device`
// wait, without a CPU wait, for the work a sidecar enqueued before it recorded the event whose
// 64-byte handle is `event_handle` (CollectiveResponse.completion_event). Each handle is opened
// once and cached. The calling thread's current device is left as it was. InvalidArgument with
// CUDA's words when the handle cannot be opened or waited on, or the library has no CUDA.
//
// Thread-safety: may be called from any thread.
Status WaitForSidecarEvent(int device, void* stream, const std::string& event_handle);

// Registers `bytes` bytes of page-aligned host memory at `data` (a buffer of stream-signal words
// shared with a sidecar, StreamSignalWords) with CUDA, pinned and mapped for every device, with
// `device` current (no context is made on another), so that streams can wait on its words.
// Registering it again is a no-op. Unavailable with CUDA's words when the driver refuses (the
// client then waits on the CPU; no CUDA error is left pending), or without CUDA.
Status RegisterSignalWords(void* data, size_t bytes, int device);
// Undoes RegisterSignalWords (before the memory is unmapped); no streams may still wait on it.
void UnregisterSignalWords(void* data);

// Makes `stream` of CUDA device `device` wait, without a CPU wait, until the word at `word`
// (inside memory registered with RegisterSignalWords) reaches `value`: cuStreamWaitValue32 with
// CU_STREAM_WAIT_VALUE_GEQ, (int32_t)(*word - value) >= 0. InvalidArgument for a word outside
// registered memory; Unavailable with the driver's words when it cannot wait (stream memory
// operations unsupported).
//
// Thread-safety (both): may be called from any thread.
Status WaitForSignal(int device, void* stream, const uint32_t* word, uint32_t value);

}  // namespace collectived
