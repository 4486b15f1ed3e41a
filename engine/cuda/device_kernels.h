// Device kernels of the GPU backend: the element-wise combine, PREMUL_SUM's scaling and AVG's
// division on device memory, for every (op, dtype) pair the host kernels serve
// (engine/vocabulary/reduce_kernels.h), with the same arithmetic: float16/bfloat16 through float
// rounded to nearest even, integers wrapping on overflow and truncating toward zero on division,
// NaN propagating through MIN and MAX, bool SUM/MAX as or and PRODUCT/MIN as and.
//
// Every function enqueues one kernel on `stream` and returns at once; the result is the
// cudaError_t of the launch (0 when it was enqueued). Callers validate (op, dtype) first
// (ValidateReduceOp): an invalid pair returns cudaErrorInvalidValue without launching.
#pragma once

#include <cstddef>

#include "engine/vocabulary/dtype_enum.h"

typedef struct CUstream_st* cudaStream_t;

namespace collectived::device_kernels {

// The binary operation of a reduce op (AVG and PREMUL_SUM combine with kSum).
enum class Combiner : int { kSum, kProduct, kMin, kMax, kBand, kBor, kBxor };

// out[i] = a[i] (combiner) b[i]; `out` may alias `a` or `b`.
int Combine(Combiner combiner, DType dtype, void* out, const void* a, const void* b, size_t count,
            cudaStream_t stream);
// data[i] *= factor, in float for float16/bfloat16/float32/complex64 and in double for
// float64/complex128 (PREMUL_SUM; floating and complex dtypes only).
int Scale(DType dtype, void* data, size_t count, double factor, cudaStream_t stream);
// data[i] /= divisor (AVG; every dtype but bool; divisor >= 1).
int Divide(DType dtype, void* data, size_t count, int divisor, cudaStream_t stream);

}  // namespace collectived::device_kernels
