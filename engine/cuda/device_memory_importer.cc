#include "engine/cuda/gpu_inventory.h"
#include "engine/memory/device_memory.h"
#include "engine/memory/ipc_mapping_cache.h"

#ifdef COLLECTIVED_WITH_NCCL
#include "engine/cuda/cuda_ipc_opener.h"
#endif

namespace collectived {

StatusOr<std::unique_ptr<DeviceMemoryImporter>> MakeDeviceMemoryImporter() {
#ifdef COLLECTIVED_WITH_NCCL
  const GpuInventory& gpus = ProbeGpus();
  if (gpus.devices.empty()) {
    return Status::InvalidArgument("CUDA tensors need a GPU, and this sidecar sees none: " +
                                   gpus.problem);
  }
  return std::unique_ptr<DeviceMemoryImporter>(
      new IpcMappingCache(std::make_shared<CudaIpcOpener>()));
#else
  return Status::InvalidArgument("CUDA tensors need the GPU backend, and this sidecar was " +
                                 ProbeGpus().problem);
#endif
}

}  // namespace collectived
