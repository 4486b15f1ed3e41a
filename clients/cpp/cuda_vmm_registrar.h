// CudaVmmRegistrar: a session's registrations of CUDA VMM physical allocations with its sidecar,
// so that each allocation a tensor spans is exported (one POSIX file descriptor, sent on the fd
// channel with kRegisterCudaVmm) once per session, and an op in steady state exports nothing.
//
// An allocation is known by its retained handle, where it is mapped and its size. The registrar
// keeps the reference FindCudaVmmChunks took on each allocation it registered, so the handle
// value cannot be reused by a new allocation while its entry lives: memory that PyTorch unmapped
// and mapped again is a new allocation with a new handle, and registered anew. An entry whose
// address range a new allocation now occupies is dropped: its reference given back, and its
// registration given back to the sidecar (which then releases the old memory). So is, checked
// every few new registrations, every entry whose allocation the trainer no longer maps (torch's
// empty_cache): until then, memory the trainer released stays allocated, held by the
// registration on both sides.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"
#include "engine/vocabulary/status.h"

namespace collectived {

class CudaVmmRegistrar {
 public:
  // Hands `fd` (not taken: the registrar closes it after) of an allocation of `bytes` bytes on
  // `device` to the sidecar; returns its registration id or the sidecar's refusal.
  using Send = std::function<StatusOr<uint64_t>(int fd, uint64_t bytes, int device)>;
  // Gives a registration id back to the sidecar (best effort: a failure leaves the sidecar
  // holding the memory until the session ends).
  using Forget = std::function<void(uint64_t id)>;
  // How the registrar exports and releases allocations (ExportCudaVmmChunk and
  // ReleaseCudaVmmChunk; tests give others).
  struct Device {
    std::function<StatusOr<int>(const CudaVmmChunk&, int device)> export_chunk;
    std::function<void(const CudaVmmChunk&, int device)> release_chunk;
    std::function<bool(const CudaVmmChunk&, int device)> still_mapped;
  };

  CudaVmmRegistrar(Send send, Forget forget);
  CudaVmmRegistrar(Send send, Forget forget, Device device);
  ~CudaVmmRegistrar();
  CudaVmmRegistrar(const CudaVmmRegistrar&) = delete;
  CudaVmmRegistrar& operator=(const CudaVmmRegistrar&) = delete;

  // The registration ids of `chunks` (from FindCudaVmmChunks, whose references this takes: each
  // is kept by an entry or given back), in order, registering the ones not registered yet.
  // Errors: the export's or the sidecar's, naming the allocation; chunks already registered stay.
  StatusOr<std::vector<uint64_t>> Register(std::vector<CudaVmmChunk> chunks, int device);
  // Forgets every registration (a new session: its ids mean nothing there).
  void Reset();
  // Allocations registered now, and exports made in all (for tests).
  size_t size() const;
  uint64_t exports() const;

 private:
  struct Entry {
    CudaVmmChunk chunk;
    int device = 0;
    uint64_t id = 0;
  };
  // (device, base) -> entry; at most one entry per address of a device.
  using Key = std::tuple<int, uint64_t>;
  // Drops the entries of `device` that `chunk` overlaps, and every entry no longer mapped
  // (mutex_ held).
  void DropStale(int device, const CudaVmmChunk& chunk);

  const Send send_;
  const Forget forget_;
  const Device device_;
  mutable std::mutex mutex_;
  std::map<Key, Entry> entries_;  // guarded by mutex_
  uint64_t exports_ = 0;          // guarded by mutex_
  size_t misses_ = 0;             // guarded by mutex_; new registrations since the last sweep
};

}  // namespace collectived
