// AVG and PREMUL_SUM: Finalize divides by the contributions (integers truncate toward zero),
// PreScale scales each contribution before the sum; both are no-ops for other reductions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/reduce_op.h"
#include "tests/engine/reduce_kernels_test_helpers.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;
using namespace reduce_testing;  // NOLINT: the helpers of these tests

// ---------------------------------------------------------------------------------------------
// AVG (Finalize) and PREMUL_SUM (PreScale).
// ---------------------------------------------------------------------------------------------

template <typename T>
std::vector<T> AverageOf(DType dtype, const std::vector<std::vector<T>>& contributions) {
  const CombineFn fn = Kernel(ReduceOp::Avg(), dtype);
  std::vector<T> acc = contributions[0];
  const size_t count = acc.size() * sizeof(T) / DTypeSize(dtype);  // T is a part for complex
  for (size_t k = 1; k < contributions.size(); ++k) {
    fn(acc.data(), acc.data(), contributions[k].data(), count);
  }
  Status status =
      Finalize(ReduceOp::Avg(), dtype, acc.data(), count, static_cast<int>(contributions.size()));
  EXPECT_TRUE(status.ok()) << status.ToString();
  return acc;
}

TEST(AvgTest, IntegersTruncateTowardZero) {
  using V8 = std::vector<int8_t>;
  EXPECT_EQ(AverageOf<int8_t>(DType::kInt8, {V8{-7, 7, -1, 1, -128}, V8{0, 0, 0, 0, 0}}),
            (V8{-3, 3, 0, 0, -64}));
  using V64 = std::vector<int64_t>;
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(AverageOf<int64_t>(DType::kInt64, {V64{-7, kMin64, 10}, V64{0, 0, 0}, V64{0, 0, 1}}),
            (V64{-2, kMin64 / 3, 3}));
  using VU8 = std::vector<uint8_t>;
  EXPECT_EQ(AverageOf<uint8_t>(DType::kUInt8, {VU8{255, 3}, VU8{0, 0}}), (VU8{127, 1}));
  using V16 = std::vector<int16_t>;
  EXPECT_EQ(AverageOf<int16_t>(DType::kInt16, {V16{-9}, V16{0}, V16{0}, V16{0}}), (V16{-2}));
  using V32 = std::vector<int32_t>;
  EXPECT_EQ(AverageOf<int32_t>(DType::kInt32, {V32{-7, 9}, V32{0, 0}}), (V32{-3, 4}));
}

TEST(AvgTest, LongIntegerBuffers) {
  std::vector<int32_t> a(1001), b(1001);
  for (int i = 0; i < 1001; ++i) {
    a[i] = i - 500;
    b[i] = 3 * i - 1000;
  }
  const std::vector<int32_t> avg = AverageOf<int32_t>(DType::kInt32, {a, b});
  for (int i = 0; i < 1001; ++i) ASSERT_EQ(avg[i], (a[i] + b[i]) / 2) << i;
}

TEST(AvgTest, FloatingPoint) {
  EXPECT_EQ(AverageOf<float>(DType::kFloat32, {{1, -7}, {2, 0}}),
            (std::vector<float>{1.5f, -3.5f}));
  EXPECT_EQ(AverageOf<float>(DType::kFloat32, {{1}, {2}, {4}}), (std::vector<float>{7.0f / 3}));
  EXPECT_EQ(AverageOf<double>(DType::kFloat64, {{1}, {2}, {4}}), (std::vector<double>{7.0 / 3}));
  // float16 and bfloat16 go through float: the quotient is rounded once, from float.
  const std::vector<uint16_t> half =
      AverageOf<uint16_t>(DType::kFloat16, {{FloatToHalf(1)}, {FloatToHalf(2)}, {FloatToHalf(4)}});
  EXPECT_EQ(half[0], FloatToHalf(7.0f / 3));
  const std::vector<uint16_t> bf16 = AverageOf<uint16_t>(
      DType::kBFloat16, {{FloatToBFloat16(1)}, {FloatToBFloat16(2)}, {FloatToBFloat16(4)}});
  EXPECT_EQ(bf16[0], FloatToBFloat16(7.0f / 3));
  // Complex: both parts divided.
  EXPECT_EQ(AverageOf<float>(DType::kComplex64, {{1, 2}, {3, 4}}), (std::vector<float>{2, 3}));
  EXPECT_EQ(AverageOf<double>(DType::kComplex128, {{1, -2}, {2, 4}}),
            (std::vector<double>{1.5, 1}));
}

