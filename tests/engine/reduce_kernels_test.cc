// Tests of ReduceOp validation and of the reduction kernels. Every (op, dtype) pair appears
// explicitly: valid pairs are compared element by element against a scalar reference written
// here (never against another kernel), invalid pairs must be rejected by every entry point.
#include "engine/vocabulary/reduce_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels_x86.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------------------------
// The validity table, written by hand. Columns are the dtypes in enum order (kAllDTypes):
//   f16 bf16 f32 f64 i8 u8 i16 i32 i64 bool c64 c128
// ---------------------------------------------------------------------------------------------
constexpr std::string_view kValidity[] = {
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

bool ExpectedValid(ReduceOpKind kind, DType dtype) {
  if (dtype == DType::kUnspecified) return false;
  return kValidity[static_cast<int>(kind)][static_cast<int>(dtype) - 1] == 'Y';
}

struct Pair {
  ReduceOpKind kind;
  DType dtype;
};

// The combine function of a pair the test knows to be valid (StatusOr has no operator* on
// temporaries).
CombineFn Kernel(const ReduceOp& op, DType dtype) {
  StatusOr<CombineFn> fn = CombineFunction(op, dtype);
  EXPECT_TRUE(fn.ok()) << fn.status().ToString();
  return fn.ok() ? fn.value() : nullptr;
}

std::string PairName(const Pair& pair) {
  return std::string(ReduceOpName(pair.kind)) + "_" + std::string(DTypeName(pair.dtype));
}

std::vector<Pair> AllPairs(bool valid) {
  std::vector<Pair> pairs;
  for (ReduceOpKind kind : kAllReduceOpKinds) {
    if (!valid) pairs.push_back({kind, DType::kUnspecified});
    for (DType dtype : kAllDTypes) {
      if (ExpectedValid(kind, dtype) == valid) pairs.push_back({kind, dtype});
    }
  }
  return pairs;
}

// ---------------------------------------------------------------------------------------------
// Scalar reference, one element at a time, on raw bytes.
// ---------------------------------------------------------------------------------------------

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

template <typename F>
F RefFloat(ReduceOpKind kind, F a, F b) {
  const F nan = std::numeric_limits<F>::quiet_NaN();
  switch (kind) {
    case ReduceOpKind::kProduct:
      return a * b;
    case ReduceOpKind::kMin:
      if (std::isnan(a) || std::isnan(b)) return nan;
      return std::min(a, b);
    case ReduceOpKind::kMax:
      if (std::isnan(a) || std::isnan(b)) return nan;
      return std::max(a, b);
    default:  // SUM, AVG and PREMUL_SUM all combine by adding
      return a + b;
  }
}

// Wrap-around is computed in 64-bit unsigned arithmetic and truncated to the element width.
template <typename I>
I RefInt(ReduceOpKind kind, I a, I b) {
  const auto ua = static_cast<uint64_t>(a);
  const auto ub = static_cast<uint64_t>(b);
  switch (kind) {
    case ReduceOpKind::kProduct:
      return static_cast<I>(ua * ub);
    case ReduceOpKind::kMin:
      return std::min(a, b);
    case ReduceOpKind::kMax:
      return std::max(a, b);
    case ReduceOpKind::kBand:
      return static_cast<I>(ua & ub);
    case ReduceOpKind::kBor:
      return static_cast<I>(ua | ub);
    case ReduceOpKind::kBxor:
      return static_cast<I>(ua ^ ub);
    default:
      return static_cast<I>(ua + ub);
  }
}

uint8_t RefBool(ReduceOpKind kind, uint8_t a, uint8_t b) {
  const bool x = a != 0;
  const bool y = b != 0;
  switch (kind) {
    case ReduceOpKind::kProduct:
    case ReduceOpKind::kMin:
    case ReduceOpKind::kBand:
      return x && y;
    case ReduceOpKind::kBxor:
      return x != y;
    default:  // SUM, MAX, BOR
      return x || y;
  }
}

template <typename F>
void RefComplex(ReduceOpKind kind, const uint8_t* a, const uint8_t* b, uint8_t* out) {
  const F ar = Load<F>(a), ai = Load<F>(a + sizeof(F));
  const F br = Load<F>(b), bi = Load<F>(b + sizeof(F));
  F re, im;
  if (kind == ReduceOpKind::kProduct) {
    re = ar * br - ai * bi;
    im = ar * bi + ai * br;
  } else {
    re = ar + br;
    im = ai + bi;
  }
  Store(out, re);
  Store(out + sizeof(F), im);
}

using Encoder = uint16_t (*)(float);

void RefElement(ReduceOpKind kind, DType dtype, const uint8_t* a, const uint8_t* b, uint8_t* out) {
  switch (dtype) {
    case DType::kFloat16:
      Store(out, FloatToHalf(RefFloat(kind, HalfToFloat(Load<uint16_t>(a)),
                                      HalfToFloat(Load<uint16_t>(b)))));
      return;
    case DType::kBFloat16:
      Store(out, FloatToBFloat16(RefFloat(kind, BFloat16ToFloat(Load<uint16_t>(a)),
                                          BFloat16ToFloat(Load<uint16_t>(b)))));
      return;
    case DType::kFloat32:
      Store(out, RefFloat(kind, Load<float>(a), Load<float>(b)));
      return;
    case DType::kFloat64:
      Store(out, RefFloat(kind, Load<double>(a), Load<double>(b)));
      return;
    case DType::kInt8:
      Store(out, RefInt(kind, Load<int8_t>(a), Load<int8_t>(b)));
      return;
    case DType::kUInt8:
      Store(out, RefInt(kind, Load<uint8_t>(a), Load<uint8_t>(b)));
      return;
    case DType::kInt16:
      Store(out, RefInt(kind, Load<int16_t>(a), Load<int16_t>(b)));
      return;
    case DType::kInt32:
      Store(out, RefInt(kind, Load<int32_t>(a), Load<int32_t>(b)));
      return;
    case DType::kInt64:
      Store(out, RefInt(kind, Load<int64_t>(a), Load<int64_t>(b)));
      return;
    case DType::kBool:
      Store(out, RefBool(kind, Load<uint8_t>(a), Load<uint8_t>(b)));
      return;
    case DType::kComplex64:
      RefComplex<float>(kind, a, b, out);
      return;
    case DType::kComplex128:
      RefComplex<double>(kind, a, b, out);
      return;
    case DType::kUnspecified:
      break;
  }
  FAIL() << "no reference for dtype " << DTypeName(dtype);
}

Bytes Reference(const Pair& pair, const Bytes& a, const Bytes& b, size_t n) {
  const size_t size = DTypeSize(pair.dtype);
  Bytes out(n * size);
  for (size_t i = 0; i < n; ++i) {
    RefElement(pair.kind, pair.dtype, &a[i * size], &b[i * size], &out[i * size]);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparing elements. Floating point: equal values, or NaN on both sides (which NaN comes out
// is not specified). Complex PRODUCT tolerates a rounding difference in case the compiler
// contracts a*b-c*d into a fused multiply-add on one side only.
// ---------------------------------------------------------------------------------------------

template <typename F>
bool SameFloat(F x, F y, F tolerance = 0) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  if (x == y) return true;
  return tolerance > 0 && std::fabs(x - y) <= tolerance * std::max(std::fabs(x), std::fabs(y));
}

bool SameElement(const Pair& pair, const uint8_t* x, const uint8_t* y) {
  const bool product = pair.kind == ReduceOpKind::kProduct;
  switch (pair.dtype) {
    case DType::kFloat16:
      return SameFloat(HalfToFloat(Load<uint16_t>(x)), HalfToFloat(Load<uint16_t>(y)));
    case DType::kBFloat16:
      return SameFloat(BFloat16ToFloat(Load<uint16_t>(x)), BFloat16ToFloat(Load<uint16_t>(y)));
    case DType::kFloat32:
      return SameFloat(Load<float>(x), Load<float>(y));
    case DType::kFloat64:
      return SameFloat(Load<double>(x), Load<double>(y));
    case DType::kComplex64: {
      const float tolerance = product ? 1e-6f : 0.0f;
      return SameFloat(Load<float>(x), Load<float>(y), tolerance) &&
             SameFloat(Load<float>(x + 4), Load<float>(y + 4), tolerance);
    }
    case DType::kComplex128: {
      const double tolerance = product ? 1e-15 : 0.0;
      return SameFloat(Load<double>(x), Load<double>(y), tolerance) &&
             SameFloat(Load<double>(x + 8), Load<double>(y + 8), tolerance);
    }
    default:
      return std::memcmp(x, y, DTypeSize(pair.dtype)) == 0;
  }
}

std::string Hex(const uint8_t* p, size_t size) {
  std::ostringstream os;
  os << "0x" << std::hex;
  for (size_t i = size; i-- > 0;) os << (p[i] < 16 ? "0" : "") << static_cast<int>(p[i]);
  return os.str();
}

::testing::AssertionResult BuffersMatch(const Pair& pair, const uint8_t* got, const Bytes& want,
                                        size_t n) {
  const size_t size = DTypeSize(pair.dtype);
  size_t mismatches = 0;
  std::ostringstream report;
  for (size_t i = 0; i < n; ++i) {
    if (!SameElement(pair, got + i * size, &want[i * size])) {
      if (++mismatches <= 5) {
        report << "\n  element " << i << ": got " << Hex(got + i * size, size) << ", want "
               << Hex(&want[i * size], size);
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << PairName(pair) << ": " << mismatches << " of " << n
                                       << " elements differ" << report.str();
}

// ---------------------------------------------------------------------------------------------
// Test data.
// ---------------------------------------------------------------------------------------------

// A float with a random sign and magnitude across 2^-30..2^11 (float16 subnormals up to values
// whose products overflow float16), and now and then a zero, an infinity or a NaN.
double RandomReal(std::mt19937_64& rng) {
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

Bytes RandomBuffer(DType dtype, size_t n, std::mt19937_64& rng) {
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

// ---------------------------------------------------------------------------------------------
// Validation.
// ---------------------------------------------------------------------------------------------

TEST(ReduceOpTest, NamesAreTorchSpellings) {
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kSum), "SUM");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kAvg), "AVG");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kProduct), "PRODUCT");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kMin), "MIN");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kMax), "MAX");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kBand), "BAND");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kBor), "BOR");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kBxor), "BXOR");
  EXPECT_EQ(ReduceOpName(ReduceOpKind::kPremulSum), "PREMUL_SUM");
  EXPECT_EQ(ReduceOpName(static_cast<ReduceOpKind>(42)), "UNKNOWN");
}

