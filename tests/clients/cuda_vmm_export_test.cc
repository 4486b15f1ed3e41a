// CUDA VMM memory end to end in one process, on a GPU: the trainer's export (FindCudaVmmChunks,
// ExportCudaTensor through a CudaVmmRegistrar) and the sidecar's import (IpcMappingCache over
// CudaIpcOpener: cuMemImportFromShareableHandle, contiguous cuMemMap) of a tensor spanning three
// physical allocations, read and written through both mappings; the steady state exports
// nothing; a lying size is refused. Skips where no GPU (or no VMM) is usable.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"
#include "clients/cpp/cuda_vmm_registrar.h"
#include "engine/cuda/cuda_driver_calls.h"
#include "engine/cuda/cuda_ipc_opener.h"
#include "engine/cuda/gpu_inventory.h"
#include "engine/memory/ipc_mapping_cache.h"

namespace collectived {
namespace {

using CreateFn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                              unsigned long long);

// Three allocations of `bytes` each, shareable as POSIX fds, mapped contiguously (as torch's
// expandable segments are).
class VmmMemory {
 public:
  static constexpr int kParts = 3;
  std::string Make(const CudaDriverCalls& cu) {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemCreate", &symbol, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        symbol == nullptr) {
      return "no cuMemCreate";
    }
    auto create = reinterpret_cast<CreateFn>(symbol);
    cu_ = &cu;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    if (cu.get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
        CUDA_SUCCESS) {
      return "no VMM granularity";
    }
    bytes = 2 * granularity;
    if (cu.address_reserve(&base, kParts * bytes, 0, 0, 0) != CUDA_SUCCESS) return "no reserve";
    for (int i = 0; i < kParts; ++i) {
      if (create(&handles[i], bytes, &prop, 0) != CUDA_SUCCESS) return "cuMemCreate failed";
      if (cu.map(base + i * bytes, bytes, 0, handles[i], 0) != CUDA_SUCCESS) return "map failed";
      ++mapped_;
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cu.set_access(base, kParts * bytes, &access, 1) != CUDA_SUCCESS) return "no access";
    return "";
  }
  ~VmmMemory() {
    if (cu_ == nullptr) return;
    for (int i = 0; i < mapped_; ++i) cu_->unmap(base + i * bytes, bytes);
    for (CUmemGenericAllocationHandle handle : handles) {
      if (handle != 0) cu_->release(handle);
    }
    if (base != 0) cu_->address_free(base, kParts * bytes);
  }

  CUdeviceptr base = 0;
  size_t bytes = 0;
  CUmemGenericAllocationHandle handles[kParts] = {};

 private:
  const CudaDriverCalls* cu_ = nullptr;
  int mapped_ = 0;
};

TEST(CudaVmmExportImport, ATensorAcrossThreeAllocationsIsTheSameMemoryOnBothSides) {
  const GpuInventory& gpus = ProbeGpus();
  if (gpus.devices.empty()) GTEST_SKIP() << "no usable GPU here (" << gpus.Summary() << ")";
  StatusOr<const CudaDriverCalls*> cu = DriverCalls();
  ASSERT_TRUE(cu.ok()) << cu.status().ToString();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  VmmMemory memory;
  const std::string why = memory.Make(**cu);
  if (!why.empty()) GTEST_SKIP() << "no shareable VMM memory here: " << why;

  const size_t total = VmmMemory::kParts * memory.bytes;
  std::vector<float> pattern(total / sizeof(float));
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i % 100000);
  ASSERT_EQ(cudaMemcpy(reinterpret_cast<void*>(memory.base), pattern.data(), total,
                       cudaMemcpyHostToDevice),
            cudaSuccess);

  // The tensor starts half-way into the first allocation and ends half-way into the third.
  const size_t offset = memory.bytes / 2;
  const size_t length = 2 * memory.bytes;
  const void* tensor = reinterpret_cast<const void*>(memory.base + offset);
  StatusOr<bool> vmm = IsCudaVmmMemory(tensor, 0);
  ASSERT_TRUE(vmm.ok()) << vmm.status().ToString();
  EXPECT_TRUE(*vmm);
  StatusOr<std::vector<CudaVmmChunk>> chunks = FindCudaVmmChunks(tensor, length, 0);
  ASSERT_TRUE(chunks.ok()) << chunks.status().ToString();
  ASSERT_EQ(chunks->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*chunks)[i].base, memory.base + i * memory.bytes);
    EXPECT_EQ((*chunks)[i].bytes, memory.bytes);
    EXPECT_EQ((*chunks)[i].handle, static_cast<uint64_t>(memory.handles[i]));
    ReleaseCudaVmmChunk((*chunks)[i], 0);
  }

  // The sidecar's side, in this process.
  IpcMappingCache cache(std::make_shared<CudaIpcOpener>());
  CudaVmmRegistrar registrar(
      [&cache](int fd, uint64_t bytes, int device) {
        return cache.RegisterVmm(dup(fd), bytes, device);
      },
      [&cache](uint64_t id) { (void)cache.UnregisterVmm(id); });
  StatusOr<ExportedCudaTensor> exported = ExportCudaTensor(tensor, length, 0, nullptr, &registrar);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  ASSERT_EQ(exported->vmm_registrations.size(), 3u);
  EXPECT_TRUE(exported->memory_handle.empty());
  EXPECT_EQ(exported->offset, offset);
  EXPECT_EQ(exported->event_handle.size(), 64u);
  DeviceTensorRef ref;
  ref.device = 0;
  ref.offset = exported->offset;
  ref.length = exported->length;
  // Not the event: CUDA refuses to open a process's own interprocess event handle (the
  // sidecar is another process; cudaErrorDeviceUninitialized here, seen on an H100).
  ref.vmm_registrations = exported->vmm_registrations;
  StatusOr<TensorView> view = cache.Import(ref, DType::kFloat32, length / sizeof(float));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  std::vector<float> seen(length / sizeof(float));
  ASSERT_EQ(cudaMemcpy(seen.data(), view->data, length, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(seen.data(), pattern.data() + offset / sizeof(float), length), 0);
  // Written through the sidecar's mapping, read through the trainer's.
  ASSERT_EQ(cudaMemset(view->data, 0x7f, length), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> back(length);
  ASSERT_EQ(cudaMemcpy(back.data(), tensor, length, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back.front(), 0x7f);
  EXPECT_EQ(back.back(), 0x7f);

  // Steady state: the next export registers nothing new and reuses the mapping.
  StatusOr<ExportedCudaTensor> again = ExportCudaTensor(tensor, length, 0, nullptr, &registrar);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->vmm_registrations, exported->vmm_registrations);
  EXPECT_EQ(registrar.exports(), 3u);
  ASSERT_TRUE(cache.Import(ref, DType::kFloat32, length / sizeof(float)).ok());
  EXPECT_EQ(cache.opens(), 1u);

  // A client that lies about an allocation's size is refused.
  CudaVmmChunk first{memory.base, memory.bytes, static_cast<uint64_t>(memory.handles[0])};
  StatusOr<int> fd = ExportCudaVmmChunk(first, 0);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  StatusOr<uint64_t> lying = cache.RegisterVmm(*fd, 2 * memory.bytes, 0);
  ASSERT_FALSE(lying.ok());
  EXPECT_TRUE(lying.status().IsInvalidArgument()) << lying.status().ToString();
  std::printf("a lying size: %s\n", lying.status().ToString().c_str());
  view = Status::Internal("done");
  registrar.Reset();
}

}  // namespace
}  // namespace collectived
