#include "clients/cpp/cuda_vmm_registrar.h"

#include <unistd.h>

#include <string>
#include <utility>

namespace collectived {

CudaVmmRegistrar::CudaVmmRegistrar(Send send, Forget forget)
    : CudaVmmRegistrar(std::move(send), std::move(forget),
                       Device{ExportCudaVmmChunk, ReleaseCudaVmmChunk, CudaVmmChunkMapped}) {}

CudaVmmRegistrar::CudaVmmRegistrar(Send send, Forget forget, Device device)
    : send_(std::move(send)), forget_(std::move(forget)), device_(std::move(device)) {}

CudaVmmRegistrar::~CudaVmmRegistrar() {
  Reset();
}

void CudaVmmRegistrar::DropStale(int device, const CudaVmmChunk& chunk) {
  // Whether every entry is checked for being mapped still: amortised, once per
  // entries/kSweepEvery new registrations, so that a trainer growing its memory does not pay a
  // driver call per entry per new allocation.
  constexpr size_t kSweepEvery = 8;
  const bool sweep = device_.still_mapped && ++misses_ * kSweepEvery >= entries_.size();
  if (sweep) misses_ = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const CudaVmmChunk& old = it->second.chunk;
    const bool overlaps = std::get<0>(it->first) == device && old.base < chunk.base + chunk.bytes &&
                          old.base + old.bytes > chunk.base;
    if (overlaps || (sweep && !device_.still_mapped(old, it->second.device))) {
      const int old_device = it->second.device;
      device_.release_chunk(old, old_device);
      if (forget_) forget_(it->second.id);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

StatusOr<std::vector<uint64_t>> CudaVmmRegistrar::Register(std::vector<CudaVmmChunk> chunks,
                                                           int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> ids;
  Status failed;
  for (const CudaVmmChunk& chunk : chunks) {
    if (!failed.ok()) {
      device_.release_chunk(chunk, device);
      continue;
    }
    auto found = entries_.find(Key{device, chunk.base});
    if (found != entries_.end() && found->second.chunk.handle == chunk.handle &&
        found->second.chunk.bytes == chunk.bytes) {
      ids.push_back(found->second.id);
      device_.release_chunk(chunk, device);  // the entry holds a reference already
      continue;
    }
    // New memory at these addresses: what was registered there is gone from the trainer.
    DropStale(device, chunk);
    StatusOr<int> fd = device_.export_chunk(chunk, device);
    if (!fd.ok()) {
      failed = fd.status();
      device_.release_chunk(chunk, device);
      continue;
    }
    ++exports_;
    StatusOr<uint64_t> id = send_(*fd, chunk.bytes, device);
    close(*fd);
    if (!id.ok()) {
      failed = id.status().WithContext("registering a CUDA VMM allocation of " +
                                       std::to_string(chunk.bytes) + " bytes with the sidecar");
      device_.release_chunk(chunk, device);
      continue;
    }
    entries_[Key{device, chunk.base}] = Entry{chunk, device, *id};
    ids.push_back(*id);
  }
  if (!failed.ok()) return failed;
  return ids;
}

void CudaVmmRegistrar::Reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, entry] : entries_) device_.release_chunk(entry.chunk, entry.device);
  entries_.clear();
}

size_t CudaVmmRegistrar::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

uint64_t CudaVmmRegistrar::exports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exports_;
}

}  // namespace collectived