TEST(ReduceOpTest, Helpers) {
  static_assert(ReduceOp{}.kind == ReduceOpKind::kSum);
  EXPECT_EQ(ReduceOp::Sum().kind, ReduceOpKind::kSum);
  EXPECT_EQ(ReduceOp::Avg().kind, ReduceOpKind::kAvg);
  EXPECT_EQ(ReduceOp::Product().kind, ReduceOpKind::kProduct);
  EXPECT_EQ(ReduceOp::Min().kind, ReduceOpKind::kMin);
  EXPECT_EQ(ReduceOp::Max().kind, ReduceOpKind::kMax);
  EXPECT_EQ(ReduceOp::Band().kind, ReduceOpKind::kBand);
  EXPECT_EQ(ReduceOp::Bor().kind, ReduceOpKind::kBor);
  EXPECT_EQ(ReduceOp::Bxor().kind, ReduceOpKind::kBxor);
  EXPECT_EQ(ReduceOp::PremulSum(0.25).kind, ReduceOpKind::kPremulSum);
  EXPECT_EQ(ReduceOp::PremulSum(0.25).scale, 0.25);
  EXPECT_EQ(ReduceOp::Sum().scale, 1.0);
  EXPECT_EQ(ReduceOp::PremulSum(0.25), ReduceOp::PremulSum(0.25));
  EXPECT_FALSE(ReduceOp::PremulSum(0.25) == ReduceOp::PremulSum(0.5));
  EXPECT_FALSE(ReduceOp::Sum() == ReduceOp::Avg());
}