TEST(AvgTest, FinalizeLongFloatBuffers) {
  for (DType dtype : kRealFloatingDTypes) {
    std::mt19937_64 rng(static_cast<int>(dtype));
    const size_t n = 1037;
    Bytes data = RandomBuffer(dtype, n, rng);
    const Bytes before = data;
    ASSERT_TRUE(Finalize(ReduceOp::Avg(), dtype, data.data(), n, 3).ok());
    for (size_t i = 0; i < n; ++i) {
      const double x = DecodeReal(dtype, before, i);
      double want;
      if (dtype == DType::kFloat64) {
        want = x / 3;
      } else {
        want = DecodeReal(dtype, EncodeReals(dtype, {static_cast<float>(x) / 3.0f}), 0);
      }
      ASSERT_TRUE(SameFloat(DecodeReal(dtype, data, i), want))
          << DTypeName(dtype) << " element " << i << ": " << x;
    }
  }
}

TEST(AvgTest, FinalizeNeedsAtLeastOneContribution) {
  float data[3] = {1, 2, 3};
  for (int bad : {0, -1}) {
    Status status = Finalize(ReduceOp::Avg(), DType::kFloat32, data, 3, bad);
    EXPECT_TRUE(status.IsInvalidArgument());
    EXPECT_THAT(status.message(), HasSubstr("num_contributions"));
    EXPECT_THAT(status.message(), HasSubstr("AVG"));
    EXPECT_THAT(status.message(), HasSubstr("float32"));
  }
  EXPECT_EQ(data[0], 1.0f);
  int8_t one[1] = {-5};
  ASSERT_TRUE(Finalize(ReduceOp::Avg(), DType::kInt8, one, 1, 1).ok());
  EXPECT_EQ(one[0], -5);
}

TEST(ScalingTest, NoOpsForOtherReductions) {
  for (const Pair& pair : AllPairs(true)) {
    std::mt19937_64 rng(3);
    Bytes data = RandomBuffer(pair.dtype, 19, rng);
    const Bytes before = data;
    const ReduceOp op{pair.kind, 0.5};
    if (pair.kind != ReduceOpKind::kPremulSum) {
      ASSERT_TRUE(PreScale(op, pair.dtype, data.data(), 19).ok()) << PairName(pair);
      EXPECT_EQ(data, before) << "PreScale changed " << PairName(pair);
    }
    if (pair.kind != ReduceOpKind::kAvg) {
      // num_contributions is ignored, even when it makes no sense.
      ASSERT_TRUE(Finalize(op, pair.dtype, data.data(), 19, 0).ok()) << PairName(pair);
      EXPECT_EQ(data, before) << "Finalize changed " << PairName(pair);
    }
  }
}

TEST(ScalingTest, NullBuffers) {
  EXPECT_TRUE(PreScale(ReduceOp::PremulSum(2), DType::kFloat32, nullptr, 0).ok());
  EXPECT_TRUE(Finalize(ReduceOp::Avg(), DType::kFloat32, nullptr, 0, 2).ok());
  Status pre = PreScale(ReduceOp::PremulSum(2), DType::kFloat32, nullptr, 3);
  EXPECT_TRUE(pre.IsInvalidArgument());
  EXPECT_THAT(pre.message(), HasSubstr("null"));
  Status fin = Finalize(ReduceOp::Avg(), DType::kInt32, nullptr, 3, 2);
  EXPECT_TRUE(fin.IsInvalidArgument());
  EXPECT_THAT(fin.message(), HasSubstr("null"));
}

