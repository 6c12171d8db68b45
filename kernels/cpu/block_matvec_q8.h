// y = W x as llama.cpp computes it on the CPU: x rounded to int8 per 32-value block (one
// fp32 scale each), then integer dot products against the weights' own codes. About 3x
// less arithmetic per weight than block_matvec.h's fp32 activations, so decode runs at the
// memory's pace; the price is x's rounding (|error| <= scale / 2 per value), which makes a
// token's logits differ between this path and a batched prefill's fp32 GEMM.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace kvbench {

#if defined(__AVX512F__) && defined(__AVX512BW__)
// One 32-value block rounded to int8 codes by llama.cpp's q8_0 rule: step max |x| / 127
// (returned; 0 for a block of zeros), each code x / step to the nearest (ties to even). The
// codes' sum goes to *sum when asked (the weights' offsets need it).
inline float round_block_q8(const float* xb, int8_t* codes, int32_t* sum = nullptr) {
  const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
  const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(q_lo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16), _mm512_cvtepi32_epi8(q_hi));
  if (sum) *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
  return amax / 127.0f;
}
#endif

// n rows of `cols` activations, each 32-value block as int8 codes with one scale:
// x ~= codes * scale, scale = max |x| / 127 over the block.
struct Q8Activations {
  int64_t n = 0;
  int64_t cols = 0;              // a multiple of 32
  std::vector<int8_t> codes;     // [n, cols]
  std::vector<float> scales;     // [n, cols / 32]
  std::vector<int32_t> sums;     // [n, cols / 32]: sum of each block's codes (for offsets)
};

// Rounds x [n, cols] to int8 per 32-value block; reuses out's buffers.
void quantize_activations_q8(const float* x, int64_t n, int64_t cols, Q8Activations* out);

// x: [n, w.cols] quantized, y: [n, w.rows]; n small (decode is n == 1). Every format but
// F32 (whose rows have no codes to take an integer dot product with). Threads over rows.
void block_matmul_q8(const BlockMatrix& w, const Q8Activations& x, float* y);

}  // namespace kvbench