TEST(ReduceOpTest, ValidityMatchesTheTable) {
  for (ReduceOpKind kind : kAllReduceOpKinds) {
    EXPECT_FALSE(ValidateReduceOp({kind, 1.0}, DType::kUnspecified).ok()) << ReduceOpName(kind);
    for (DType dtype : kAllDTypes) {
      EXPECT_EQ(ValidateReduceOp({kind, 1.0}, dtype).ok(), ExpectedValid(kind, dtype))
          << ReduceOpName(kind) << " on " << DTypeName(dtype);
    }
  }
}

TEST(ReduceOpTest, MessagesSayWhy) {
  EXPECT_EQ(ValidateReduceOp(ReduceOp::Band(), DType::kFloat32).message(),
            "ReduceOp BAND is not supported for dtype float32 (bitwise ops need an integer or "
            "bool dtype)");
  EXPECT_THAT(ValidateReduceOp(ReduceOp::Min(), DType::kComplex64).message(),
              HasSubstr("not ordered"));
  EXPECT_THAT(ValidateReduceOp(ReduceOp::Avg(), DType::kBool).message(),
              HasSubstr("ReduceOp AVG is not supported for dtype bool"));
  EXPECT_THAT(ValidateReduceOp(ReduceOp::PremulSum(2), DType::kInt32).message(),
              HasSubstr("ReduceOp PREMUL_SUM is not supported for dtype int32"));
  EXPECT_THAT(ValidateReduceOp(ReduceOp::Sum(), DType::kUnspecified).message(),
              HasSubstr("ReduceOp SUM is not supported for dtype unspecified"));
}

