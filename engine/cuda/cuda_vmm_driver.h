// The CUDA driver's virtual-memory-management calls (cuMemCreate's family), reached through the
// runtime's cudaGetDriverEntryPointByVersion so that nothing links libcuda: a library or sidecar
// built with them still starts on a machine without a driver. Used by the trainer's export of
// VMM memory (PyTorch's expandable_segments) and by the sidecar's import of it. Only the GPU
// backend includes this.
#pragma once

#include <cuda.h>

#include <string>

#include "engine/status.h"

namespace collectived {

struct CudaVmmDriver {
  CUresult (*pointer_get_attribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*get_address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*retain_allocation_handle)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*export_to_shareable_handle)(void*, CUmemGenericAllocationHandle,
                                         CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_from_shareable_handle)(CUmemGenericAllocationHandle*, void*,
                                           CUmemAllocationHandleType) = nullptr;
  CUresult (*get_allocation_properties)(CUmemAllocationProp*,
                                        CUmemGenericAllocationHandle) = nullptr;
  CUresult (*get_allocation_granularity)(size_t*, const CUmemAllocationProp*,
                                         CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                              unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
};

// The driver's VMM calls, looked up once per process. Unavailable naming the missing call when
// the runtime finds no driver or the driver lacks one of them.
//
// Thread-safety: may be called from any thread.
StatusOr<const CudaVmmDriver*> VmmDriver();

// "what: CUDA_ERROR_INVALID_VALUE (driver error 1)", or OK for CUDA_SUCCESS; a status of `kind`.
Status CuStatus(CUresult result, const std::string& what, ErrorKind kind = ErrorKind::kInternal);

}  // namespace collectived
