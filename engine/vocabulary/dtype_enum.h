// The DType enum alone, for code that cannot take the rest of engine/vocabulary/dtype.h (the CUDA
// kernels, compiled by nvcc as C++17).
#pragma once

#include <cstdint>

namespace collectived {

// The numbers are part of the wire format: they match collectived.v1.DType in the protobuf API.
enum class DType : int32_t {
  kUnspecified = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat32 = 3,
  kFloat64 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kBool = 10,
  kComplex64 = 11,
  kComplex128 = 12,
};

}  // namespace collectived