TEST(ReduceOpTest, OutOfRangeValuesAreRejectedAndShown) {
  Status bad_dtype = ValidateReduceOp(ReduceOp::Sum(), static_cast<DType>(42));
  EXPECT_TRUE(bad_dtype.IsInvalidArgument());
  EXPECT_THAT(bad_dtype.message(), HasSubstr("42"));
  EXPECT_THAT(bad_dtype.message(), HasSubstr("SUM"));
  Status bad_kind = ValidateReduceOp({static_cast<ReduceOpKind>(42), 1.0}, DType::kFloat32);
  EXPECT_TRUE(bad_kind.IsInvalidArgument());
  EXPECT_THAT(bad_kind.message(), HasSubstr("42"));
  EXPECT_THAT(bad_kind.message(), HasSubstr("float32"));
  EXPECT_FALSE(CombineFunction({static_cast<ReduceOpKind>(42), 1.0}, DType::kFloat32).ok());
  EXPECT_FALSE(CombineFunction(ReduceOp::Sum(), static_cast<DType>(-1)).ok());
}

TEST(ReduceOpTest, PremulSumScaleMustBeFinite) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                      DType::kComplex64, DType::kComplex128}) {
    for (double scale : {inf, -inf, nan}) {
      Status status = ValidateReduceOp(ReduceOp::PremulSum(scale), dtype);
      EXPECT_TRUE(status.IsInvalidArgument()) << DTypeName(dtype) << " " << scale;
      EXPECT_THAT(status.message(), HasSubstr("PREMUL_SUM"));
      EXPECT_THAT(status.message(), HasSubstr(std::string(DTypeName(dtype))));
      EXPECT_FALSE(CombineFunction(ReduceOp::PremulSum(scale), dtype).ok());
    }
    EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(-3.5), dtype).ok());
    EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(0.0), dtype).ok());
  }
  // Finite as a double but not as a float, the type float32-like dtypes are scaled in.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kComplex64}) {
    EXPECT_FALSE(ValidateReduceOp(ReduceOp::PremulSum(1e300), dtype).ok()) << DTypeName(dtype);
  }
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(1e300), DType::kFloat64).ok());
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::PremulSum(1e300), DType::kComplex128).ok());
  // The scale of any other op is ignored.
  EXPECT_TRUE(ValidateReduceOp({ReduceOpKind::kSum, nan}, DType::kFloat32).ok());
}

// ---------------------------------------------------------------------------------------------
// Every invalid pair is rejected by every entry point, naming the op and the dtype.
// ---------------------------------------------------------------------------------------------

class InvalidPairTest : public ::testing::TestWithParam<Pair> {};

