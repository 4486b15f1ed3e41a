#include "engine/vocabulary/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace collectived {
namespace {

using ::testing::HasSubstr;

// The conversions are constexpr; these also pin a few exact encodings at compile time.
static_assert(FloatToHalf(1.0f) == 0x3c00);
static_assert(HalfToFloat(0xc000) == -2.0f);
static_assert(FloatToBFloat16(1.0f) == 0x3f80);
static_assert(BFloat16ToFloat(0x4049) == 3.140625f);

uint32_t Bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
float FromBits(uint32_t u) {
  return std::bit_cast<float>(u);
}

TEST(DTypeTest, SizesMatchTorch) {
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kInt16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInt32), 4u);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kComplex64), 8u);
  EXPECT_EQ(DTypeSize(DType::kComplex128), 16u);
  EXPECT_EQ(DTypeSize(DType::kUnspecified), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(99)), 0u);
}

TEST(DTypeTest, NumbersMatchTheProtobufEnum) {
  EXPECT_EQ(static_cast<int32_t>(DType::kUnspecified), 0);
  EXPECT_EQ(static_cast<int32_t>(DType::kFloat16), 1);
  EXPECT_EQ(static_cast<int32_t>(DType::kBFloat16), 2);
  EXPECT_EQ(static_cast<int32_t>(DType::kFloat32), 3);
  EXPECT_EQ(static_cast<int32_t>(DType::kFloat64), 4);
  EXPECT_EQ(static_cast<int32_t>(DType::kInt8), 5);
  EXPECT_EQ(static_cast<int32_t>(DType::kUInt8), 6);
  EXPECT_EQ(static_cast<int32_t>(DType::kInt16), 7);
  EXPECT_EQ(static_cast<int32_t>(DType::kInt32), 8);
  EXPECT_EQ(static_cast<int32_t>(DType::kInt64), 9);
  EXPECT_EQ(static_cast<int32_t>(DType::kBool), 10);
  EXPECT_EQ(static_cast<int32_t>(DType::kComplex64), 11);
  EXPECT_EQ(static_cast<int32_t>(DType::kComplex128), 12);
}

TEST(DTypeTest, AllDTypesListsTheTwelveOnce) {
  std::set<int32_t> seen;
  for (DType dtype : kAllDTypes) seen.insert(static_cast<int32_t>(dtype));
  ASSERT_EQ(seen.size(), 12u);
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*seen.rbegin(), 12);
}

TEST(DTypeTest, NamesAreTorchSpellings) {
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kFloat64), "float64");
  EXPECT_EQ(DTypeName(DType::kInt8), "int8");
  EXPECT_EQ(DTypeName(DType::kUInt8), "uint8");
  EXPECT_EQ(DTypeName(DType::kInt16), "int16");
  EXPECT_EQ(DTypeName(DType::kInt32), "int32");
  EXPECT_EQ(DTypeName(DType::kInt64), "int64");
  EXPECT_EQ(DTypeName(DType::kBool), "bool");
  EXPECT_EQ(DTypeName(DType::kComplex64), "complex64");
  EXPECT_EQ(DTypeName(DType::kComplex128), "complex128");
  EXPECT_EQ(DTypeName(DType::kUnspecified), "unspecified");
  EXPECT_EQ(DTypeName(static_cast<DType>(-3)), "invalid");
}

TEST(DTypeTest, NameRoundTripsWithAndWithoutTorchPrefix) {
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    StatusOr<DType> parsed = DTypeFromName(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, dtype) << name;
    StatusOr<DType> prefixed = DTypeFromName("torch." + name);
    ASSERT_TRUE(prefixed.ok()) << name << ": " << prefixed.status().ToString();
    EXPECT_EQ(*prefixed, dtype) << name;
  }
}

