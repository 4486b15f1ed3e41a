#include "engine/cuda/cuda_driver_calls.h"

#include <cuda_runtime_api.h>

namespace collectived {
namespace {

// Looks `name` up as the driver's version-12.0 symbol into *fn; the name on failure.
template <typename Fn>
bool Lookup(const char* name, Fn* fn, std::string* missing) {
  void* symbol = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &symbol, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || symbol == nullptr) {
    cudaGetLastError();
    if (missing->empty()) *missing = name;
    return false;
  }
  *fn = reinterpret_cast<Fn>(symbol);
  return true;
}

}  // namespace

StatusOr<const CudaDriverCalls*> DriverCalls() {
  static const StatusOr<const CudaDriverCalls*> driver = []() -> StatusOr<const CudaDriverCalls*> {
    auto* d = new CudaDriverCalls();  // never destroyed: a process-wide table
    std::string missing;
    Lookup("cuPointerGetAttribute", &d->pointer_get_attribute, &missing);
    Lookup("cuPointerGetAttributes", &d->pointer_get_attributes, &missing);
    Lookup("cuMemGetAddressRange", &d->get_address_range, &missing);
    Lookup("cuMemRetainAllocationHandle", &d->retain_allocation_handle, &missing);
    Lookup("cuMemExportToShareableHandle", &d->export_to_shareable_handle, &missing);
    Lookup("cuMemImportFromShareableHandle", &d->import_from_shareable_handle, &missing);
    Lookup("cuMemGetAllocationPropertiesFromHandle", &d->get_allocation_properties, &missing);
    Lookup("cuMemGetAllocationGranularity", &d->get_allocation_granularity, &missing);
    Lookup("cuMemAddressReserve", &d->address_reserve, &missing);
    Lookup("cuMemAddressFree", &d->address_free, &missing);
    Lookup("cuMemMap", &d->map, &missing);
    Lookup("cuMemUnmap", &d->unmap, &missing);
    Lookup("cuMemSetAccess", &d->set_access, &missing);
    Lookup("cuMemRelease", &d->release, &missing);
    Lookup("cuGetErrorName", &d->get_error_name, &missing);
    Lookup("cuStreamWriteValue32", &d->stream_write_value32, &missing);
    Lookup("cuStreamWaitValue32", &d->stream_wait_value32, &missing);
    Lookup("cuDevicePrimaryCtxGetState", &d->primary_context_state, &missing);
    if (!missing.empty()) {
      delete d;
      return Status::Unavailable(
          "the CUDA driver offers no " + missing +
          " (no driver, or one without virtual memory management or stream memory operations)");
    }
    return static_cast<const CudaDriverCalls*>(d);
  }();
  return driver;
}

bool PrimaryContextActive(int device) {
  StatusOr<const CudaDriverCalls*> driver = DriverCalls();
  if (!driver.ok()) return true;
  unsigned int flags = 0;
  int active = 0;
  // A runtime device ordinal is the driver's CUdevice (both count CUDA_VISIBLE_DEVICES alike).
  if ((*driver)->primary_context_state(static_cast<CUdevice>(device), &flags, &active) !=
      CUDA_SUCCESS) {
    return true;
  }
  return active != 0;
}

Status CuStatus(CUresult result, const std::string& what, ErrorKind kind) {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  StatusOr<const CudaDriverCalls*> driver = DriverCalls();
  if (driver.ok()) (*driver)->get_error_name(result, &name);
  return Status(kind, what + ": " + (name != nullptr ? name : "CUDA driver error") +
                          " (driver error " + std::to_string(static_cast<int>(result)) + ")");
}

}  // namespace collectived
