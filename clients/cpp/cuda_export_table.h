// CudaExportTable: the CUDA tensor export (cuda_tensor_export.h) as a table of its functions.
// libcollectived_cuda.so, which links the CUDA runtime, hands it out
// (collectived_cuda_export_table); a library that must load on machines without CUDA
// (libcollectived_native.so, the Python client's native core) is built with
// cuda_tensor_export_loaded.cc instead, which opens libcollectived_cuda.so at the first CUDA
// tensor and calls through this table. Both sides come from one build: the table's version and
// size are checked, not its types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"

namespace collectived {

inline constexpr uint32_t kCudaExportTableVersion = 1;

struct CudaExportTable {
  uint32_t version;
  uint32_t size;  // sizeof(CudaExportTable)
  bool (*client_has_cuda)();
  void (*release_ready_event)(int device, size_t slot);
  size_t (*leased_ready_events)(int device);
  StatusOr<ReadyEventLease> (*lease_ready_event)(int device);
  StatusOr<CudaPointerFacts> (*inspect_cuda_pointer)(const void* data, int device);
  StatusOr<ExportedCudaTensor> (*export_cuda_ipc_tensor)(const void* data, size_t bytes, int device,
                                                         void* stream,
                                                         const CudaPointerFacts& facts,
                                                         ReadyEventLease* lease);
  StatusOr<ExportedCudaTensor> (*export_cuda_tensor)(const void* data, size_t bytes, int device,
                                                     void* stream, CudaVmmRegistrar* vmm,
                                                     ReadyEventLease* lease);
  StatusOr<bool> (*is_cuda_vmm_memory)(const void* data, int device);
  StatusOr<std::vector<CudaVmmChunk>> (*find_cuda_vmm_chunks)(const void* data, size_t bytes,
                                                              int device);
  StatusOr<int> (*export_cuda_vmm_chunk)(const CudaVmmChunk& chunk, int device);
  bool (*cuda_vmm_chunk_mapped)(const CudaVmmChunk& chunk, int device);
  void (*release_cuda_vmm_chunk)(const CudaVmmChunk& chunk, int device);
  StatusOr<std::string> (*record_cuda_event)(int device, void* stream, ReadyEventLease* lease);
  Status (*wait_for_sidecar_event)(int device, void* stream, const std::string& event_handle);
  Status (*register_signal_words)(void* data, size_t bytes, int device);
  void (*unregister_signal_words)(void* data);
  Status (*wait_for_signal)(int device, void* stream, const uint32_t* word, uint32_t value);
};

}  // namespace collectived

// The table of the export this library was built with (libcollectived_cuda.so).
extern "C" const collectived::CudaExportTable* collectived_cuda_export_table();