TEST(DTypeTest, AcceptsTorchAliases) {
  const std::pair<std::string, DType> aliases[] = {
      {"half", DType::kFloat16},     {"float", DType::kFloat32},      {"double", DType::kFloat64},
      {"short", DType::kInt16},      {"int", DType::kInt32},          {"long", DType::kInt64},
      {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128},
  };
  for (const auto& [alias, dtype] : aliases) {
    for (const std::string& name : {alias, "torch." + alias}) {
      StatusOr<DType> parsed = DTypeFromName(name);
      ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
      EXPECT_EQ(*parsed, dtype) << name;
    }
  }
}

TEST(DTypeTest, RejectsBadNamesAndNamesThem) {
  for (const std::string name : {"complex32", "torch.complex32", "chalf", "Float32", "FLOAT",
                                 "float8", "uint16", "", "torch.", "torch", "unspecified",
                                 " float32", "float32 ", "torch.torch.float32", "quint8"}) {
    StatusOr<DType> parsed = DTypeFromName(name);
    ASSERT_FALSE(parsed.ok()) << "'" << name << "' was accepted";
    EXPECT_TRUE(parsed.status().IsInvalidArgument()) << parsed.status().ToString();
    EXPECT_THAT(parsed.status().message(), HasSubstr("'" + name + "'"));
  }
  EXPECT_THAT(DTypeFromName("complex32").status().message(), HasSubstr("not supported"));
  EXPECT_THAT(DTypeFromName("float8").status().message(), HasSubstr("unknown dtype"));
}

TEST(DTypeTest, IsValidDTypeAcceptsOnlyTheTwelve) {
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(-1));
  EXPECT_FALSE(IsValidDType(13));
  EXPECT_FALSE(IsValidDType(std::numeric_limits<int32_t>::min()));
  EXPECT_FALSE(IsValidDType(std::numeric_limits<int32_t>::max()));
  for (int32_t value = 1; value <= 12; ++value) EXPECT_TRUE(IsValidDType(value)) << value;
}

TEST(DTypeTest, Predicates) {
  for (DType dtype : kAllDTypes) {
    const bool floating = dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
                          dtype == DType::kFloat32 || dtype == DType::kFloat64;
    const bool complex = dtype == DType::kComplex64 || dtype == DType::kComplex128;
    const bool integral = dtype == DType::kInt8 || dtype == DType::kUInt8 ||
                          dtype == DType::kInt16 || dtype == DType::kInt32 ||
                          dtype == DType::kInt64;
    EXPECT_EQ(IsFloatingPoint(dtype), floating) << DTypeName(dtype);
    EXPECT_EQ(IsComplex(dtype), complex) << DTypeName(dtype);
    EXPECT_EQ(IsIntegral(dtype), integral) << DTypeName(dtype);
  }
  EXPECT_FALSE(IsIntegral(DType::kBool));
  EXPECT_FALSE(IsFloatingPoint(DType::kUnspecified));
  EXPECT_FALSE(IsComplex(DType::kUnspecified));
  EXPECT_FALSE(IsIntegral(DType::kUnspecified));
}

// ---------------------------------------------------------------------------------------------
// float16
// ---------------------------------------------------------------------------------------------

// Value of float16 bits from the IEEE definition, in double.
double HalfReferenceValue(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) {
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  }
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Nearest float16 to `f` by search among all finite float16 values, ties to even: slow and
// obviously right.
uint16_t HalfReference(float f) {
  if (std::isnan(f)) return 0x7e00;  // only NaN-ness is compared
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(f));
  if (x >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp (2^4) rounds up to inf
  // Positive finite float16 bits 0..0x7bff are sorted by value: find the neighbours of x.
  uint16_t lo = 0;
  uint16_t hi = 0x7bff;
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (HalfReferenceValue(mid) <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (HalfReferenceValue(hi) <= x) lo = hi;  // x is at or above the largest finite
  if (HalfReferenceValue(lo) == x || lo == 0x7bff) return sign | lo;
  const uint16_t up = static_cast<uint16_t>(lo + 1);
  const double d_lo = x - HalfReferenceValue(lo);
  const double d_up = HalfReferenceValue(up) - x;
  if (d_lo < d_up) return sign | lo;
  if (d_up < d_lo) return sign | up;
  return sign | ((lo & 1) ? up : lo);
}

TEST(HalfTest, WideningIsExactForEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const double expected = HalfReferenceValue(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      // The payload survives: the float16 mantissa is the top of the float mantissa.
      ASSERT_EQ((Bits(f) >> 13) & 0x3ff, h & 0x3ff) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), expected) << std::hex << h;
    }
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
  }
}

