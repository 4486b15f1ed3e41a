// Which CUDA allocation a device pointer lies in, as the driver knows it: CUDA IPC shares whole
// allocations, so a tensor is exported as (its allocation's handle, offset) and an opened handle's
// range is checked against the allocation's real size. Only the GPU backend includes this.
#pragma once

#include <cstddef>

#include "engine/vocabulary/status.h"

namespace collectived {

struct CudaAllocation {
  std::byte* base = nullptr;
  size_t bytes = 0;
};

// The allocation that contains `pointer` (the driver's cuMemGetAddressRange, reached through the
// runtime so that nothing here links libcuda). InvalidArgument for a pointer that is not in
// device memory of the current context; Internal when the driver offers no such query.
StatusOr<CudaAllocation> FindCudaAllocation(const void* pointer);

}  // namespace collectived
