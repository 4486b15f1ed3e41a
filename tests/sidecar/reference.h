// Test data and the reference semantics the sidecar tests check results against, written here
// from torch.distributed's documented behaviour, independently of engine/reduce_kernels:
// element values are widened (double, complex<double>, int64, bool), reduced in that wide type,
// and compared exactly (integers, bool) or within a tolerance (float16, bfloat16, float32,
// complex64).
#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived::sidecar_test {

// The dtypes of the matrix: float32, float16, bfloat16, int64, bool, complex64.
const std::vector<DType>& MatrixDTypes();

// One element, widened. Only the member of the dtype's family is meaningful.
struct Value {
  std::complex<double> z;  // float16, bfloat16, float32 (imaginary part 0), complex64
  int64_t i = 0;           // int64
  bool b = false;          // bool
};

// The ReduceOps torch allows on `dtype` (an explicit table, not engine/vocabulary/reduce_op.cc):
//   float16/bfloat16/float32: SUM AVG PRODUCT MIN MAX PREMUL_SUM
//   complex64:                SUM AVG PRODUCT PREMUL_SUM
//   int64:                    SUM AVG PRODUCT MIN MAX BAND BOR BXOR
//   bool:                     SUM PRODUCT MIN MAX BAND BOR BXOR
// PREMUL_SUM uses kPremulScale.
std::vector<ReduceOp> ApplicableOps(DType dtype);
// The others among the nine.
std::vector<ReduceOp> InapplicableOps(DType dtype);
inline constexpr double kPremulScale = 1.5;

// A deterministic element for (seed, rank, index): small multiples of 0.5 without zeros for
// floating types (exact in float16 and bfloat16), a mix of small and 2^35-scaled signed values
// for int64, and about two thirds true for bool.
Value Generate(DType dtype, uint64_t seed, int rank, size_t index);
std::vector<Value> GenerateTensor(DType dtype, uint64_t seed, int rank, size_t count);

std::vector<std::byte> Encode(DType dtype, const std::vector<Value>& values);
std::vector<Value> Decode(DType dtype, const std::vector<std::byte>& bytes);

// The reduction of `contributions` (one per rank) with `op`, as torch defines it: integer SUM and
// PRODUCT wrap modulo 2^64, integer AVG truncates toward zero, bool SUM/MAX/BOR are "any",
// PRODUCT/MIN/BAND "all", BXOR parity; PREMUL_SUM is the sum of scale * x.
Value ReduceReference(DType dtype, const ReduceOp& op, const std::vector<Value>& contributions);
std::vector<Value> ReduceReference(DType dtype, const ReduceOp& op,
                                   const std::vector<std::vector<Value>>& contributions);

// Whether `got` equals `expected` for `dtype`: exactly for int64 and bool, within a relative
// tolerance of the dtype's precision for the others.
bool Matches(DType dtype, const Value& got, const Value& expected);

std::string Describe(DType dtype, const Value& value);
std::string OpName(const ReduceOp& op);

// Compares element by element; returns "" when every element matches, else a description of
// the first few mismatches (and how many there are).
std::string CompareValues(DType dtype, const std::vector<Value>& got,
                          const std::vector<Value>& expected);

}  // namespace collectived::sidecar_test
