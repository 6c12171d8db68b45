#include "kernels/cpu/block_matvec.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/half.h"

namespace kvbench {
namespace {

constexpr int kBlock = 32;    // elements per block; K-quant super-blocks hold 8 of them
constexpr int kSuper = 256;   // elements per K-quant super-block
constexpr int64_t kQ4_0Bytes = block_format_bytes(BlockFormat::Q4_0);
constexpr int64_t kQ4_1Bytes = block_format_bytes(BlockFormat::Q4_1);
constexpr int64_t kQ8_0Bytes = block_format_bytes(BlockFormat::Q8_0);
constexpr int64_t kQ5_0Bytes = block_format_bytes(BlockFormat::Q5_0);
constexpr int64_t kQ5_1Bytes = block_format_bytes(BlockFormat::Q5_1);
constexpr int64_t kQ4_KBytes = block_format_bytes(BlockFormat::Q4_K);
constexpr int64_t kQ6_KBytes = block_format_bytes(BlockFormat::Q6_K);
constexpr int kMaxRowsX = 4;        // x rows sharing one pass over a weight row

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

// Q6_K super-block layout (block_q6_K): 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d.
// Element 128 h + 32 g + l (g, l < 32) has low four bits in ql[64 h + 32 (g % 2) + l]
// (low nibble for g < 2, high for g >= 2), top two bits at bit 2 g of qh[32 h + l], and
// value d * scales[8 h + 2 g + l / 16] * (q - 32).
constexpr int kQ6_KQh = 128;
constexpr int kQ6_KScales = 192;
constexpr int kQ6_KD = 208;

// One block of a weight row (block_format_elements(format) values), dequantized to floats.
void dequant_block(BlockFormat format, const uint8_t* blk, float* out) {
  switch (format) {
    case BlockFormat::Q4_0: {
      const float d = half_to_float(load_u16(blk));
      for (int i = 0; i < 16; ++i) {
        out[i] = static_cast<float>((blk[2 + i] & 0x0F) - 8) * d;
        out[i + 16] = static_cast<float>((blk[2 + i] >> 4) - 8) * d;
      }
      break;
    }
    case BlockFormat::Q4_1: {
      const float d = half_to_float(load_u16(blk));
      const float m = half_to_float(load_u16(blk + 2));
      for (int i = 0; i < 16; ++i) {
        out[i] = static_cast<float>(blk[4 + i] & 0x0F) * d + m;
        out[i + 16] = static_cast<float>(blk[4 + i] >> 4) * d + m;
      }
      break;
    }
    case BlockFormat::Q8_0: {
      const float d = half_to_float(load_u16(blk));
      for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(static_cast<int8_t>(blk[2 + i])) * d;
      break;
    }
    case BlockFormat::Q5_0:
    case BlockFormat::Q5_1: {
      // Q4's nibbles with a fifth bit: bit e of the 32-bit qh is element e's bit 4.
      const bool q5_1 = format == BlockFormat::Q5_1;
      const float d = half_to_float(load_u16(blk));
      const float m = q5_1 ? half_to_float(load_u16(blk + 2)) : 0.0f;
      const uint8_t* qh = blk + (q5_1 ? 4 : 2);
      const uint32_t bits = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                            static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
      const uint8_t* qs = qh + 4;
      const int zero = q5_1 ? 0 : 16;
      for (int i = 0; i < 16; ++i) {
        const int lo = static_cast<int>((qs[i] & 0x0F) | (((bits >> i) & 1) << 4)) - zero;
        const int hi = static_cast<int>((qs[i] >> 4) | (((bits >> (i + 16)) & 1) << 4)) - zero;
        out[i] = static_cast<float>(lo) * d + m;
        out[i + 16] = static_cast<float>(hi) * d + m;
      }
      break;
    }
    case BlockFormat::Q4_K: {
      const float d = half_to_float(load_u16(blk));
      const float dmin = half_to_float(load_u16(blk + 2));
      for (int j = 0; j < kSuper / kBlock; ++j) {
        int sc, mn;
        q4_k_scale_min(j, blk + kQ4_KScales, &sc, &mn);
        const float dj = d * static_cast<float>(sc);
        const float mj = dmin * static_cast<float>(mn);
        const uint8_t* q = blk + kQ4_KQs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l) {
          out[32 * j + l] = dj * static_cast<float>((q[l] >> shift) & 0x0F) - mj;
        }
      }
      break;
    }
    case BlockFormat::Q6_K: {
      const float d = half_to_float(load_u16(blk + kQ6_KD));
      const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6_KScales);
      for (int e = 0; e < kSuper; ++e) {
        const int h = e / 128, g = (e / 32) % 4, l = e % 32;
        const int lo = (blk[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0F;
        const int hi = (blk[kQ6_KQh + 32 * h + l] >> (2 * g)) & 3;
        // ggml's order, (d * scale) * q, so the values equal dequantize_row's.
        out[e] = d * static_cast<float>(scales[8 * h + 2 * g + l / 16]) *
                 static_cast<float>((lo | hi << 4) - 32);
      }
      break;
    }
    case BlockFormat::F32:
      std::memcpy(out, blk, kBlock * sizeof(float));
      break;
  }
}

#if KVBENCH_AVX2
// Activations stay exact fp32: weights are decoded to floats in registers and multiplied by
// x with FMAs. (llama.cpp instead rounds x to int8 per block, which moves this model's
// logits by up to ~2 between batched and one-token evaluation; a harness that measures
// fidelity between cache methods cannot afford that noise.)

// Eight unsigned bytes -> eight floats.
inline __m256 u8x8_to_float(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}
inline __m256 i8x8_to_float(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// Four groups of eight bytes -> 32 floats, each group by `convert` (unsigned or signed).
template <__m256 (*convert)(__m128i)>
inline void bytes32_to_float(__m256i bytes, __m256 q[4]) {
  const __m128i lo = _mm256_castsi256_si128(bytes);
  const __m128i hi = _mm256_extracti128_si256(bytes, 1);
  q[0] = convert(lo);
  q[1] = convert(_mm_srli_si128(lo, 8));
  q[2] = convert(hi);
  q[3] = convert(_mm_srli_si128(hi, 8));
}
inline void u8x32_to_float(__m256i bytes, __m256 q[4]) { bytes32_to_float<u8x8_to_float>(bytes, q); }
inline void i8x32_to_float(__m256i bytes, __m256 q[4]) { bytes32_to_float<i8x8_to_float>(bytes, q); }

// sum_e q_e * x_e over one 32-element block, q already unpacked to 4 x 8 floats.
inline __m256 dot_block(const __m256 q[4], const float* xb) {
  __m256 v = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
  v = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), v);
  v = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), v);
  return _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), v);
}

