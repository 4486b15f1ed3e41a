// The reduction kernels on hand-picked values: floating-point specials (NaN, infinities, signed
// zeros, float16 rounding), integer wrap-around, bool on any byte, complex arithmetic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/reduce_op.h"
#include "tests/engine/reduce_kernels_test_helpers.h"

namespace collectived {
namespace {

using namespace reduce_testing;  // NOLINT: the helpers of these tests

// ---------------------------------------------------------------------------------------------
// Floating point specials.
// ---------------------------------------------------------------------------------------------

TEST(FloatingSpecialsTest, MinAndMaxPropagateNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> specials = {nan, -nan, 1.0, -inf, inf, 0.0, -2.5};
  std::vector<double> a_values, b_values;
  for (double x : specials) {
    for (double y : specials) {
      a_values.push_back(x);
      b_values.push_back(y);
    }
  }
  for (DType dtype : kRealFloatingDTypes) {
    for (ReduceOpKind kind : {ReduceOpKind::kMin, ReduceOpKind::kMax}) {
      SCOPED_TRACE(PairName({kind, dtype}));
      const CombineFn fn = Kernel({kind, 1.0}, dtype);
      const Bytes a = EncodeReals(dtype, a_values);
      const Bytes b = EncodeReals(dtype, b_values);
      for (int aliasing = 0; aliasing < 3; ++aliasing) {
        Bytes out(a.size()), a2 = a, b2 = b;
        Bytes* result = &out;
        if (aliasing == 0) {
          fn(out.data(), a2.data(), b2.data(), a_values.size());
        } else if (aliasing == 1) {
          fn(a2.data(), a2.data(), b2.data(), a_values.size());
          result = &a2;
        } else {
          fn(b2.data(), a2.data(), b2.data(), a_values.size());
          result = &b2;
        }
        for (size_t i = 0; i < a_values.size(); ++i) {
          const double x = a_values[i], y = b_values[i];
          const double got = DecodeReal(dtype, *result, i);
          if (std::isnan(x) || std::isnan(y)) {
            EXPECT_TRUE(std::isnan(got)) << x << " vs " << y << " gave " << got;
          } else {
            EXPECT_EQ(got, kind == ReduceOpKind::kMin ? std::min(x, y) : std::max(x, y))
                << x << " vs " << y << " (aliasing " << aliasing << ")";
          }
        }
      }
    }
  }
}

TEST(FloatingSpecialsTest, SumAndProductFollowIeee) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kRealFloatingDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<double> a_values = {nan, inf, inf, 1.0, 0.0, -0.0};
    const std::vector<double> b_values = {1.0, -inf, 1.0, nan, inf, -0.0};
    const Bytes a = EncodeReals(dtype, a_values);
    const Bytes b = EncodeReals(dtype, b_values);
    Bytes sum(a.size()), product(a.size());
    Kernel(ReduceOp::Sum(), dtype)(sum.data(), a.data(), b.data(), a_values.size());
    Kernel(ReduceOp::Product(), dtype)(product.data(), a.data(), b.data(), a_values.size());
    EXPECT_TRUE(std::isnan(DecodeReal(dtype, sum, 0)));
    EXPECT_TRUE(std::isnan(DecodeReal(dtype, sum, 1)));  // inf + -inf
    EXPECT_EQ(DecodeReal(dtype, sum, 2), inf);
    EXPECT_TRUE(std::isnan(DecodeReal(dtype, sum, 3)));
    EXPECT_TRUE(std::isnan(DecodeReal(dtype, product, 4)));  // 0 * inf
    EXPECT_TRUE(std::signbit(DecodeReal(dtype, sum, 5)));    // -0 + -0 = -0
  }
}

TEST(FloatingSpecialsTest, HalfSumRoundsAndOverflows) {
  const CombineFn sum = Kernel(ReduceOp::Sum(), DType::kFloat16);
  // 2048 + 1 is a tie between 2048 and 2050 in float16: the even one wins.
  // 65504 + 16 reaches the tie at 65520 and overflows to inf.
  const uint16_t a[] = {FloatToHalf(2048), FloatToHalf(2048), FloatToHalf(65504), 0x0001};
  const uint16_t b[] = {FloatToHalf(1), FloatToHalf(3), FloatToHalf(16), 0x0001};
  uint16_t out[4];
  sum(out, a, b, 4);
  EXPECT_EQ(HalfToFloat(out[0]), 2048.0f);
  EXPECT_EQ(HalfToFloat(out[1]), 2052.0f);  // 2051 is a tie between 2050 and 2052
  EXPECT_EQ(out[2], 0x7c00);
  EXPECT_EQ(out[3], 0x0002);  // subnormals add exactly
}

// ---------------------------------------------------------------------------------------------
// Integers and bool.
// ---------------------------------------------------------------------------------------------

// Combines arrays filled with `x` and `y` (long enough for the vector loop) and checks that
// every element is `want`.
template <typename T>
void ExpectFilled(ReduceOp op, DType dtype, T x, T y, T want) {
  constexpr size_t kN = 37;
  std::vector<T> a(kN, x), b(kN, y);
  Kernel(op, dtype)(a.data(), a.data(), b.data(), kN);
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(a[i], want) << ReduceOpName(op.kind) << " on " << DTypeName(dtype) << ": " << +x
                          << ", " << +y << " at " << i;
  }
}

