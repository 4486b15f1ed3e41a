// What the sidecar reports about GPUs: on a machine without a GPU (CI) it says why, on a GPU
// machine it lists the devices; either way the NCCL version is the loaded library's (which may be
// a different release of the same major version than the headers built against).
#include "engine/cuda/gpu_inventory.h"

#include <gtest/gtest.h>

#include "engine/group/transport/sidecar_transport_factory.h"

#ifdef COLLECTIVED_WITH_NCCL
#include <nccl.h>
#endif

namespace collectived {
namespace {

TEST(GpuInventory, ReportsTheBuildAndEitherDevicesOrWhyThereAreNone) {
  const GpuInventory& gpus = ProbeGpus();
  EXPECT_EQ(&gpus, &ProbeGpus());  // probed once
#ifdef COLLECTIVED_WITH_NCCL
  EXPECT_TRUE(gpus.backend_built);
  int loaded = 0;
  ASSERT_EQ(ncclGetVersion(&loaded), ncclSuccess);
  EXPECT_EQ(gpus.nccl_version, std::to_string(loaded / 10000) + "." +
                                   std::to_string(loaded % 10000 / 100) + "." +
                                   std::to_string(loaded % 100));
  EXPECT_EQ(loaded / 10000, NCCL_MAJOR);
  EXPECT_FALSE(gpus.cuda_runtime_version.empty());
  EXPECT_NE(gpus.Summary().find("NCCL " + gpus.nccl_version), std::string::npos);
#else
  EXPECT_FALSE(gpus.backend_built);
  EXPECT_EQ(gpus.Summary(), "GPU backend not built");
#endif
  if (gpus.devices.empty()) {
    std::printf("no GPU here: %s\n", gpus.problem.c_str());
    EXPECT_FALSE(gpus.problem.empty());
    EXPECT_EQ(gpus.DeviceList(), "");
  } else {
    EXPECT_TRUE(gpus.problem.empty());
    for (const GpuDevice& device : gpus.devices) {
      EXPECT_FALSE(device.name.empty());
      EXPECT_GT(device.memory_bytes, 0u);
      EXPECT_NE(gpus.DeviceList().find(device.name), std::string::npos);
    }
  }
}

// Each device says whether it runs MPS, and the devices that do not are named in the advice the
// sidecar logs at start (none: no advice).
TEST(GpuInventory, DevicesWithoutMpsAreNamedInTheSummaryAndTheAdvice) {
  GpuInventory gpus;
  gpus.backend_built = true;
  gpus.nccl_version = "2.28.3";
  gpus.cuda_runtime_version = "13.0";
  EXPECT_EQ(gpus.MpsAdvice(), "");  // no device
  for (int index = 0; index < 3; ++index) {
    GpuDevice device;
    device.index = index;
    device.name = "NVIDIA H200";
    device.pci_bus_id = "0000:0" + std::to_string(index) + ":00.0";
    device.memory_bytes = uint64_t{140} << 30;
    device.compute_major = 9;
    device.mps_enabled = index == 1;
    gpus.devices.push_back(device);
  }
  EXPECT_NE(gpus.Summary().find("0 NVIDIA H200 (sm_90, 140.0 GiB, 0000:00:00.0, no MPS)"),
            std::string::npos)
      << gpus.Summary();
  EXPECT_NE(gpus.Summary().find("1 NVIDIA H200 (sm_90, 140.0 GiB, 0000:01:00.0, MPS)"),
            std::string::npos)
      << gpus.Summary();
  const std::string advice = gpus.MpsAdvice();
  EXPECT_EQ(advice.rfind("GPU 0, 2 without MPS: ", 0), 0u) << advice;
  EXPECT_NE(advice.find("time-slice"), std::string::npos) << advice;
  for (GpuDevice& device : gpus.devices) device.mps_enabled = true;
  EXPECT_EQ(gpus.MpsAdvice(), "");
}

// A CUDA group is refused before its rendezvous, with the reason, where no GPU can serve it.
TEST(GpuInventory, CudaGroupsAreRefusedWithTheReasonWhereNoGpuIsUsable) {
  StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok());
  SidecarTransportFactory factory("127.0.0.1", **runtime);
  EXPECT_TRUE(factory.CheckDevice("g", DeviceKind::kCpu).ok());
  const Status cuda = factory.CheckDevice("trainers", DeviceKind::kCuda);
  const GpuInventory& gpus = ProbeGpus();
  if (!gpus.devices.empty()) {
    EXPECT_TRUE(cuda.ok()) << cuda.ToString();
    return;
  }
  ASSERT_TRUE(cuda.IsInvalidArgument()) << cuda.ToString();
  EXPECT_NE(cuda.message().find("group 'trainers'"), std::string::npos) << cuda.message();
  EXPECT_NE(cuda.message().find(gpus.problem), std::string::npos) << cuda.message();
}

}  // namespace
}  // namespace collectived
