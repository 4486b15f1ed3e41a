// CudaIpcOpener: the CUDA side of an IpcMappingCache — opens a trainer's allocation from its
// cudaIpcMemHandle_t (and learns its real size from the driver, so ranges are checked against
// it), closes it, and opens its IPC events; and imports and maps VMM allocations shared as
// POSIX file descriptors. Only the GPU backend builds this.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include "engine/memory/ipc_mapping_cache.h"

namespace collectived {

class CudaIpcOpener final : public IpcOpener {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  StatusOr<Allocation> OpenMemory(int device, std::string_view handle) override;
  void CloseMemory(int device, const Allocation& allocation) override;
  StatusOr<std::shared_ptr<DeviceEvent>> OpenEvent(int device, std::string_view handle) override;
  // VMM memory: imports a POSIX file descriptor (cuMemImportFromShareableHandle; the client's
  // size checked by a trial mapping), maps allocations contiguously into a reserved range
  // (cuMemAddressReserve, cuMemMap, cuMemSetAccess), unmaps and releases.
  StatusOr<VmmImport> ImportVmm(int device, int fd, uint64_t bytes) override;
  void ReleaseVmm(int device, const VmmImport& import) override;
  StatusOr<Allocation> MapVmm(int device, const std::vector<VmmImport>& parts) override;
  void UnmapVmm(int device, const Allocation& mapping) override;
};

}  // namespace collectived
