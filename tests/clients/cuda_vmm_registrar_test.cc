// CudaVmmRegistrar's cache with a made-up device (no GPU needed): each physical allocation is
// exported and sent once per session, memory mapped again at the same addresses is a new
// allocation, the references taken on allocations are all given back, and every descriptor is
// closed after sending.
#include "clients/cpp/cuda_vmm_registrar.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>
#include <vector>

namespace collectived {
namespace {

struct CudaVmmRegistrarTest : ::testing::Test {
  std::multiset<uint64_t> retained;  // handles with a reference held, as FindCudaVmmChunks takes
  std::vector<int> sent_fds;
  std::vector<uint64_t> sent_sizes;
  std::vector<uint64_t> forgotten;
  std::set<uint64_t> unmapped;  // handles the "trainer" no longer maps
  uint64_t next_id = 1;
  Status refuse_send;

  CudaVmmRegistrar Make() {
    CudaVmmRegistrar::Device device;
    device.export_chunk = [](const CudaVmmChunk&, int) -> StatusOr<int> {
      return open("/dev/null", O_RDONLY | O_CLOEXEC);
    };
    device.release_chunk = [this](const CudaVmmChunk& chunk, int) {
      auto it = retained.find(chunk.handle);
      ASSERT_NE(it, retained.end()) << "released a handle never retained: " << chunk.handle;
      retained.erase(it);
    };
    device.still_mapped = [this](const CudaVmmChunk& chunk, int) {
      return unmapped.count(chunk.handle) == 0;
    };
    return CudaVmmRegistrar(
        [this](int fd, uint64_t bytes, int) -> StatusOr<uint64_t> {
          sent_fds.push_back(fd);
          sent_sizes.push_back(bytes);
          if (!refuse_send.ok()) return refuse_send;
          return next_id++;
        },
        [this](uint64_t id) { forgotten.push_back(id); }, device);
  }
  // The chunks of a lookup, each retained as FindCudaVmmChunks does.
  std::vector<CudaVmmChunk> Found(std::vector<CudaVmmChunk> chunks) {
    for (const CudaVmmChunk& chunk : chunks) retained.insert(chunk.handle);
    return chunks;
  }
};

TEST_F(CudaVmmRegistrarTest, EachAllocationIsExportedOnceAndSteadyStateExportsNothing) {
  CudaVmmRegistrar registrar = Make();
  const CudaVmmChunk a{0x10000000, 20 << 20, 7}, b{0x10000000 + (20 << 20), 20 << 20, 8};
  StatusOr<std::vector<uint64_t>> first = registrar.Register(Found({a, b}), 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, (std::vector<uint64_t>{1, 2}));
  for (int i = 0; i < 3; ++i) {
    StatusOr<std::vector<uint64_t>> again = registrar.Register(Found({b}), 0);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, (std::vector<uint64_t>{2}));
  }
  EXPECT_EQ(registrar.exports(), 2u);
  EXPECT_EQ(sent_sizes, (std::vector<uint64_t>{20 << 20, 20 << 20}));
  for (int fd : sent_fds) EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "fd " << fd << " left open";
  EXPECT_EQ(retained.size(), 2u);  // one reference per registered allocation
  registrar.Reset();
  EXPECT_TRUE(retained.empty());
}

TEST_F(CudaVmmRegistrarTest, MemoryMappedAgainAtTheSameAddressesIsRegisteredAnew) {
  CudaVmmRegistrar registrar = Make();
  ASSERT_TRUE(registrar.Register(Found({{0x1000, 0x2000, 7}}), 0).ok());
  // torch unmapped the segment and mapped a new allocation there (another handle).
  StatusOr<std::vector<uint64_t>> remapped = registrar.Register(Found({{0x1000, 0x2000, 9}}), 0);
  ASSERT_TRUE(remapped.ok());
  EXPECT_EQ(*remapped, (std::vector<uint64_t>{2}));
  EXPECT_EQ(registrar.size(), 1u);  // the old entry is gone, its reference given back
  EXPECT_EQ(retained, (std::multiset<uint64_t>{9}));
  EXPECT_EQ(forgotten, (std::vector<uint64_t>{1}));  // and the sidecar told to let it go
  // A larger allocation over part of an old one replaces it too; other devices are apart.
  ASSERT_TRUE(registrar.Register(Found({{0x1000, 0x2000, 9}}), 1).ok());
  ASSERT_TRUE(registrar.Register(Found({{0x0, 0x4000, 11}}), 0).ok());
  EXPECT_EQ(registrar.size(), 2u);
  EXPECT_EQ(retained, (std::multiset<uint64_t>{9, 11}));
  EXPECT_EQ(forgotten, (std::vector<uint64_t>{1, 2}));
}

TEST_F(CudaVmmRegistrarTest, AllocationsTheTrainerUnmappedAreGivenBackAtALaterRegistration) {
  CudaVmmRegistrar registrar = Make();
  ASSERT_TRUE(registrar.Register(Found({{0x1000, 0x1000, 7}, {0x2000, 0x1000, 8}}), 0).ok());
  unmapped.insert(7);  // torch's empty_cache unmapped and released it
  ASSERT_TRUE(registrar.Register(Found({{0x9000, 0x1000, 9}}), 0).ok());
  EXPECT_EQ(forgotten, (std::vector<uint64_t>{1}));
  EXPECT_EQ(retained, (std::multiset<uint64_t>{8, 9}));
  EXPECT_EQ(registrar.size(), 2u);
}

TEST_F(CudaVmmRegistrarTest, ARefusalIsReturnedAndNoReferenceLeaks) {
  CudaVmmRegistrar registrar = Make();
  refuse_send = Status::InvalidArgument("CUDA tensors need a GPU");
  StatusOr<std::vector<uint64_t>> refused =
      registrar.Register(Found({{0x1000, 0x2000, 7}, {0x3000, 0x2000, 8}}), 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument());
  EXPECT_NE(refused.status().message().find("registering a CUDA VMM allocation of 8192 bytes"),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("CUDA tensors need a GPU"), std::string::npos);
  EXPECT_TRUE(retained.empty());
  EXPECT_EQ(registrar.size(), 0u);
  for (int fd : sent_fds) EXPECT_EQ(fcntl(fd, F_GETFD), -1);
}

TEST(CudaVmmExport, WithoutCudaOrADriverTheExportSaysWhy) {
  // This machine may have the CUDA runtime but no driver, or the library no CUDA at all: either
  // way the VMM calls are refused with a reason, never a crash.
  int x = 0;
  StatusOr<bool> vmm = IsCudaVmmMemory(&x, 0);
  if (vmm.ok()) GTEST_SKIP() << "a CUDA driver is present: the GPU checks cover the export";
  EXPECT_FALSE(vmm.status().message().empty());
  StatusOr<std::vector<CudaVmmChunk>> chunks = FindCudaVmmChunks(&x, sizeof(x), 0);
  ASSERT_FALSE(chunks.ok());
  EXPECT_FALSE(chunks.status().message().empty());
  std::printf("VMM export here: %s\n", chunks.status().ToString().c_str());
}

}  // namespace
}  // namespace collectived