TEST(HalfTest, NarrowingExactValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-1.5f), 0xbe00);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);                  // largest finite
  EXPECT_EQ(FloatToHalf(6.103515625e-05f), 0x0400);          // smallest normal, 2^-14
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(FloatToHalf(-std::ldexp(5.0f, -24)), 0x8005);
}

TEST(HalfTest, NarrowingRoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: the even one (1) wins.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above a tie rounds up; just below rounds down.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 3 * std::ldexp(1.0f, -11), 0.0f)), 0x3c01);
  // A mantissa carry moves into the exponent: 2 - 2^-12 rounds up to 2.
  EXPECT_EQ(FloatToHalf(2.0f - std::ldexp(1.0f, -12)), 0x4000);
  // Subnormal ties: 2^-25 is halfway between 0 and 2^-24, 3 * 2^-25 between 1 and 2 ulps.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -30)), 0x8000);  // underflow keeps the sign
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.75f, -24)), 0x0400);
  // Float subnormals are all far below float16's range.
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(HalfTest, NarrowingOverflowsToInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);  // below the tie at 65520
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);   // the tie goes to the even "mantissa" of inf
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::max()), 0xfc00);
}

TEST(HalfTest, NarrowingKeepsNaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::numeric_limits<float>::signaling_NaN();
  for (float nan : {qnan, -qnan, snan, FromBits(0x7f800001u), FromBits(0xffc12345u)}) {
    const uint16_t h = FloatToHalf(nan);
    EXPECT_EQ(h & 0x7c00, 0x7c00) << std::hex << Bits(nan);
    EXPECT_NE(h & 0x03ff, 0) << "NaN became infinity: " << std::hex << Bits(nan);
    EXPECT_NE(h & 0x0200, 0) << "not a quiet NaN: " << std::hex << h;
    EXPECT_EQ((h & 0x8000) != 0, std::signbit(nan)) << std::hex << Bits(nan);
  }
  // The top payload bits survive.
  EXPECT_EQ(FloatToHalf(FromBits(0x7fc12345u)), 0x7e00 | ((0x7fc12345u >> 13) & 0x3ff));
}

TEST(HalfTest, EveryValueRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t back = FloatToHalf(HalfToFloat(static_cast<uint16_t>(h)));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      ASSERT_EQ(back, h | 0x200) << std::hex << h;  // quieted, otherwise unchanged
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

// Floats around every float16 value and every midpoint between neighbours (the rounding
// boundaries), plus a sweep over the whole float range.
std::vector<float> NarrowingProbes() {
  std::vector<float> probes;
  for (uint32_t h = 0; h <= 0x7bff; ++h) {
    const double v = HalfReferenceValue(static_cast<uint16_t>(h));
    // Past the largest finite value (65504) the next step of the grid would be 65536.
    const double next = h < 0x7bff ? HalfReferenceValue(static_cast<uint16_t>(h + 1)) : 65536.0;
    for (double point : {v, (v + next) / 2}) {
      const auto f = static_cast<float>(point);  // both points are exact in float
      for (float probe : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e30f)}) {
        probes.push_back(probe);
        probes.push_back(-probe);
      }
    }
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) {
    probes.push_back(FromBits(static_cast<uint32_t>(bits)));
  }
  return probes;
}

TEST(HalfTest, NarrowingMatchesSearchReference) {
  for (float f : NarrowingProbes()) {
    const uint16_t got = FloatToHalf(f);
    const uint16_t want = HalfReference(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7e00, 0x7e00) << std::hex << Bits(f);
    } else {
      ASSERT_EQ(got, want) << "float " << f << " bits 0x" << std::hex << Bits(f);
    }
  }
}