TEST(IntegerTest, SumWrapsAround) {
  ExpectFilled<int8_t>(ReduceOp::Sum(), DType::kInt8, 127, 1, -128);
  ExpectFilled<int8_t>(ReduceOp::Sum(), DType::kInt8, -128, -1, 127);
  ExpectFilled<uint8_t>(ReduceOp::Sum(), DType::kUInt8, 255, 1, 0);
  ExpectFilled<int16_t>(ReduceOp::Sum(), DType::kInt16, 32767, 1, -32768);
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  ExpectFilled<int32_t>(ReduceOp::Sum(), DType::kInt32, kMax32, 1, INT32_MIN);
  ExpectFilled<int64_t>(ReduceOp::Sum(), DType::kInt64, kMax64, 1, kMin64);
  ExpectFilled<int64_t>(ReduceOp::Sum(), DType::kInt64, kMin64, -1, kMax64);
  ExpectFilled<int64_t>(ReduceOp::Avg(), DType::kInt64, kMax64, kMax64, -2);  // AVG sums first
}

TEST(IntegerTest, ProductWrapsAround) {
  ExpectFilled<int8_t>(ReduceOp::Product(), DType::kInt8, -128, -1, -128);
  ExpectFilled<int8_t>(ReduceOp::Product(), DType::kInt8, 16, 16, 0);
  ExpectFilled<uint8_t>(ReduceOp::Product(), DType::kUInt8, 255, 255, 1);
  ExpectFilled<int16_t>(ReduceOp::Product(), DType::kInt16, 300, 300, 24464);
  ExpectFilled<int16_t>(ReduceOp::Product(), DType::kInt16, -32768, -32768, 0);
  ExpectFilled<int32_t>(ReduceOp::Product(), DType::kInt32, 65536, 65536, 0);
  ExpectFilled<int32_t>(ReduceOp::Product(), DType::kInt32, INT32_MIN, -1, INT32_MIN);
  ExpectFilled<int64_t>(ReduceOp::Product(), DType::kInt64, std::numeric_limits<int64_t>::max(), 2,
                        -2);
  ExpectFilled<int64_t>(ReduceOp::Product(), DType::kInt64, std::numeric_limits<int64_t>::min(), -1,
                        std::numeric_limits<int64_t>::min());
}

TEST(IntegerTest, MinMaxAndBitwise) {
  ExpectFilled<int8_t>(ReduceOp::Min(), DType::kInt8, -128, 127, -128);
  ExpectFilled<uint8_t>(ReduceOp::Max(), DType::kUInt8, 200, 100, 200);
  ExpectFilled<int64_t>(ReduceOp::Min(), DType::kInt64, -5, 3, -5);
  ExpectFilled<int16_t>(ReduceOp::Band(), DType::kInt16, 0x0ff0, 0x00ff, 0x00f0);
  ExpectFilled<int32_t>(ReduceOp::Bor(), DType::kInt32, 0x0ff0, 0x00ff, 0x0fff);
  ExpectFilled<int64_t>(ReduceOp::Bxor(), DType::kInt64, -1, 0x00ff, ~int64_t{0x00ff});
  ExpectFilled<int8_t>(ReduceOp::Bxor(), DType::kInt8, -1, 1, -2);
}

TEST(BoolTest, LogicalOpsOnAnyByte) {
  // Memory written by a client as torch.bool is 0 or 1, but the kernels must not misbehave
  // (or trip UBSan) on other bytes: any nonzero byte is true and results are 0 or 1.
  const uint8_t values[] = {0, 1, 2, 255};
  std::vector<uint8_t> a, b;
  for (int repeat = 0; repeat < 5; ++repeat) {
    for (uint8_t x : values) {
      for (uint8_t y : values) {
        a.push_back(x);
        b.push_back(y);
      }
    }
  }
  struct Case {
    ReduceOp op;
    bool (*logic)(bool, bool);
  };
  const Case cases[] = {
      {ReduceOp::Sum(), [](bool x, bool y) { return x || y; }},
      {ReduceOp::Max(), [](bool x, bool y) { return x || y; }},
      {ReduceOp::Bor(), [](bool x, bool y) { return x || y; }},
      {ReduceOp::Product(), [](bool x, bool y) { return x && y; }},
      {ReduceOp::Min(), [](bool x, bool y) { return x && y; }},
      {ReduceOp::Band(), [](bool x, bool y) { return x && y; }},
      {ReduceOp::Bxor(), [](bool x, bool y) { return x != y; }},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> out(a.size(), 0x77);
    Kernel(c.op, DType::kBool)(out.data(), a.data(), b.data(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(out[i], c.logic(a[i] != 0, b[i] != 0) ? 1 : 0)
          << ReduceOpName(c.op.kind) << "(" << +a[i] << ", " << +b[i] << ")";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Complex.
// ---------------------------------------------------------------------------------------------

TEST(ComplexTest, ProductIsComplexMultiplication) {
  // (1 + 2i)(3 + 4i) = -5 + 10i; i * i = -1; (2 - i)(2 + i) = 5.
  const float a[] = {1, 2, 0, 1, 2, -1};
  const float b[] = {3, 4, 0, 1, 2, 1};
  float out[6];
  Kernel(ReduceOp::Product(), DType::kComplex64)(out, a, b, 3);
  EXPECT_EQ(std::vector<float>(out, out + 6), (std::vector<float>{-5, 10, -1, 0, 5, 0}));
  double a2[] = {1, 2, 0, 1};
  const double b2[] = {3, 4, 0, 1};
  Kernel(ReduceOp::Product(), DType::kComplex128)(a2, a2, b2, 2);
  EXPECT_EQ(std::vector<double>(a2, a2 + 4), (std::vector<double>{-5, 10, -1, 0}));
}

TEST(ComplexTest, SumAddsParts) {
  double a[] = {1, 2, -3, 4.5};
  const double b[] = {10, 20, 3, -0.5};
  Kernel(ReduceOp::Sum(), DType::kComplex128)(a, a, b, 2);
  EXPECT_EQ(std::vector<double>(a, a + 4), (std::vector<double>{11, 22, 0, 4}));
}

}  // namespace
}  // namespace collectived