using Encoder = uint16_t (*)(float);

// Reference for one PREMUL_SUM element: each contribution scaled in the compute type (float for
// the 16-bit types and float32/complex64, double otherwise) and rounded to the dtype, then
// summed in order with a rounding after each addition.
double RefPremulPart(DType dtype, const std::vector<double>& parts, double scale) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      const Encoder encode = dtype == DType::kFloat16 ? FloatToHalf : FloatToBFloat16;
      float (*decode)(uint16_t) = dtype == DType::kFloat16 ? HalfToFloat : BFloat16ToFloat;
      uint16_t acc = 0;
      for (size_t k = 0; k < parts.size(); ++k) {
        const uint16_t scaled =
            encode(decode(encode(static_cast<float>(parts[k]))) * static_cast<float>(scale));
        acc = k == 0 ? scaled : encode(decode(acc) + decode(scaled));
      }
      return decode(acc);
    }
    case DType::kFloat32:
    case DType::kComplex64: {
      float acc = 0;
      for (size_t k = 0; k < parts.size(); ++k) {
        const float scaled = static_cast<float>(parts[k]) * static_cast<float>(scale);
        acc = k == 0 ? scaled : acc + scaled;
      }
      return acc;
    }
    default: {
      double acc = 0;
      for (size_t k = 0; k < parts.size(); ++k) {
        acc = k == 0 ? parts[k] * scale : acc + parts[k] * scale;
      }
      return acc;
    }
  }
}

TEST(PremulSumTest, ScalesEachContributionThenSums) {
  constexpr size_t kN = 1001;
  constexpr int kContributions = 3;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                      DType::kComplex64, DType::kComplex128}) {
    for (double scale : {0.25, 0.1, -3.0}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " scale " + std::to_string(scale));
      const ReduceOp op = ReduceOp::PremulSum(scale);
      const size_t parts_per_element = IsComplex(dtype) ? 2 : 1;
      const size_t part_size = DTypeSize(dtype) / parts_per_element;
      const DType part_dtype =
          IsComplex(dtype) ? (dtype == DType::kComplex64 ? DType::kFloat32 : DType::kFloat64)
                           : dtype;
      // Contributions as doubles exactly representable in the dtype.
      std::mt19937_64 rng(static_cast<int>(dtype));
      std::uniform_real_distribution<double> dist(-1000, 1000);
      std::vector<std::vector<double>> values(kContributions);
      std::vector<Bytes> buffers;
      for (auto& v : values) {
        v.resize(kN * parts_per_element);
        for (double& x : v) x = DecodeReal(part_dtype, EncodeReals(part_dtype, {dist(rng)}), 0);
        buffers.push_back(EncodeReals(part_dtype, v));
      }
      const CombineFn fn = Kernel(op, dtype);
      for (Bytes& buffer : buffers) ASSERT_TRUE(PreScale(op, dtype, buffer.data(), kN).ok());
      for (int k = 1; k < kContributions; ++k) {
        fn(buffers[0].data(), buffers[0].data(), buffers[k].data(), kN);
      }
      ASSERT_TRUE(Finalize(op, dtype, buffers[0].data(), kN, kContributions).ok());
      ASSERT_EQ(buffers[0].size(), kN * parts_per_element * part_size);
      for (size_t i = 0; i < kN * parts_per_element; ++i) {
        std::vector<double> parts;
        for (const auto& v : values) parts.push_back(v[i]);
        ASSERT_TRUE(SameFloat(DecodeReal(part_dtype, buffers[0], i),
                              RefPremulPart(part_dtype, parts, scale)))
            << "part " << i << ": got " << DecodeReal(part_dtype, buffers[0], i) << ", want "
            << RefPremulPart(part_dtype, parts, scale);
      }
    }
  }
}

}  // namespace
}  // namespace collectived
