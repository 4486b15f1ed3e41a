#include "engine/vocabulary/reduce_kernels_x86.h"

#include "engine/vocabulary/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace collectived::x86 {

#if defined(__x86_64__)

bool HasAvx2AndF16c() {
  // F16C from CPUID leaf 1 (not every compiler's __builtin_cpu_supports knows it); AVX2 from
  // the builtin, which also checks that the OS saves the vector registers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return has;
}

__attribute__((target("avx2,f16c"))) void HalfSum(uint16_t* out, const uint16_t* a,
                                                  const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m128i sum = _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), sum);
  }
  for (; i < n; ++i) out[i] = FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i]));
}

namespace {

__attribute__((target("avx2"))) inline __m256 WidenBFloat16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// FloatToBFloat16 on 8 lanes: round the bit pattern to nearest even; NaNs become quiet NaNs.
__attribute__((target("avx2"))) inline __m128i NarrowToBFloat16(__m256 f) {
  const __m256i bits = _mm256_castps_si256(f);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i lanes = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Every lane is below 2^16: pack to 16 bits (per 128-bit half), then gather the halves.
  const __m256i packed = _mm256_packus_epi32(lanes, lanes);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

}  // namespace

__attribute__((target("avx2"))) void BFloat16Sum(uint16_t* out, const uint16_t* a,
                                                 const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 sum = _mm256_add_ps(WidenBFloat16(a + i), WidenBFloat16(b + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), NarrowToBFloat16(sum));
  }
  for (; i < n; ++i) out[i] = FloatToBFloat16(BFloat16ToFloat(a[i]) + BFloat16ToFloat(b[i]));
}

#else  // not x86-64: the scalar loops serve

bool HasAvx2AndF16c() {
  return false;
}
void HalfSum(uint16_t*, const uint16_t*, const uint16_t*, size_t) {}
void BFloat16Sum(uint16_t*, const uint16_t*, const uint16_t*, size_t) {}

#endif

}  // namespace collectived::x86
