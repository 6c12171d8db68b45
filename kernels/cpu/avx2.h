// AVX2 helpers shared by the CPU kernels. KVBENCH_AVX2 is 1 when the compiler targets
// AVX2 + FMA + F16C (-march=native on this project's machines); kernels keep a portable path.
#pragma once

// Put before a loop over register-blocked accumulators (an array of vectors indexed up to a
// template bound): GCC 12 replaces such an array by registers only when the loop is unrolled
// early, as this pragma asks; otherwise it keeps the array on the stack and stores every
// accumulator on every pass of the enclosing loop (the prefill attention's GEMM ran at half
// speed so). It changes no arithmetic.
#define KVBENCH_UNROLL _Pragma("GCC unroll 16")

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVBENCH_AVX2 1

namespace kvbench {

// Horizontal sum and max of eight floats.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

}  // namespace kvbench
#endif