#if defined(__FLT16_MANT_DIG__)
// GCC's _Float16 converts in software (libgcc) unless the target has AVX-512 FP16: a second,
// independent opinion.
TEST(HalfTest, NarrowingMatchesCompilerFloat16) {
  for (float f : NarrowingProbes()) {
    if (std::isnan(f)) continue;
    const auto h = static_cast<_Float16>(f);
    ASSERT_EQ(FloatToHalf(f), std::bit_cast<uint16_t>(h)) << std::hex << Bits(f);
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto x = std::bit_cast<_Float16>(static_cast<uint16_t>(h));
    const auto f = static_cast<float>(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(Bits(HalfToFloat(static_cast<uint16_t>(h))), Bits(f)) << std::hex << h;
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// bfloat16
// ---------------------------------------------------------------------------------------------

// Nearest bfloat16 to `f`, ties to even, from the two truncation candidates compared in double.
uint16_t BFloat16Reference(float f) {
  const uint32_t bits = Bits(f);
  const auto down = static_cast<uint16_t>(bits >> 16);
  const auto up = static_cast<uint16_t>(down + 1);
  const double x = f;
  const double d_down = std::fabs(x - static_cast<double>(FromBits(uint32_t{down} << 16)));
  // Above the largest finite magnitude the next candidate is infinity: compare against the
  // value 2^128, where the exponent would go.
  const double up_value = (up & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0, 128), x)
                                                  : FromBits(uint32_t{up} << 16);
  const double d_up = std::fabs(up_value - x);
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1) ? up : down;
}

TEST(BFloat16Test, ExactValues) {
  EXPECT_EQ(FloatToBFloat16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(3.14159265f), 0x4049);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0x7f7f), FromBits(0x7f7f0000u));  // largest finite
  EXPECT_EQ(BFloat16ToFloat(0x0001), FromBits(0x00010000u));  // a float subnormal
}

TEST(BFloat16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3fffffffu)), 0x4000);  // carry into the exponent
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00008000u)), 0x0000);  // subnormal tie to even zero
  EXPECT_EQ(FloatToBFloat16(FromBits(0x00018000u)), 0x0002);  // subnormal tie to even
  EXPECT_EQ(FloatToBFloat16(FromBits(0x80008001u)), 0x8001);  // negative subnormal
}

TEST(BFloat16Test, InfinityAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBFloat16(inf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-inf), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fffu)), 0x7f7f);  // stays finite
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(0x7f80)));
}

TEST(BFloat16Test, KeepsNaN) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  for (float nan : {qnan, -qnan, std::numeric_limits<float>::signaling_NaN(), FromBits(0x7f800001u),
                    FromBits(0xff80ffffu), FromBits(0x7fffffffu)}) {
    const uint16_t b = FloatToBFloat16(nan);
    EXPECT_TRUE(std::isnan(BFloat16ToFloat(b))) << std::hex << Bits(nan);
    EXPECT_NE(b & 0x40, 0) << "not quiet: " << std::hex << b;
    EXPECT_EQ((b & 0x8000) != 0, std::signbit(nan));
  }
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7fc12345u)), 0x7fc1);  // top payload kept
}

TEST(BFloat16Test, EveryValueRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(Bits(f), b << 16);
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    ASSERT_EQ(FloatToBFloat16(f), nan ? (b | 0x40) : b) << std::hex << b;
  }
}

TEST(BFloat16Test, MatchesTwoCandidateReference) {
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 997) {
    const float f = FromBits(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f), BFloat16Reference(f)) << std::hex << bits;
  }
  // Every tie and its neighbours, across all exponents.
  for (uint32_t hi = 0; hi <= 0xffff; ++hi) {
    const uint32_t tie = (hi << 16) | 0x8000u;
    for (uint32_t bits : {tie - 1, tie, tie + 1}) {
      const float f = FromBits(bits);
      if (std::isnan(f)) continue;
      ASSERT_EQ(FloatToBFloat16(f), BFloat16Reference(f)) << std::hex << bits;
    }
  }
}

}  // namespace
}  // namespace collectived
