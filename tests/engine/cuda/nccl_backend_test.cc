// NcclBackend on one GPU: the memory half (scratch, copies, combine, AVG) on the device, the
// one-node collectives as no-ops, the completion through a host function on the stream
// (WhenComplete), and a clean refusal of a device that does not exist.
// Several sidecars on one GPU are refused by NCCL ("Duplicate GPU detected"), so the network half
// is exercised end to end only where a machine has two GPUs. Skipped without a GPU.
#include "engine/group/transport/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <future>
#include <vector>

#include "engine/concurrency/executor.h"
#include "engine/store/memory_store.h"
#include "engine/vocabulary/stream_signal.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    *why = error != cudaSuccess ? std::string("no usable GPU: ") + cudaGetErrorString(error)
                                : std::string("no GPU visible");
    cudaGetLastError();
    return false;
  }
  return true;
}

// A backend of group "g" alone on GPU 0 (one node: no communicator).
StatusOr<std::unique_ptr<NcclBackend>> OneNodeOnGpu0(Store& store, Executor& executor) {
  return NcclBackend::Create("g", 0, 0, 1, nullptr, store, milliseconds(10000), executor);
}

TEST(NcclBackend, OneNodeCombinesOnTheDeviceAndCompletesThroughTheStream) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  MemoryStore store;
  Executor executor(ExecutorOptions{2, 4});
  StatusOr<std::unique_ptr<NcclBackend>> backend = OneNodeOnGpu0(store, executor);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  NcclBackend& b = **backend;
  EXPECT_EQ(b.device_kind(), DeviceKind::kCuda);
  const size_t n = 1 << 20;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = 3.0f;
  }
  StatusOr<std::byte*> dx = b.Scratch(0, n * sizeof(float));
  StatusOr<std::byte*> dy = b.Scratch(1, n * sizeof(float));
  StatusOr<std::byte*> dz = b.Scratch(2, n * sizeof(float));
  ASSERT_TRUE(dx.ok() && dy.ok() && dz.ok()) << dx.status().ToString();
  ASSERT_EQ(cudaMemcpy(*dx, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(*dy, y.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(b.Copy(*dz, *dx, n * 4).ok());
  ASSERT_TRUE(b.Combine(ReduceOp::Avg(), DType::kFloat32, *dz, *dz, *dy, n).ok());
  ASSERT_TRUE(b.AllReduce(*dz, n, DType::kFloat32, ReduceOp::Avg(), 0, milliseconds(1000)).ok());
  ASSERT_TRUE(b.Finalize(ReduceOp::Avg(), DType::kFloat32, *dz, n, 2).ok());
  std::promise<Status> completed;
  b.WhenComplete([&](const Status& status) {
    EXPECT_TRUE(executor.OnPoolThread()) << "completions come through the executor";
    completed.set_value(status);
  });
  auto outcome = completed.get_future();
  ASSERT_EQ(outcome.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(outcome.get().ok());
  std::vector<float> z(n);
  ASSERT_EQ(cudaMemcpy(z.data(), *dz, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; i += 4097) EXPECT_EQ(z[i], (x[i] + 3.0f) / 2.0f) << i;
  EXPECT_TRUE(b.Combine(ReduceOp::Band(), DType::kFloat32, *dz, *dz, *dy, n).IsInvalidArgument());
  EXPECT_TRUE(b.Idle());
}

TEST(NcclBackend, StreamSignalsAreWrittenByTheStreamIntoAClientsSealedBuffer) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  MemoryStore store;
  Executor executor(ExecutorOptions{2, 4});
  StatusOr<std::unique_ptr<NcclBackend>> backend = OneNodeOnGpu0(store, executor);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  NcclBackend& b = **backend;
  const int fd = memfd_create("signal-words", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  StatusOr<std::shared_ptr<ShmSegment>> segment = ShmSegment::Adopt(fd, 0, "signal words");
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  const size_t n = 64 << 20;
  StatusOr<std::byte*> a = b.Scratch(0, n);
  StatusOr<std::byte*> c = b.Scratch(1, n);
  ASSERT_TRUE(a.ok() && c.ok());
  for (uint32_t value = 1; value <= 3; ++value) {  // one registration serves every signal
    ASSERT_TRUE(b.Copy(*c, *a, n).ok());
    StatusOr<StreamSignal> signal = MakeStreamSignal(*segment, 4 * value, value);
    ASSERT_TRUE(signal.ok()) << signal.status().ToString();
    Status enqueued = b.EnqueueSignal(*signal);
    ASSERT_TRUE(enqueued.ok()) << enqueued.ToString();
  }
  std::promise<Status> completed;
  b.WhenComplete([&](const Status& status) { completed.set_value(status); });
  auto outcome = completed.get_future();
  ASSERT_EQ(outcome.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(outcome.get().ok());
  const auto* words = reinterpret_cast<const uint32_t*>((*segment)->data());
  EXPECT_EQ(words[1], 1u);
  EXPECT_EQ(words[2], 2u);
  EXPECT_EQ(words[3], 3u);
  segment->reset();  // unregisters the pages, then unmaps them
}

TEST(NcclBackend, ADeviceThatDoesNotExistIsRefusedByName) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  MemoryStore store;
  Executor executor(ExecutorOptions{2, 4});
  StatusOr<std::unique_ptr<NcclBackend>> backend =
      NcclBackend::Create("g", 1000, 0, 1, nullptr, store, milliseconds(1000), executor);
  ASSERT_FALSE(backend.ok());
  EXPECT_TRUE(backend.status().IsInvalidArgument());
  EXPECT_NE(backend.status().message().find("cuda:1000"), std::string::npos);
}

}  // namespace
}  // namespace collectived