TEST_P(InvalidPairTest, RejectedByEveryEntryPoint) {
  const Pair pair = GetParam();
  const ReduceOp op{pair.kind, 2.0};
  const std::string op_name(ReduceOpName(pair.kind));
  const std::string dtype_name(DTypeName(pair.dtype));

  StatusOr<CombineFn> fn = CombineFunction(op, pair.dtype);
  ASSERT_FALSE(fn.ok());
  EXPECT_TRUE(fn.status().IsInvalidArgument()) << fn.status().ToString();
  EXPECT_THAT(fn.status().message(), HasSubstr(op_name));
  EXPECT_THAT(fn.status().message(), HasSubstr(dtype_name));

  Bytes data(64, 0x5a);
  const Bytes before = data;
  Status pre = PreScale(op, pair.dtype, data.data(), 4);
  EXPECT_TRUE(pre.IsInvalidArgument()) << pre.ToString();
  EXPECT_THAT(pre.message(), HasSubstr(op_name));
  EXPECT_THAT(pre.message(), HasSubstr(dtype_name));

  Status fin = Finalize(op, pair.dtype, data.data(), 4, 2);
  EXPECT_TRUE(fin.IsInvalidArgument()) << fin.ToString();
  EXPECT_THAT(fin.message(), HasSubstr(op_name));
  EXPECT_THAT(fin.message(), HasSubstr(dtype_name));
  EXPECT_EQ(data, before) << "a rejected call touched the data";
}

