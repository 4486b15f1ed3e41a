// The reduction kernels against a scalar reference written here (never another kernel): every
// valid (op, dtype) pair, element by element, for many lengths and every kind of aliasing; and
// the vector and portable float16/bfloat16 SUM loops, bit for bit.
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
#include <tuple>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels_x86.h"
#include "engine/vocabulary/reduce_op.h"
#include "tests/engine/reduce_kernels_test_helpers.h"

namespace collectived {
namespace {

using namespace reduce_testing;  // NOLINT: the helpers of these tests

// ---------------------------------------------------------------------------------------------
// Scalar reference, one element at a time, on raw bytes.
// ---------------------------------------------------------------------------------------------

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
