// The CUDA driver calls that the runtime API lacks, reached through the runtime's
// cudaGetDriverEntryPointByVersion so that nothing links libcuda: a library or sidecar built with
// them still starts on a machine without a driver. Virtual memory management (cuMemCreate's
// family) serves the trainer's export of VMM memory (PyTorch's expandable_segments) and the
// sidecar's import of it; stream memory operations serve stream signals (a trainer's stream
// waits on a word the sidecar's stream writes). Only the GPU backend includes this.
#pragma once

#include <cuda.h>

#include <string>

#include "engine/vocabulary/status.h"

namespace collectived {

struct CudaDriverCalls {
  CUresult (*pointer_get_attribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*pointer_get_attributes)(unsigned int, CUpointer_attribute*, void**,
                                     CUdeviceptr) = nullptr;
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
  CUresult (*stream_write_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*primary_context_state)(CUdevice, unsigned int*, int*) = nullptr;
};

// The driver's calls, looked up once per process. Unavailable naming the missing call when the
// runtime finds no driver or the driver lacks one of them.
//
// Thread-safety: may be called from any thread.
StatusOr<const CudaDriverCalls*> DriverCalls();

// Whether CUDA device `device`'s primary context exists (cuDevicePrimaryCtxGetState): making
// the device current with the runtime (cudaSetDevice) would create it, and with it a few hundred
// MiB of memory on that GPU. True where the driver cannot say.
bool PrimaryContextActive(int device);

// "what: CUDA_ERROR_INVALID_VALUE (driver error 1)", or OK for CUDA_SUCCESS; a status of `kind`.
Status CuStatus(CUresult result, const std::string& what, ErrorKind kind = ErrorKind::kInternal);

}  // namespace collectived