INSTANTIATE_TEST_SUITE_P(AllInvalidPairs, InvalidPairTest, ::testing::ValuesIn(AllPairs(false)),
                         [](const ::testing::TestParamInfo<Pair>& info) {
                           return PairName(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// Every valid pair matches the reference, for many lengths and every kind of aliasing.
// ---------------------------------------------------------------------------------------------

// Lengths around SSE/AVX/AVX-512 vector widths for every element size, and one large odd one.
constexpr size_t kLengths[] = {0, 1, 2, 3, 7, 15, 16, 17, 33, 64, 1000, 4097, 1000003};

class ValidPairTest : public ::testing::TestWithParam<std::tuple<Pair, size_t>> {};

TEST_P(ValidPairTest, MatchesScalarReference) {
  const auto [pair, n] = GetParam();
  StatusOr<CombineFn> fn_or = CombineFunction(ReduceOp{pair.kind, 0.5}, pair.dtype);
  ASSERT_TRUE(fn_or.ok()) << fn_or.status().ToString();
  const CombineFn fn = *fn_or;
  const size_t size = DTypeSize(pair.dtype);

  std::mt19937_64 rng(n * 131 + static_cast<size_t>(pair.kind) * 17 +
                      static_cast<size_t>(pair.dtype));
  const Bytes a = RandomBuffer(pair.dtype, n, rng);
  const Bytes b = RandomBuffer(pair.dtype, n, rng);
  const Bytes want_ab = Reference(pair, a, b, n);
  const Bytes want_aa = Reference(pair, a, a, n);

  {
    SCOPED_TRACE("out, a and b distinct");
    Bytes out(n * size), a2 = a, b2 = b;
    fn(out.data(), a2.data(), b2.data(), n);
    EXPECT_TRUE(BuffersMatch(pair, out.data(), want_ab, n));
    EXPECT_EQ(a2, a) << "input a was modified";
    EXPECT_EQ(b2, b) << "input b was modified";
  }
  {
    SCOPED_TRACE("out == a");
    Bytes inout = a, b2 = b;
    fn(inout.data(), inout.data(), b2.data(), n);
    EXPECT_TRUE(BuffersMatch(pair, inout.data(), want_ab, n));
    EXPECT_EQ(b2, b) << "input b was modified";
  }
  {
    SCOPED_TRACE("out == b");
    Bytes a2 = a, inout = b;
    fn(inout.data(), a2.data(), inout.data(), n);
    EXPECT_TRUE(BuffersMatch(pair, inout.data(), want_ab, n));
    EXPECT_EQ(a2, a) << "input a was modified";
  }
  {
    SCOPED_TRACE("out == a == b");
    Bytes inout = a;
    fn(inout.data(), inout.data(), inout.data(), n);
    EXPECT_TRUE(BuffersMatch(pair, inout.data(), want_aa, n));
  }
  {
    SCOPED_TRACE("a == b, out distinct");
    Bytes out(n * size), a2 = a;
    fn(out.data(), a2.data(), a2.data(), n);
    EXPECT_TRUE(BuffersMatch(pair, out.data(), want_aa, n));
  }
  {
    // Each buffer starts at a different offset from the allocation's alignment, so that no two
    // are equally misaligned relative to the vector width.
    SCOPED_TRACE("buffers at different alignments");
    Bytes out(n * size + 4 * size), a2(n * size + 4 * size), b2(n * size + 4 * size);
    std::copy(a.begin(), a.end(), a2.begin() + size);
    std::copy(b.begin(), b.end(), b2.begin() + 2 * size);
    fn(out.data() + 3 * size, a2.data() + size, b2.data() + 2 * size, n);
    EXPECT_TRUE(BuffersMatch(pair, out.data() + 3 * size, want_ab, n));
  }
}

INSTANTIATE_TEST_SUITE_P(AllValidPairs, ValidPairTest,
                         ::testing::Combine(::testing::ValuesIn(AllPairs(true)),
                                            ::testing::ValuesIn(kLengths)),
                         [](const ::testing::TestParamInfo<std::tuple<Pair, size_t>>& info) {
                           return PairName(std::get<0>(info.param)) + "_n" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Partial overlap is not how the engine calls the kernels, but it must not corrupt memory, and
// the contract promises the result of an index-order loop.
class PartialOverlapTest : public ::testing::TestWithParam<Pair> {};

TEST_P(PartialOverlapTest, BehavesLikeAnIndexOrderLoop) {
  const Pair pair = GetParam();
  const CombineFn fn = Kernel(ReduceOp{pair.kind, 0.5}, pair.dtype);
  const size_t size = DTypeSize(pair.dtype);
  std::mt19937_64 rng(static_cast<size_t>(pair.kind) * 17 + static_cast<size_t>(pair.dtype));
  for (size_t n : {1, 7, 17, 33, 100, 1001}) {
    for (bool overlaps_a : {true, false}) {
      for (ptrdiff_t shift : {-5, -1, 1, 3}) {
        SCOPED_TRACE("n " + std::to_string(n) + ", out = " + (overlaps_a ? "a" : "b") + " + " +
                     std::to_string(shift) + " elements");
        const size_t base = 8;  // elements before the shared operand, so out may start before it
        Bytes buffer = RandomBuffer(pair.dtype, n + 2 * base, rng);
        const Bytes other = RandomBuffer(pair.dtype, n, rng);
        const auto offset = shift * static_cast<ptrdiff_t>(size);
        Bytes want = buffer;
        uint8_t* shared = want.data() + base * size;
        for (size_t i = 0; i < n; ++i) {  // the reference loop, in place
          uint8_t element[16];
          const uint8_t* x = overlaps_a ? shared + i * size : &other[i * size];
          const uint8_t* y = overlaps_a ? &other[i * size] : shared + i * size;
          RefElement(pair.kind, pair.dtype, x, y, element);
          std::memcpy(shared + offset + i * size, element, size);
        }
        uint8_t* got_shared = buffer.data() + base * size;
        if (overlaps_a) {
          fn(got_shared + offset, got_shared, other.data(), n);
        } else {
          fn(got_shared + offset, other.data(), got_shared, n);
        }
        ASSERT_TRUE(BuffersMatch(pair, buffer.data(), want, n + 2 * base));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllValidPairs, PartialOverlapTest, ::testing::ValuesIn(AllPairs(true)),
                         [](const ::testing::TestParamInfo<Pair>& info) {
                           return PairName(info.param);
                         });

TEST(CombineFunctionTest, AvgAndPremulSumCombineAsSum) {
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::kBool) continue;
    const CombineFn sum = Kernel(ReduceOp::Sum(), dtype);
    EXPECT_EQ(Kernel(ReduceOp::Avg(), dtype), sum) << DTypeName(dtype);
    if (IsFloatingPoint(dtype) || IsComplex(dtype)) {
      EXPECT_EQ(Kernel(ReduceOp::PremulSum(3.0), dtype), sum) << DTypeName(dtype);
    }
  }
}

TEST(CombineFunctionTest, EmptyInputsMayBeNull) {
  for (const Pair& pair : AllPairs(true)) {
    const CombineFn fn = Kernel(ReduceOp{pair.kind, 1.0}, pair.dtype);
    fn(nullptr, nullptr, nullptr, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Floating point specials.
// ---------------------------------------------------------------------------------------------

Bytes EncodeReals(DType dtype, const std::vector<double>& values) {
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

double DecodeReal(DType dtype, const Bytes& bytes, size_t i) {
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

constexpr DType kRealFloatingDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                         DType::kFloat64};

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

// ---------------------------------------------------------------------------------------------
// float16/bfloat16 SUM: the vector loops (AVX2/F16C, chosen at run time) and the portable loops
// give the same bits for every input pattern, every tail length and every aliasing; only a NaN
// result may carry another payload (it must still be a NaN).
// ---------------------------------------------------------------------------------------------

bool IsNan16(DType dtype, uint16_t bits) {
  const uint16_t magnitude = bits & 0x7fff;
  return dtype == DType::kFloat16 ? magnitude > 0x7c00 : magnitude > 0x7f80;
}

TEST(ReduceKernelsTest, VectorAndPortableHalfSumsAgreeOnEveryPatternTailAndAliasing) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    CombineFn fastest = *CombineFunction(ReduceOp::Sum(), dtype, KernelChoice::kFastest);
    CombineFn portable = *CombineFunction(ReduceOp::Sum(), dtype, KernelChoice::kPortable);
    // Every bit pattern against three partners: itself shifted, a random pattern, its negation.
    std::mt19937 random(7);
    std::vector<uint16_t> a(65536), partners[3];
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i);
    for (auto& p : partners) p.resize(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      partners[0][i] = static_cast<uint16_t>(i * 7919 + 13);
      partners[1][i] = static_cast<uint16_t>(random());
      partners[2][i] = static_cast<uint16_t>(i ^ 0x8000);
    }
    auto expect_same = [&](const std::vector<uint16_t>& x, const std::vector<uint16_t>& y,
                           const char* what) {
      ASSERT_EQ(x.size(), y.size());
      size_t differing = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const bool both_nan = IsNan16(dtype, x[i]) && IsNan16(dtype, y[i]);
        if (x[i] != y[i] && !both_nan && ++differing <= 3) {
          ADD_FAILURE() << what << ": element " << i << ": vector " << x[i] << ", portable "
                        << y[i];
        }
      }
      EXPECT_EQ(differing, 0u) << what;
    };
    for (const auto& b : partners) {
      std::vector<uint16_t> fast(a.size()), slow(a.size());
      fastest(fast.data(), a.data(), b.data(), a.size());
      portable(slow.data(), a.data(), b.data(), a.size());
      expect_same(fast, slow, "distinct buffers");
      // In place, on either side, and all three the same buffer.
      std::vector<uint16_t> fast_a = a, slow_a = a, fast_b = b, slow_b = b;
      fastest(fast_a.data(), fast_a.data(), b.data(), a.size());
      portable(slow_a.data(), slow_a.data(), b.data(), a.size());
      expect_same(fast_a, slow_a, "out is a");
      fastest(fast_b.data(), a.data(), fast_b.data(), a.size());
      portable(slow_b.data(), a.data(), slow_b.data(), a.size());
      expect_same(fast_b, slow_b, "out is b");
      std::vector<uint16_t> fast_all = b, slow_all = b;
      fastest(fast_all.data(), fast_all.data(), fast_all.data(), a.size());
      portable(slow_all.data(), slow_all.data(), slow_all.data(), a.size());
      expect_same(fast_all, slow_all, "out, a and b the same");
    }
    // Every length up to 40 (the vector body and the scalar tail), at odd offsets.
    for (size_t n = 0; n <= 40; ++n) {
      std::vector<uint16_t> fast(n + 1, 0xabcd), slow(n + 1, 0xabcd);
      fastest(fast.data() + 1, a.data() + 15361, partners[1].data() + 3, n);
      portable(slow.data() + 1, a.data() + 15361, partners[1].data() + 3, n);
      expect_same(fast, slow, "short lengths");
      EXPECT_EQ(fast[0], 0xabcd) << "nothing written before the output";
    }
    // Partially overlapping buffers: index order, like the portable loop.
    std::vector<uint16_t> fast(partners[1].begin(), partners[1].begin() + 100), slow = fast;
    fastest(fast.data() + 3, fast.data(), fast.data() + 1, 90);
    portable(slow.data() + 3, slow.data(), slow.data() + 1, 90);
    expect_same(fast, slow, "partial overlap");
  }
  if (!x86::HasAvx2AndF16c()) {
    GTEST_SKIP() << "this CPU has no AVX2/F16C: both choices ran the portable loops";
  }
}

}  // namespace
}  // namespace collectived
