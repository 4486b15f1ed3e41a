// The trainer's export of legacy CUDA IPC memory on a GPU (InspectCudaPointer, ExportCudaTensor):
// one driver query says what a pointer is (device memory of which device, its allocation and the
// driver's buffer id); host and managed memory and the wrong device are refused with what was
// wrong; the allocation's IPC handle is made once and reused for every op on it, and memory freed
// and allocated again at the same address gets a handle of its own; the caller's current device
// is left as it was; a leased ready event is not recorded again until its lease is given back.
// Skips where no GPU is usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"
#include "engine/cuda/gpu_inventory.h"

namespace collectived {
namespace {

class CudaIpcExport : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuInventory& gpus = ProbeGpus();
    if (gpus.devices.empty()) GTEST_SKIP() << "no usable GPU here (" << gpus.Summary() << ")";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  void TearDown() override {
    for (void* block : blocks_) cudaFree(block);
  }
  std::byte* Allocate(size_t bytes) {
    void* block = nullptr;
    EXPECT_EQ(cudaMalloc(&block, bytes), cudaSuccess);
    blocks_.push_back(block);
    return static_cast<std::byte*>(block);
  }
  void Free(std::byte* block) {
    std::erase(blocks_, static_cast<void*>(block));
    EXPECT_EQ(cudaFree(block), cudaSuccess);
  }

 private:
  std::vector<void*> blocks_;
};

TEST_F(CudaIpcExport, OneQueryNamesTheAllocationAndItsBufferId) {
  std::byte* block = Allocate(1 << 20);
  StatusOr<CudaPointerFacts> facts = InspectCudaPointer(block + 4096, 0);
  ASSERT_TRUE(facts.ok()) << facts.status().ToString();
  EXPECT_FALSE(facts->vmm);
  EXPECT_EQ(facts->base, reinterpret_cast<uint64_t>(block));
  EXPECT_GE(facts->bytes, 1u << 20);
  EXPECT_NE(facts->buffer_id, 0u) << "the driver gave no buffer id";
  StatusOr<CudaPointerFacts> start = InspectCudaPointer(block, 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->buffer_id, facts->buffer_id);
}

TEST_F(CudaIpcExport, HostManagedAndAnotherDevicesMemoryAreRefusedSayingWhich) {
  std::vector<float> host(16);
  StatusOr<CudaPointerFacts> on_host = InspectCudaPointer(host.data(), 0);
  ASSERT_FALSE(on_host.ok());
  EXPECT_TRUE(on_host.status().IsInvalidArgument()) << on_host.status().ToString();
  EXPECT_NE(on_host.status().message().find("host memory"), std::string::npos)
      << on_host.status().ToString();

  void* managed = nullptr;
  if (cudaMallocManaged(&managed, 4096) == cudaSuccess) {
    StatusOr<CudaPointerFacts> unified = InspectCudaPointer(managed, 0);
    cudaFree(managed);
    ASSERT_FALSE(unified.ok());
    EXPECT_NE(unified.status().message().find("managed memory"), std::string::npos)
        << unified.status().ToString();
  } else {
    cudaGetLastError();
  }

  std::byte* block = Allocate(4096);
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices > 1) {
    StatusOr<CudaPointerFacts> elsewhere = InspectCudaPointer(block, 1);
    ASSERT_FALSE(elsewhere.ok());
    EXPECT_NE(elsewhere.status().message().find("lives on CUDA device 0"), std::string::npos)
        << elsewhere.status().ToString();
  }
  StatusOr<ExportedCudaTensor> overrun = ExportCudaTensor(block + 4000, 4096, 0, nullptr);
  ASSERT_FALSE(overrun.ok());
  EXPECT_NE(overrun.status().message().find("overrun its CUDA allocation"), std::string::npos)
      << overrun.status().ToString();
}

TEST_F(CudaIpcExport, AnAllocationsHandleIsMadeOnceAndNewMemoryGetsItsOwn) {
  constexpr size_t kBytes = 8 << 20;
  std::byte* block = Allocate(kBytes);
  StatusOr<ExportedCudaTensor> first = ExportCudaTensor(block, 1024, 0, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  StatusOr<ExportedCudaTensor> again = ExportCudaTensor(block + 4096, 1024, 0, nullptr);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(first->memory_handle.size(), 64u);
  EXPECT_EQ(again->memory_handle, first->memory_handle) << "one allocation, two handles";
  EXPECT_EQ(first->offset, 0u);
  EXPECT_EQ(again->offset, 4096u);
  StatusOr<CudaPointerFacts> old_facts = InspectCudaPointer(block, 0);
  ASSERT_TRUE(old_facts.ok());

  // Freed and made again: the allocator often returns the same address; the handle must be new.
  Free(block);
  std::byte* reborn = Allocate(kBytes);
  StatusOr<CudaPointerFacts> new_facts = InspectCudaPointer(reborn, 0);
  ASSERT_TRUE(new_facts.ok()) << new_facts.status().ToString();
  EXPECT_NE(new_facts->buffer_id, old_facts->buffer_id) << "a buffer id was reused";
  StatusOr<ExportedCudaTensor> fresh = ExportCudaTensor(reborn, 1024, 0, nullptr);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  if (reborn == block) {
    EXPECT_NE(fresh->memory_handle, first->memory_handle)
        << "new memory at the old address was given the old allocation's handle";
  }
  std::cout << "new allocation " << (reborn == block ? "at the same address" : "elsewhere") << "\n";
}

// A leased ready event is not recorded again while its lease is held (another event is taken),
// and once given back it is the first to be taken again (the events in use stay few).
TEST_F(CudaIpcExport, ALeasedReadyEventIsNotRecordedAgainWhileItsLeaseIsHeld) {
  std::byte* block = Allocate(4096);
  ReadyEventLease first;
  StatusOr<ExportedCudaTensor> a = ExportCudaTensor(block, 4096, 0, nullptr, nullptr, &first);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(first.held());
  ReadyEventLease second;
  StatusOr<ExportedCudaTensor> b = ExportCudaTensor(block, 4096, 0, nullptr, nullptr, &second);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(b->event_handle, a->event_handle) << "a leased event was recorded again";
  first.Reset();
  ReadyEventLease third;
  StatusOr<ExportedCudaTensor> c = ExportCudaTensor(block, 4096, 0, nullptr, nullptr, &third);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->event_handle, a->event_handle) << "the lease given back was not taken first";
  // A lease taken before the export (as Client::Submit takes them) is the one recorded.
  StatusOr<ReadyEventLease> taken = LeaseReadyEvent(0);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  const size_t slot = taken->slot();
  StatusOr<ExportedCudaTensor> d = ExportCudaTensor(block, 4096, 0, nullptr, nullptr, &*taken);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(taken->held());
  EXPECT_EQ(taken->slot(), slot) << "the export took another lease";
  EXPECT_NE(d->event_handle, b->event_handle);
  EXPECT_NE(d->event_handle, c->event_handle);
  // Without a lease: the round-robin pool, never one of the leased events.
  StatusOr<ExportedCudaTensor> plain = ExportCudaTensor(block, 4096, 0, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_NE(plain->event_handle, a->event_handle);
  EXPECT_NE(plain->event_handle, b->event_handle);
}

TEST_F(CudaIpcExport, TheCallersCurrentDeviceIsLeftAsItWas) {
  std::byte* block = Allocate(4096);
  ASSERT_TRUE(ExportCudaTensor(block, 4096, 0, nullptr).ok());
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) return;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_TRUE(ExportCudaTensor(block, 4096, 0, nullptr).ok());
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1) << "the export left device 0 current";
}

}  // namespace
}  // namespace collectived