// The integer codes of one weight block as floats, and its scale d and offset
// (value = q * d + offset: m for Q4_1 and Q5_1, -8 d for Q4_0, -16 d for Q5_0, 0 for Q8_0).
template <BlockFormat F>
inline void decode_block(const uint8_t* w, int64_t b, __m256 q[4], float* d, float* offset) {
  if constexpr (F == BlockFormat::Q8_0) {
    const uint8_t* blk = w + b * kQ8_0Bytes;
    *d = half_to_float(load_u16(blk));
    *offset = 0.0f;
    for (int g = 0; g < 4; ++g) {
      q[g] = i8x8_to_float(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * g)));
    }
  } else if constexpr (F == BlockFormat::Q5_0 || F == BlockFormat::Q5_1) {
    const bool q5_1 = F == BlockFormat::Q5_1;
    const uint8_t* blk = w + b * (q5_1 ? kQ5_1Bytes : kQ5_0Bytes);
    *d = half_to_float(load_u16(blk));
    *offset = q5_1 ? half_to_float(load_u16(blk + 2)) : -16.0f * *d;
    const uint8_t* qh = blk + (q5_1 ? 4 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask),
                                             _mm_and_si128(raw, mask));  // element e in byte e
    // Bit e of qh to byte e: broadcast qh, give byte e its qh byte e / 8, then test bit e % 8.
    uint32_t bits;
    std::memcpy(&bits, qh, sizeof(bits));
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int32_t>(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit_of_byte = _mm256_set1_epi64x(0x8040201008040201);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
    const __m256i codes = _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    u8x32_to_float(codes, q);
  } else {
    const bool q4_1 = F == BlockFormat::Q4_1;
    const uint8_t* blk = w + b * (q4_1 ? kQ4_1Bytes : kQ4_0Bytes);
    *d = half_to_float(load_u16(blk));
    *offset = q4_1 ? half_to_float(load_u16(blk + 2)) : -8.0f * *d;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask);                     // elements 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);  // elements 16..31
    q[0] = u8x8_to_float(lo);
    q[1] = u8x8_to_float(_mm_srli_si128(lo, 8));
    q[2] = u8x8_to_float(hi);
    q[3] = u8x8_to_float(_mm_srli_si128(hi, 8));
  }
}

