// The device kernels against the host kernels, element for element, for every (op, dtype) pair
// the host path serves: combine, PREMUL_SUM's scaling and AVG's division. Needs a GPU; skipped
// with the reason printed elsewhere (scripts/gpu-check.sh runs it on a GPU machine).
#include "engine/cuda/device_kernels.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/cuda/device_combiner.h"
#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived {
namespace {

bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *why = std::string("no usable GPU: ") + cudaGetErrorString(error);
    cudaGetLastError();
    return false;
  }
  if (count == 0) {
    *why = "no GPU visible";
    return false;
  }
  return true;
}

#define SKIP_WITHOUT_GPU()                   \
  do {                                       \
    std::string why;                         \
    if (!HaveGpu(&why)) GTEST_SKIP() << why; \
  } while (0)

// Random elements of `dtype` with no NaN (NaN payloads may differ legitimately), small enough
// that integer products stay interesting, never zero (integer AVG divides by the count only).
std::vector<std::byte> RandomElements(DType dtype, size_t count, std::mt19937& rng) {
  const size_t element = DTypeSize(dtype);
  std::vector<std::byte> bytes(count * element);
  std::uniform_real_distribution<float> real(-4.0f, 4.0f);
  std::uniform_int_distribution<int> small(-100, 100);
  for (size_t i = 0; i < count; ++i) {
    std::byte* at = bytes.data() + i * element;
    auto put = [&](auto value) { std::memcpy(at, &value, sizeof value); };
    switch (dtype) {
      case DType::kFloat16:
        put(FloatToHalf(real(rng)));
        break;
      case DType::kBFloat16:
        put(FloatToBFloat16(real(rng)));
        break;
      case DType::kFloat32:
        put(real(rng));
        break;
      case DType::kFloat64:
        put(static_cast<double>(real(rng)));
        break;
      case DType::kInt8:
        put(static_cast<int8_t>(small(rng)));
        break;
      case DType::kUInt8:
        put(static_cast<uint8_t>(small(rng) + 100));
        break;
      case DType::kInt16:
        put(static_cast<int16_t>(small(rng) * 300));
        break;
      case DType::kInt32:
        put(static_cast<int32_t>(small(rng) * 20000000));
        break;
      case DType::kInt64:
        put(static_cast<int64_t>(small(rng)) * 90000000000000000LL);
        break;
      case DType::kBool:
        put(static_cast<uint8_t>(small(rng) > 0));
        break;
      case DType::kComplex64: {
        float re = real(rng), im = real(rng);
        std::memcpy(at, &re, 4);
        std::memcpy(at + 4, &im, 4);
        break;
      }
      case DType::kComplex128: {
        double re = real(rng), im = real(rng);
        std::memcpy(at, &re, 8);
        std::memcpy(at + 8, &im, 8);
        break;
      }
      default:
        break;
    }
  }
  return bytes;
}

struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(const std::vector<std::byte>& host) {
    EXPECT_EQ(cudaMalloc(&data, host.size() + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data); }
  std::vector<std::byte> Read(size_t bytes) const {
    std::vector<std::byte> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

TEST(DeviceKernels, CombineMatchesTheHostKernelsForEveryValidPair) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const size_t count = 100003;  // not a multiple of the block size
  int pairs = 0;
  for (ReduceOpKind kind : kAllReduceOpKinds) {
    for (DType dtype : kAllDTypes) {
      ReduceOp op{kind, kind == ReduceOpKind::kPremulSum ? 0.5 : 1.0};
      if (!ValidateReduceOp(op, dtype).ok()) continue;
      ++pairs;
      std::vector<std::byte> a = RandomElements(dtype, count, rng);
      std::vector<std::byte> b = RandomElements(dtype, count, rng);
      DeviceBuffer da(a), db(b);
      ASSERT_EQ(device_kernels::Combine(device_kernels::CombinerOf(kind), dtype, da.data, da.data,
                                        db.data, count, nullptr),
                0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      StatusOr<CombineFn> host = CombineFunction(op, dtype, KernelChoice::kPortable);
      ASSERT_TRUE(host.ok());
      (*host)(a.data(), a.data(), b.data(), count);
      EXPECT_EQ(da.Read(a.size()), a) << ReduceOpName(kind) << " on " << DTypeName(dtype);
    }
  }
  EXPECT_GT(pairs, 60);
}

TEST(DeviceKernels, ScaleAndDivideMatchTheHostKernels) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const size_t count = 4099;
  for (DType dtype : kAllDTypes) {
    const ReduceOp premul = ReduceOp::PremulSum(0.3);
    if (ValidateReduceOp(premul, dtype).ok()) {
      std::vector<std::byte> data = RandomElements(dtype, count, rng);
      DeviceBuffer device(data);
      ASSERT_EQ(device_kernels::Scale(dtype, device.data, count, 0.3, nullptr), 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(PreScale(premul, dtype, data.data(), count).ok());
      EXPECT_EQ(device.Read(data.size()), data) << "PREMUL_SUM on " << DTypeName(dtype);
    }
    if (ValidateReduceOp(ReduceOp::Avg(), dtype).ok()) {
      std::vector<std::byte> data = RandomElements(dtype, count, rng);
      DeviceBuffer device(data);
      ASSERT_EQ(device_kernels::Divide(dtype, device.data, count, 3, nullptr), 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(Finalize(ReduceOp::Avg(), dtype, data.data(), count, 3).ok());
      EXPECT_EQ(device.Read(data.size()), data) << "AVG on " << DTypeName(dtype);
    }
  }
}

TEST(DeviceKernels, InvalidPairsAreRefusedWithoutALaunch) {
  // No GPU needed: the refusal happens before any launch.
  EXPECT_EQ(device_kernels::Combine(device_kernels::Combiner::kBand, DType::kFloat32, nullptr,
                                    nullptr, nullptr, 10, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(device_kernels::Combine(device_kernels::Combiner::kMin, DType::kComplex64, nullptr,
                                    nullptr, nullptr, 10, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(device_kernels::Scale(DType::kInt32, nullptr, 10, 2.0, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(device_kernels::Divide(DType::kBool, nullptr, 10, 2, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(device_kernels::Divide(DType::kFloat32, nullptr, 10, 0, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  // Nothing to do is no launch at all.
  EXPECT_EQ(device_kernels::Combine(device_kernels::Combiner::kSum, DType::kFloat32, nullptr,
                                    nullptr, nullptr, 0, nullptr),
            0);
}

}  // namespace
}  // namespace collectived
