#include "engine/group/transport/host_memory_backend.h"

#include <cstring>
#include <new>

namespace collectived {

StatusOr<std::byte*> HostMemoryBackend::Scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= 3) return Status::Internal("scratch slot " + std::to_string(slot));
  std::vector<std::byte>& buffer = scratch_[slot];
  if (buffer.size() < bytes) {
    try {
      buffer.resize(bytes);
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted("the sidecar cannot allocate " + std::to_string(bytes) +
                                       " bytes of scratch memory for the op");
    }
  }
  return buffer.data();
}

Status HostMemoryBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return Status::Ok();
}

Status HostMemoryBackend::Combine(const ReduceOp& op, DType dtype, void* out, const void* a,
                                  const void* b, size_t count) {
  // Looked up per call (a few comparisons per chunk), so that the op's tasks may combine too.
  StatusOr<CombineFn> combine = CombineFunction(op, dtype);
  if (!combine.ok()) return combine.status();
  (*combine)(out, a, b, count);
  return Status::Ok();
}

Status HostMemoryBackend::PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) {
  return collectived::PreScale(op, dtype, data, count);
}

Status HostMemoryBackend::Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                                   int contributions) {
  return collectived::Finalize(op, dtype, data, count, contributions);
}

void HostMemoryBackend::StartSend(const void* data, size_t bytes, int node, const P2PKey& key,
                                  Done done) {
  if (!transfers_) {
    done(Status::Internal("point-to-point transfer on a group with one sidecar"));
    return;
  }
  transfers_->StartSend(data, bytes, node, key, std::move(done));
}

void HostMemoryBackend::StartRecv(void* data, size_t bytes, int node, const P2PKey& key,
                                  Done done) {
  if (!transfers_) {
    done(Status::Internal("point-to-point transfer on a group with one sidecar"));
    return;
  }
  transfers_->StartRecv(data, bytes, node, key, std::move(done));
}

bool HostMemoryBackend::Idle() const {
  return !transfers_ || transfers_->Idle();
}

}  // namespace collectived
