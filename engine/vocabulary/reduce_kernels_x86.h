// Vector loops for float16 and bfloat16 SUM on x86-64 CPUs with AVX2 and F16C (nearly all since
// 2013), chosen at run time by CombineFunction; the portable loops of reduce_kernels.cc serve
// other CPUs and are the reference the tests compare these with. The widening to float is
// F16C's conversion for float16 and a shift for bfloat16; the rounding back is to nearest even,
// as the scalar codecs do, and NaNs stay NaNs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace collectived::x86 {

// Whether the CPU running this process has AVX2 and F16C.
bool HasAvx2AndF16c();

// out[i] = a[i] + b[i] for i < n. `out` may be exactly `a` and/or `b` but must not partially
// overlap either. Only to be called when HasAvx2AndF16c().
void HalfSum(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n);
void BFloat16Sum(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n);

}  // namespace collectived::x86
