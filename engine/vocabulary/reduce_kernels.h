// Reduction kernels: the element-wise loops that combine contributions of a reducing collective
// on the CPU (local shared-memory reduction and Gloo's reduce function), one per (op, dtype).
//
// Thread-safety: every function here is stateless; concurrent calls on disjoint buffers are safe.
#pragma once

#include <cstddef>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_op.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// out[i] = a[i] (op) b[i] for i < count; `out` may alias `a` or `b`. AVG and PREMUL_SUM combine
// as SUM (their scaling is done by PreScale/Finalize). Signature compatible with Gloo's reduce
// functions.
//
// `count` is in elements of the dtype the function was made for. Each of `out`, `a` and `b`
// points to `count` elements (any may be null when count is 0). `out` may be exactly `a`, exactly
// `b`, or both, which takes the fastest paths; buffers that partially overlap give the result of
// processing the elements in increasing index order. Elements need no alignment beyond their
// type's natural one.
//
// Floating point: MIN/MAX propagate NaN (if either input is NaN the result is NaN, like torch);
// float16 and bfloat16 are computed in float and rounded back to nearest even. Integers: SUM and
// PRODUCT wrap around modulo 2^bits. Bool (one byte, 0 or nonzero): SUM/MAX/BOR are logical
// or, PRODUCT/MIN/BAND logical and, BXOR logical xor; results are always 0 or 1. Complex:
// PRODUCT is the textbook (a+bi)(c+di) without C99 Annex G's inf/NaN recovery, like torch.
using CombineFn = void (*)(void* out, const void* a, const void* b, size_t count);

// Which loops CombineFunction returns: the fastest for this CPU (float16 and bfloat16 SUM use
// AVX2 and F16C where the CPU has them, chosen at run time), or the portable scalar loops that
// every CPU runs (the reference the tests compare the vector loops with). Results are the same
// bit for bit, except which NaN payload a NaN result carries.
enum class KernelChoice { kFastest, kPortable };

// Returns the combine function for `op` on `dtype` after validating the pair with
// ValidateReduceOp. Returns InvalidArgument (naming the op and the dtype) for invalid pairs.
StatusOr<CombineFn> CombineFunction(const ReduceOp& op, DType dtype,
                                    KernelChoice choice = KernelChoice::kFastest);

// PREMUL_SUM: data[i] *= scale (each contribution is scaled before it is combined, like NCCL).
// No-op for other ops.
//
// The product is computed in float for float16/bfloat16/float32/complex64 (the scale rounded
// to float) and in double for float64/complex128; a complex element has both parts scaled.
// Returns OK on success. Returns InvalidArgument when ValidateReduceOp rejects (op, dtype), or
// when `data` is null and `count` is not 0; `data` is then left untouched.
Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count);

// AVG: data[i] /= num_contributions (integers truncate toward zero like NCCL; float16/bfloat16
// through float). No-op otherwise.
//
// Floating-point elements are divided, not multiplied by a reciprocal, so the result is the
// correctly rounded quotient of the sum. Returns OK on success. Returns InvalidArgument when
// ValidateReduceOp rejects (op, dtype), when `data` is null and `count` is not 0, or, for AVG,
// when num_contributions < 1; `data` is then left untouched.
Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count, int num_contributions);

}  // namespace collectived