// y[x] = dot(weight row, x row) for NX x rows; each weight block is decoded once for all.
// x_sums[x][b] is the sum of x row x over block b (for the per-block offset).
// Two accumulator sets (even / odd blocks) hide the FMA latency.
template <BlockFormat F, int NX>
void row_dot_q(const uint8_t* w, int64_t nb, const float* const* xs, const float* const* x_sums,
               float* y) {
  __m256 acc[2][NX];
  float offset_sum[NX];
  for (int x = 0; x < NX; ++x) {
    acc[0][x] = acc[1][x] = _mm256_setzero_ps();
    offset_sum[x] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256 q[4];
    float d, offset;
    decode_block<F>(w, b, q, &d, &offset);
    const __m256 dv = _mm256_set1_ps(d);
    for (int x = 0; x < NX; ++x) {
      acc[b & 1][x] = _mm256_fmadd_ps(dv, dot_block(q, xs[x] + b * kBlock), acc[b & 1][x]);
      if constexpr (F != BlockFormat::Q8_0) offset_sum[x] += offset * x_sums[x][b];
    }
  }
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x])) + offset_sum[x];
}

template <int NX>
void row_dot_f32(const float* w, int64_t cols, const float* const* xs, float* y) {
  __m256 acc0[NX], acc1[NX];
  for (int x = 0; x < NX; ++x) acc0[x] = acc1[x] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + c);
    const __m256 w1 = _mm256_loadu_ps(w + c + 8);
    for (int x = 0; x < NX; ++x) {
      acc0[x] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[x] + c), acc0[x]);
      acc1[x] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs[x] + c + 8), acc1[x]);
    }
  }
  for (int x = 0; x < NX; ++x) {
    float s = hsum(_mm256_add_ps(acc0[x], acc1[x]));
    for (int64_t cc = c; cc < cols; ++cc) s += w[cc] * xs[x][cc];
    y[x] = s;
  }
}

// Q4_K: each 32-element sub-block is a Q4_1 block with scale d * scale_j and offset
// -dmin * min_j, so it reuses the per-32 x sums for its offset.
template <int NX>
void row_dot_q4_k(const uint8_t* w, int64_t nb, const float* const* xs,
                  const float* const* x_sums, float* y) {
  __m256 acc[2][NX];
  float offset_sum[NX];
  for (int x = 0; x < NX; ++x) {
    acc[0][x] = acc[1][x] = _mm256_setzero_ps();
    offset_sum[x] = 0.0f;
  }
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t s = 0; s < nb / (kSuper / kBlock); ++s) {
    const uint8_t* blk = w + s * kQ4_KBytes;
    const float d = half_to_float(load_u16(blk));
    const float dmin = half_to_float(load_u16(blk + 2));
    for (int pair = 0; pair < kSuper / 64; ++pair) {
      const __m256i raw =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ4_KQs + 32 * pair));
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        int sc, mn;
        q4_k_scale_min(j, blk + kQ4_KScales, &sc, &mn);
        const __m256 dv = _mm256_set1_ps(d * static_cast<float>(sc));
        const float offset = -dmin * static_cast<float>(mn);
        __m256 q[4];
        u8x32_to_float(_mm256_and_si256(half ? _mm256_srli_epi16(raw, 4) : raw, mask), q);
        const int64_t b = s * (kSuper / kBlock) + j;
        for (int x = 0; x < NX; ++x) {
          acc[half][x] = _mm256_fmadd_ps(dv, dot_block(q, xs[x] + b * kBlock), acc[half][x]);
          offset_sum[x] += offset * x_sums[x][b];
        }
      }
    }
  }
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x])) + offset_sum[x];
}

