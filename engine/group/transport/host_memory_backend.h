// HostMemoryBackend: the memory half of a DataBackend for host memory — scratch buffers,
// memcpy, and the CPU reduction kernels (engine/vocabulary/reduce_kernels.h) — and its
// point-to-point half, handed to the group's MessageTransport. Backends whose tensors live in host
// memory (Gloo, the in-process transport) derive from it and add the collectives.
//
// Thread-safety: as DataBackend; Copy, Combine, PreScale and Finalize keep no state, so the
// executor tasks of one op's passes may call them at once (Scratch is for the op itself).
#pragma once

#include <memory>
#include <vector>

#include "engine/group/transport/data_backend.h"
#include "engine/group/transport/message_transport.h"
#include "engine/vocabulary/reduce_kernels.h"

namespace collectived {

class HostMemoryBackend : public DataBackend {
 public:
  // `transfers` carries the point-to-point transfers (null: a group of one sidecar, which has
  // none to make).
  explicit HostMemoryBackend(std::shared_ptr<MessageTransport> transfers)
      : transfers_(std::move(transfers)) {}

  DeviceKind device_kind() const final { return DeviceKind::kCpu; }
  BackendCapabilities capabilities() const final { return {true, false}; }

  StatusOr<std::byte*> Scratch(int slot, size_t bytes) final;
  Status Copy(void* dst, const void* src, size_t bytes) final;
  Status Combine(const ReduceOp& op, DType dtype, void* out, const void* a, const void* b,
                 size_t count) final;
  Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) final;
  Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                  int contributions) final;

  void StartSend(const void* data, size_t bytes, int node, const P2PKey& key, Done done) final;
  void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) final;
  bool Idle() const final;

 private:
  const std::shared_ptr<MessageTransport> transfers_;
  std::vector<std::byte> scratch_[3];  // the op's own
};

}  // namespace collectived
