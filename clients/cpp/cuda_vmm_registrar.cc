#include "clients/cpp/cuda_vmm_registrar.h"

#include <unistd.h>

#include <string>
#include <utility>

namespace collectived {

CudaVmmRegistrar::CudaVmmRegistrar(Send send, Forget forget)
    : CudaVmmRegistrar(std::move(send), std::move(forget),
                       Device{ExportCudaVmmChunk, ReleaseCudaVmmChunk}) {}

CudaVmmRegistrar::CudaVmmRegistrar(Send send, Forget forget, Device device)
    : send_(std::move(send)), forget_(std::move(forget)), device_(std::move(device)) {}

CudaVmmRegistrar::~CudaVmmRegistrar() {
  Reset();
}

void CudaVmmRegistrar::DropOverlapping(int device, const CudaVmmChunk& chunk) {
  for (auto it = entries_.lower_bound(Key{device, 0});
       it != entries_.end() && std::get<0>(it->first) == device;) {
    const CudaVmmChunk& old = it->second.chunk;
    if (old.base < chunk.base + chunk.bytes && old.base + old.bytes > chunk.base) {
      device_.release_chunk(old, device);
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
    DropOverlapping(device, chunk);
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