// Q6_K: codes q - 32 are exact signed bytes; each 16 elements carry their own int8 scale, so
// a 32-element group is two 16-element dot products, each scaled by d * scale.
template <int NX>
void row_dot_q6_k(const uint8_t* w, int64_t nb, const float* const* xs, const float* const*,
                  float* y) {
  __m256 acc[2][NX];
  for (int x = 0; x < NX; ++x) acc[0][x] = acc[1][x] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i bias = _mm256_set1_epi8(32);
  for (int64_t s = 0; s < nb / (kSuper / kBlock); ++s) {
    const uint8_t* blk = w + s * kQ6_KBytes;
    const float d = half_to_float(load_u16(blk + kQ6_KD));
    const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6_KScales);
    for (int h = 0; h < 2; ++h) {
      const auto* ql = reinterpret_cast<const __m256i*>(blk + 64 * h);
      const __m256i ql0 = _mm256_loadu_si256(ql);
      const __m256i ql1 = _mm256_loadu_si256(ql + 1);
      const __m256i qh =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6_KQh + 32 * h));
      // Group g's top bits (bits 2g, 2g + 1 of qh) moved to bits 4-5 of each byte; 16-bit
      // shifts are safe because the mask drops whatever crosses a byte boundary.
      const __m256i codes[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4),
                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4),
                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                          _mm256_and_si256(qh, bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45)),
      };
      for (int g = 0; g < 4; ++g) {
        __m256 q[4];
        i8x32_to_float(_mm256_sub_epi8(codes[g], bias), q);
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(scales[8 * h + 2 * g]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scales[8 * h + 2 * g + 1]));
        const int64_t e = s * kSuper + 128 * h + 32 * g;
        for (int x = 0; x < NX; ++x) {
          const float* xb = xs[x] + e;
          const __m256 v0 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8),
                                            _mm256_mul_ps(q[0], _mm256_loadu_ps(xb)));
          const __m256 v1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24),
                                            _mm256_mul_ps(q[2], _mm256_loadu_ps(xb + 16)));
          acc[0][x] = _mm256_fmadd_ps(d0, v0, acc[0][x]);
          acc[1][x] = _mm256_fmadd_ps(d1, v1, acc[1][x]);
        }
      }
    }
  }
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x]));
}

// Dispatch table over (format, x rows in this pass): one entry per template instance.
using RowDotQ = void (*)(const uint8_t*, int64_t, const float* const*, const float* const*,
                        float*);
template <BlockFormat F>
constexpr RowDotQ kRowDotQ[kMaxRowsX] = {row_dot_q<F, 1>, row_dot_q<F, 2>, row_dot_q<F, 3>,
                                         row_dot_q<F, 4>};
constexpr RowDotQ kRowDotQ4_K[kMaxRowsX] = {row_dot_q4_k<1>, row_dot_q4_k<2>, row_dot_q4_k<3>,
                                           row_dot_q4_k<4>};
constexpr RowDotQ kRowDotQ6_K[kMaxRowsX] = {row_dot_q6_k<1>, row_dot_q6_k<2>, row_dot_q6_k<3>,
                                           row_dot_q6_k<4>};
using RowDotF = void (*)(const float*, int64_t, const float* const*, float*);
constexpr RowDotF kRowDotF32[kMaxRowsX] = {row_dot_f32<1>, row_dot_f32<2>, row_dot_f32<3>,
                                           row_dot_f32<4>};

RowDotQ const* row_dot_table(BlockFormat format) {
  switch (format) {
    case BlockFormat::Q4_0:
      return kRowDotQ<BlockFormat::Q4_0>;
    case BlockFormat::Q4_1:
      return kRowDotQ<BlockFormat::Q4_1>;
    case BlockFormat::Q8_0:
      return kRowDotQ<BlockFormat::Q8_0>;
    case BlockFormat::Q5_0:
      return kRowDotQ<BlockFormat::Q5_0>;
    case BlockFormat::Q5_1:
      return kRowDotQ<BlockFormat::Q5_1>;
    case BlockFormat::Q4_K:
      return kRowDotQ4_K;
    case BlockFormat::Q6_K:
      return kRowDotQ6_K;
    case BlockFormat::F32:
      break;
  }
  return nullptr;
}

