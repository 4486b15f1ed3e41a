// Helpers of several files of reduce_kernels_test: the validity table of (op, dtype) pairs, written
// by hand, raw-byte loads and stores, float comparison, random test data, and real values encoded
// in every floating dtype.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived {
namespace reduce_testing {

using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------------------------
// The validity table, written by hand. Columns are the dtypes in enum order (kAllDTypes):
//   f16 bf16 f32 f64 i8 u8 i16 i32 i64 bool c64 c128
// ---------------------------------------------------------------------------------------------
inline constexpr std::string_view kValidity[] = {
    /* SUM        */ "YYYYYYYYYYYY",
    /* AVG        */ "YYYYYYYYY.YY",
    /* PRODUCT    */ "YYYYYYYYYYYY",
    /* MIN        */ "YYYYYYYYYY..",
    /* MAX        */ "YYYYYYYYYY..",
    /* BAND       */ "....YYYYYY..",
    /* BOR        */ "....YYYYYY..",
    /* BXOR       */ "....YYYYYY..",
    /* PREMUL_SUM */ "YYYY......YY",
};

inline bool ExpectedValid(ReduceOpKind kind, DType dtype) {
  if (dtype == DType::kUnspecified) return false;
  return kValidity[static_cast<int>(kind)][static_cast<int>(dtype) - 1] == 'Y';
}

struct Pair {
  ReduceOpKind kind;
  DType dtype;
};

// The combine function of a pair the test knows to be valid (StatusOr has no operator* on
// temporaries).
inline CombineFn Kernel(const ReduceOp& op, DType dtype) {
  StatusOr<CombineFn> fn = CombineFunction(op, dtype);
  EXPECT_TRUE(fn.ok()) << fn.status().ToString();
  return fn.ok() ? fn.value() : nullptr;
}

inline std::string PairName(const Pair& pair) {
  return std::string(ReduceOpName(pair.kind)) + "_" + std::string(DTypeName(pair.dtype));
}

inline std::vector<Pair> AllPairs(bool valid) {
  std::vector<Pair> pairs;
  for (ReduceOpKind kind : kAllReduceOpKinds) {
    if (!valid) pairs.push_back({kind, DType::kUnspecified});
    for (DType dtype : kAllDTypes) {
      if (ExpectedValid(kind, dtype) == valid) pairs.push_back({kind, dtype});
    }
  }
  return pairs;
}

// One value of type T at p, which need not be aligned.
template <typename T>
T Load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void Store(uint8_t* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

// Floating point: equal values, or NaN on both sides (which NaN comes out is not specified);
// with a `tolerance`, a relative difference up to it.
template <typename F>
bool SameFloat(F x, F y, F tolerance = 0) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  if (x == y) return true;
  return tolerance > 0 && std::fabs(x - y) <= tolerance * std::max(std::fabs(x), std::fabs(y));
}

// ---------------------------------------------------------------------------------------------
// Test data.
// ---------------------------------------------------------------------------------------------

// A float with a random sign and magnitude across 2^-30..2^11 (float16 subnormals up to values
// whose products overflow float16), and now and then a zero, an infinity or a NaN.
inline double RandomReal(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> special(0, 63);
  switch (special(rng)) {
    case 0:
      return 0.0;
    case 1:
      return -0.0;
    case 2:
      return std::numeric_limits<double>::infinity();
    case 3:
      return -std::numeric_limits<double>::infinity();
    case 4:
      return std::numeric_limits<double>::quiet_NaN();
    default:
      break;
  }
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-30, 10);
  const double magnitude = std::ldexp(mantissa(rng), exponent(rng));
  return (rng() & 1) ? -magnitude : magnitude;
}

inline Bytes RandomBuffer(DType dtype, size_t n, std::mt19937_64& rng) {
  const size_t size = DTypeSize(dtype);
  Bytes out(n * size);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = &out[i * size];
    switch (dtype) {
      case DType::kFloat16:
        Store(p, FloatToHalf(static_cast<float>(RandomReal(rng))));
        break;
      case DType::kBFloat16:
        Store(p, FloatToBFloat16(static_cast<float>(RandomReal(rng))));
        break;
      case DType::kFloat32:
        Store(p, static_cast<float>(RandomReal(rng)));
        break;
      case DType::kFloat64:
        Store(p, RandomReal(rng));
        break;
      case DType::kComplex64:
        Store(p, static_cast<float>(RandomReal(rng)));
        Store(p + 4, static_cast<float>(RandomReal(rng)));
        break;
      case DType::kComplex128:
        Store(p, RandomReal(rng));
        Store(p + 8, RandomReal(rng));
        break;
      case DType::kBool: {
        // Mostly 0 and 1, sometimes another nonzero byte (memory a client wrote as bool).
        const uint64_t r = rng();
        *p = (r & 3) == 0 ? static_cast<uint8_t>(r >> 8) : static_cast<uint8_t>((r >> 8) & 1);
        break;
      }
      default: {  // integers: every bit pattern
        const uint64_t r = rng();
        std::memcpy(p, &r, size);
        break;
      }
    }
  }
  return out;
}

// Real floating-point values as the bytes of `dtype`, and back.
inline Bytes EncodeReals(DType dtype, const std::vector<double>& values) {
  const size_t size = DTypeSize(dtype);
  Bytes out(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = &out[i * size];
    const auto f = static_cast<float>(values[i]);
    switch (dtype) {
      case DType::kFloat16:
        Store(p, FloatToHalf(f));
        break;
      case DType::kBFloat16:
        Store(p, FloatToBFloat16(f));
        break;
      case DType::kFloat32:
        Store(p, f);
        break;
      case DType::kFloat64:
        Store(p, values[i]);
        break;
      default:
        ADD_FAILURE() << "not a real floating dtype: " << DTypeName(dtype);
    }
  }
  return out;
}

inline double DecodeReal(DType dtype, const Bytes& bytes, size_t i) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfToFloat(Load<uint16_t>(&bytes[2 * i]));
    case DType::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(&bytes[2 * i]));
    case DType::kFloat32:
      return Load<float>(&bytes[4 * i]);
    case DType::kFloat64:
      return Load<double>(&bytes[8 * i]);
    default:
      ADD_FAILURE() << "not a real floating dtype: " << DTypeName(dtype);
      return 0;
  }
}

inline constexpr DType kRealFloatingDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                                DType::kFloat64};

}  // namespace reduce_testing
}  // namespace collectived
