// The ggml block formats' layouts, read the same way by the fp32-activation kernels
// (block_matvec.cpp) and the int8-activation ones (block_matvec_q8.cpp): the byte offsets,
// the Q4_K scale packing, a scalar block decoder, and AVX2 code unpackers.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2.h"
#include "kernels/layouts.h"

namespace kvbench::block_layout {

constexpr int kBlock = 32;    // elements per block; K-quant super-blocks hold 8 of them
constexpr int kSuper = 256;   // elements per K-quant super-block
constexpr int64_t kQ4_0Bytes = block_format_bytes(BlockFormat::Q4_0);
constexpr int64_t kQ4_1Bytes = block_format_bytes(BlockFormat::Q4_1);
constexpr int64_t kQ8_0Bytes = block_format_bytes(BlockFormat::Q8_0);
constexpr int64_t kQ5_0Bytes = block_format_bytes(BlockFormat::Q5_0);
constexpr int64_t kQ5_1Bytes = block_format_bytes(BlockFormat::Q5_1);
constexpr int64_t kQ4_KBytes = block_format_bytes(BlockFormat::Q4_K);
constexpr int64_t kQ6_KBytes = block_format_bytes(BlockFormat::Q6_K);

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Q4_K super-block layout (ggml-common.h block_q4_K): fp16 d, fp16 dmin, 12 bytes of
// scales, then 128 bytes of nibbles; 32-element sub-block j is the low (j even) or high
// (j odd) nibbles of qs[32 (j / 2) .. + 32], valued d * scale_j * q - dmin * min_j.
constexpr int kQ4_KScales = 4;
constexpr int kQ4_KQs = 16;

// The 6-bit (scale, min) of Q4_K sub-block j: j < 4 in the low six bits of bytes j and
// j + 4; j >= 4 takes its low four bits from byte j + 4 and its top two from the spare
// high bits of bytes j - 4 (scale) and j (min).
inline void q4_k_scale_min(int j, const uint8_t* s, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// All eight (scale, min) pairs of a Q4_K super-block at once, as q4_k_scale_min gives them one
// by one: byte j of *scales and *mins is sub-block j's. Word-wise on the 12 bytes (w0, w1,
// w2 little-endian), for the decode kernels: scales 0-3 are w0's low six bits and mins 0-3
// w1's; scales 4-7 are w2's low nibbles with w0's top two bits above them, mins 4-7 w2's
// high nibbles with w1's top two bits.
inline void q4_k_scales_mins(const uint8_t* s, uint64_t* scales, uint64_t* mins) {
  uint32_t w[3];
  std::memcpy(w, s, sizeof(w));
  const uint32_t six = 0x3F3F3F3F, four = 0x0F0F0F0F, two = 0x03030303;
  const uint32_t scales_hi = (w[2] & four) | (((w[0] >> 6) & two) << 4);
  const uint32_t mins_hi = ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4);
  *scales = (w[0] & six) | (static_cast<uint64_t>(scales_hi) << 32);
  *mins = (w[1] & six) | (static_cast<uint64_t>(mins_hi) << 32);
}

// Q6_K super-block layout (block_q6_K): 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d.
// Element 128 h + 32 g + l (g, l < 32) has low four bits in ql[64 h + 32 (g % 2) + l]
// (low nibble for g < 2, high for g >= 2), top two bits at bit 2 g of qh[32 h + l], and
// value d * scales[8 h + 2 g + l / 16] * (q - 32).
constexpr int kQ6_KQh = 128;
constexpr int kQ6_KScales = 192;
constexpr int kQ6_KD = 208;

// One block of a weight row (block_format_elements(format) values), dequantized to floats.
void dequant_block(BlockFormat format, const uint8_t* blk, float* out);

#if KVBENCH_AVX2
// The 32 codes of a Q4_0 / Q4_1 block (16 bytes of nibbles at qs), code e in byte e.
inline __m256i q4_codes(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask),  // elements 16..31
                          _mm_and_si128(raw, mask));                     // elements 0..15
}

// The 32 five-bit codes of a Q5_0 / Q5_1 block whose 4 bytes of high bits start at qh
// (the nibbles follow them), code e in byte e.
inline __m256i q5_codes(const uint8_t* qh) {
  // Bit e of qh to byte e: broadcast qh, give byte e its qh byte e / 8, then test bit e % 8.
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
  return _mm256_or_si256(q4_codes(qh + 4), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

// The codes q - 32 (signed, -32..31) of half h (128 elements) of a Q6_K super-block:
// codes[g] holds elements 128 h + 32 g .. + 32, code l in byte l.
inline void q6_k_codes(const uint8_t* blk, int h, __m256i codes[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i bias = _mm256_set1_epi8(32);
  const auto* ql = reinterpret_cast<const __m256i*>(blk + 64 * h);
  const __m256i ql0 = _mm256_loadu_si256(ql);
  const __m256i ql1 = _mm256_loadu_si256(ql + 1);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6_KQh + 32 * h));
  // Group g's top bits (bits 2g, 2g + 1 of qh) moved to bits 4-5 of each byte; 16-bit
  // shifts are safe because the mask drops whatever crosses a byte boundary.
  codes[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                             _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
  codes[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                             _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
  codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                             _mm256_and_si256(qh, bits45));
  codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
  for (int g = 0; g < 4; ++g) codes[g] = _mm256_sub_epi8(codes[g], bias);
}
#endif

}  // namespace kvbench::block_layout
