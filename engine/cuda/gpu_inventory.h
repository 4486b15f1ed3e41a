// GpuInventory: what the sidecar can do with GPUs — whether it was built with the GPU backend,
// the NCCL and CUDA runtime versions, and the devices it sees (or why it sees none: no driver,
// no device, CUDA_VISIBLE_DEVICES empty). Shown by `collectivectl info`/`health` and in
// collectived_build_info.
//
// Thread-safety: ProbeGpus may be called from any thread; it probes once per process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace collectived {

struct GpuDevice {
  int index = 0;           // CUDA ordinal in this process (after CUDA_VISIBLE_DEVICES)
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;  // "0000:19:00.0"
  uint64_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  // Contexts made on it are shared through an MPS server (cudaDevAttrMpsEnabled). Without MPS
  // the sidecar's context and its trainers' time-slice on the GPU: see MpsAdvice.
  bool mps_enabled = false;
};

struct GpuInventory {
  bool backend_built = false;        // built with CUDA and NCCL
  std::string nccl_version;          // "2.28.9"; empty without the backend
  std::string cuda_runtime_version;  // "13.0"; empty without the backend
  std::string cuda_driver_version;   // "13.0"; empty when no driver answers
  std::vector<GpuDevice> devices;
  // Why no device can be used; empty when `devices` is not. E.g. "built without the GPU
  // backend", "cudaGetDeviceCount: cudaErrorInsufficientDriver (...)".
  std::string problem;

  // One line: "NCCL 2.28.9, CUDA 13.0, 1 GPU: 0 NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB,
  // 0000:19:00.0, MPS)" ("no MPS" where it does not run) or
  // "NCCL 2.28.9, CUDA 13.0, no GPU: <problem>" or "GPU backend not built".
  std::string Summary() const;
  // The devices as "0:NVIDIA H100 80GB HBM3,1:..." (a metric label); "" when there are none.
  std::string DeviceList() const;
  // Why the devices that do not run MPS should (the sidecar logs it as a warning at start);
  // "" when every device runs it or there are none.
  std::string MpsAdvice() const;
};

// Probes the CUDA runtime and NCCL the first time it is called and returns the same inventory
// afterwards. Never fails: a machine without a driver gets `problem` filled in.
const GpuInventory& ProbeGpus();

}  // namespace collectived
