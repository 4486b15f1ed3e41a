// HostMemoryBackend: the memory half of a DataBackend for host memory — scratch buffers,
// memcpy, and the CPU reduction kernels (engine/reduce_kernels.h). Backends whose tensors live
// in host memory (Gloo, the in-process transport) derive from it and add the network half.
//
// Thread-safety: as DataBackend; Copy, Combine, PreScale and Finalize keep no state, so the
// executor's helper threads may call them during an op (Scratch is for the executor only).
#pragma once

#include <vector>

#include "engine/group/data_backend.h"
#include "engine/reduce_kernels.h"

namespace collectived {

class HostMemoryBackend : public DataBackend {
 public:
  DeviceKind device_kind() const final { return DeviceKind::kCpu; }

  std::byte* Scratch(int slot, size_t bytes) final;
  void Copy(void* dst, const void* src, size_t bytes) final;
  Status Combine(const ReduceOp& op, DType dtype, void* out, const void* a, const void* b,
                 size_t count) final;
  Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) final;
  Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                  int contributions) final;
  // Host work is synchronous: nothing is left to complete.
  Status Flush(Ms) final { return Status::Ok(); }

 private:
  std::vector<std::byte> scratch_[3];  // executor thread only
};

}  // namespace collectived
