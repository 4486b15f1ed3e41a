#include "engine/group/host_memory_backend.h"

#include <cstring>

namespace collectived {

std::byte* HostMemoryBackend::Scratch(int slot, size_t bytes) {
  std::vector<std::byte>& buffer = scratch_[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

void HostMemoryBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

Status HostMemoryBackend::Combine(const ReduceOp& op, DType dtype, void* out, const void* a,
                                  const void* b, size_t count) {
  // Looked up per call (a few comparisons per chunk), so that helper threads may combine too.
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

}  // namespace collectived
