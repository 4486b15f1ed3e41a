#include "engine/cuda/cuda_allocation.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace collectived {
namespace {

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

AddressRangeFn AddressRange() {
  static const AddressRangeFn fn = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &symbol, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return AddressRangeFn{nullptr};
    }
    return reinterpret_cast<AddressRangeFn>(symbol);
  }();
  return fn;
}

}  // namespace

StatusOr<CudaAllocation> FindCudaAllocation(const void* pointer) {
  AddressRangeFn range = AddressRange();
  if (range == nullptr) {
    return Status::Internal("the CUDA driver offers no cuMemGetAddressRange (no driver?)");
  }
  CUdeviceptr start = 0;
  size_t bytes = 0;
  const CUresult found = range(&start, &bytes, reinterpret_cast<CUdeviceptr>(pointer));
  if (found != CUDA_SUCCESS) {
    return Status::InvalidArgument("pointer " +
                                   std::to_string(reinterpret_cast<uintptr_t>(pointer)) +
                                   " is not in CUDA device memory of the current device (driver "
                                   "error " +
                                   std::to_string(static_cast<int>(found)) + ")");
  }
  return CudaAllocation{reinterpret_cast<std::byte*>(start), bytes};
}

}  // namespace collectived