void block_matmul_avx2(const BlockMatrix& w, const float* x, float* y, int64_t n) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  if (w.format == BlockFormat::F32) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* wr = reinterpret_cast<const float*>(base + r * w.row_bytes);
      for (int64_t x0 = 0; x0 < n; x0 += kMaxRowsX) {
        const int nx = static_cast<int>(std::min<int64_t>(kMaxRowsX, n - x0));
        const float* xs[kMaxRowsX];
        float out[kMaxRowsX];
        for (int i = 0; i < nx; ++i) xs[i] = x + (x0 + i) * w.cols;
        kRowDotF32[nx - 1](wr, w.cols, xs, out);
        for (int i = 0; i < nx; ++i) y[(x0 + i) * w.rows + r] = out[i];
      }
    }
    return;
  }
  const int64_t nb = w.cols / kBlock;  // 32-element blocks (K-quants: 8 per super-block)
  std::vector<float> x_sums(static_cast<size_t>(n * nb));
  for (int64_t i = 0; i < n * nb; ++i) {
    float s = 0.0f;
    for (int e = 0; e < kBlock; ++e) s += x[i * kBlock + e];
    x_sums[i] = s;
  }
  RowDotQ const* table = row_dot_table(w.format);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* wr = base + r * w.row_bytes;
    for (int64_t x0 = 0; x0 < n; x0 += kMaxRowsX) {
      const int nx = static_cast<int>(std::min<int64_t>(kMaxRowsX, n - x0));
      const float* xs[kMaxRowsX];
      const float* sums[kMaxRowsX];
      float out[kMaxRowsX];
      for (int i = 0; i < nx; ++i) {
        xs[i] = x + (x0 + i) * w.cols;
        sums[i] = &x_sums[(x0 + i) * nb];
      }
      table[nx - 1](wr, nb, xs, sums, out);
      for (int i = 0; i < nx; ++i) y[(x0 + i) * w.rows + r] = out[i];
    }
  }
}
#endif

// Portable path: dequantize a block to floats and take exact-x float dot products.
[[maybe_unused]] void block_matmul_portable(const BlockMatrix& w, const float* x, float* y,
                                            int64_t n) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t bb = block_format_bytes(w.format);
  const int64_t be = block_format_elements(w.format);
  const int64_t nb = w.format == BlockFormat::F32 ? 0 : w.cols / be;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* wr = base + r * w.row_bytes;
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * w.cols;
      float sum = 0.0f;
      if (w.format == BlockFormat::F32) {
        const auto* wf = reinterpret_cast<const float*>(wr);
        for (int64_t c = 0; c < w.cols; ++c) sum += wf[c] * xi[c];
      } else {
        float deq[kSuper];
        for (int64_t b = 0; b < nb; ++b) {
          dequant_block(w.format, wr + b * bb, deq);
          float s = 0.0f;
          for (int64_t e = 0; e < be; ++e) s += deq[e] * xi[b * be + e];
          sum += s;
        }
      }
      y[i * w.rows + r] = sum;
    }
  }
}

}  // namespace

void block_matmul_cpu(const BlockMatrix& w, const float* x, float* y, int64_t n) {
  assert(w.format == BlockFormat::F32 || w.cols % block_format_elements(w.format) == 0);
#if KVBENCH_AVX2
  block_matmul_avx2(w, x, y, n);
#else
  block_matmul_portable(w, x, y, n);
#endif
}

void block_matmul_reference(const BlockMatrix& w, const float* x, float* y, int64_t n) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* wr = base + r * w.row_bytes;
    if (w.format == BlockFormat::F32) {
      std::memcpy(row.data(), wr, w.cols * sizeof(float));
    } else {
      const int64_t bb = block_format_bytes(w.format);
      const int64_t be = block_format_elements(w.format);
      for (int64_t b = 0; b < w.cols / be; ++b) {
        dequant_block(w.format, wr + b * bb, row.data() + b * be);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) sum += static_cast<double>(row[c]) * x[i * w.cols + c];
      y[i * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace kvbench
