// DType: the element types collectived moves and reduces, numbered like the protobuf enum and
// named like torch, plus the float16/bfloat16 <-> float conversions the reduction kernels use.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/vocabulary/dtype_enum.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// Every real dtype (kUnspecified excluded), in enum order.
inline constexpr std::array<DType, 12> kAllDTypes = {
    DType::kFloat16, DType::kBFloat16, DType::kFloat32,   DType::kFloat64,
    DType::kInt8,    DType::kUInt8,    DType::kInt16,     DType::kInt32,
    DType::kInt64,   DType::kBool,     DType::kComplex64, DType::kComplex128,
};

// Returns the size in bytes of one element of `dtype` (1 for bool, 2 for float16, 16 for
// complex128). Returns 0 for kUnspecified and for values outside the enum.
size_t DTypeSize(DType dtype);

// Returns torch's name for `dtype` without the "torch." prefix: "float16", "bfloat16",
// "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool", "complex64",
// "complex128". Returns "unspecified" for kUnspecified and "invalid" for values outside the
// enum. The view refers to static storage.
std::string_view DTypeName(DType dtype);

// Parses a dtype name as torch spells it: the names DTypeName returns, the same with a
// "torch." prefix ("torch.float32"), and torch's aliases half, float, double, short, int,
// long, cfloat and cdouble (with or without the prefix). Matching is case-sensitive.
// Returns the dtype on success. Returns InvalidArgument naming `name` when it is not one of
// those, including "unspecified" and torch dtypes collectived does not support (complex32).
StatusOr<DType> DTypeFromName(std::string_view name);

// Returns true when `value` is the number of one of the 12 dtypes of kAllDTypes; false for
// kUnspecified (0) and for any other number. Use it on integers that come off the wire before
// casting them to DType.
bool IsValidDType(int32_t value);

// float16, bfloat16, float32 and float64 (complex types are not "floating point" here, as in
// torch's is_floating_point).
constexpr bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

// complex64 and complex128.
constexpr bool IsComplex(DType dtype) {
  return dtype == DType::kComplex64 || dtype == DType::kComplex128;
}

// The integer types int8, uint8, int16, int32 and int64; bool is not integral here.
constexpr bool IsIntegral(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kUInt8 || dtype == DType::kInt16 ||
         dtype == DType::kInt32 || dtype == DType::kInt64;
}

// ---------------------------------------------------------------------------------------------
// float16 (IEEE binary16) and bfloat16, stored as their raw uint16_t bits.
//
// The conversions are branch-free so that the kernels' loops that call them auto-vectorise
// (SSE4 is enough; they need neither F16C nor AVX-512). Narrowing
// rounds to nearest, ties to even, overflows to infinity, keeps the sign of zero, and maps a NaN
// to a quiet NaN with the same sign and the top payload bits. Widening is exact.
// ---------------------------------------------------------------------------------------------

namespace dtype_internal {

// Returns `c ? x : y` computed with masks. A plain `?:` whose arm holds a float operation gets
// sunk into a branch, and GCC will not if-convert it back (the operation "could trap" under
// -ftrapping-math), which stops vectorisation of every loop that converts float16.
constexpr uint32_t Select(bool c, uint32_t x, uint32_t y) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (x & mask) | (y & ~mask);
}

}  // namespace dtype_internal

// Returns the float equal to the float16 whose bits are `h` (exact, subnormals included).
constexpr float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  // Signed lanes for the compares below: SSE4 compares signed integers in one instruction.
  const int32_t abs = h & 0x7fff;
  const int32_t exp_mant = abs << 13;  // float16 exponent and mantissa in their float places
  // Normal: rebias the exponent by 127 - 15; infinity/NaN (exponent 31): on to 255.
  const int32_t wide = exp_mant + (abs >= 0x7c00 ? 0x70000000 : 0x38000000);
  // A subnormal float16 is mantissa * 2^-24: exact in float, and a vectorisable int->float.
  const float subnormal = static_cast<float>(abs) * 0x1p-24f;
  const uint32_t out = dtype_internal::Select(abs < 0x400, std::bit_cast<uint32_t>(subnormal),
                                              static_cast<uint32_t>(wide));
  return std::bit_cast<float>(out | sign);
}

// Returns the bits of the float16 nearest to `f` (round to nearest, ties to even).
constexpr uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  // Normal float16 results: rebias the exponent (-(127 - 15) << 23, modulo 2^32) and round the
  // 13 dropped mantissa bits to nearest even; a carry out of the mantissa correctly bumps the
  // exponent, up to infinity for [65520, 65536).
  const uint32_t normal = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal results: adding 0.5f aligns the float16 subnormal grid (2^-24) with the ulp of
  // 0.5f, so the FPU rounds to nearest even for us; what is left above 0.5f is the result.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(abs) + 0.5f) - std::bit_cast<uint32_t>(0.5f);
  // Plain selects where no arm depends on float arithmetic (they become blend instructions).
  const uint32_t special = abs > 0x7f800000u ? 0x7e00u | ((abs >> 13) & 0x3ffu)  // quiet NaN
                                             : 0x7c00u;  // 2^16 and above, and inf: inf
  const uint32_t finite = abs >= 0x47800000u ? special : normal;
  const uint32_t out = dtype_internal::Select(abs < 0x38800000u, subnormal, finite);  // < 2^-14
  return static_cast<uint16_t>(out | sign);
}

// Returns the float equal to the bfloat16 whose bits are `h` (exact).
constexpr float BFloat16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Returns the bits of the bfloat16 nearest to `f` (round to nearest, ties to even).
constexpr uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  // Rounding on the bit pattern is correct across the whole range: a carry moves into the
  // exponent, and the largest finite floats round to infinity as they should.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace collectived
