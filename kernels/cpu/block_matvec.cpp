#include "kernels/cpu/block_matvec.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/block_layout.h"
#include "kernels/cpu/half.h"

namespace kvbench {
namespace {

using namespace block_layout;

// x rows sharing one pass over a weight row: a decode batch's rows (LlamaModel::decode_batch)
// decode each weight block once for up to eight of them.
constexpr int kMaxRowsX = 8;

#if KVBENCH_AVX2
// Activations stay exact fp32: weights are decoded to floats in registers and multiplied by
// x with FMAs. (llama.cpp instead rounds x to int8 per block, which moves this model's
// logits by up to ~2 between batched and one-token evaluation; a harness that measures
// fidelity between cache methods cannot afford that noise by default. The int8 path is
// block_matvec_q8.h, behind --decode-activations int8.)

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
inline void u8x32_to_float(__m256i bytes, __m256 q[4]) {
  bytes32_to_float<u8x8_to_float>(bytes, q);
}
inline void i8x32_to_float(__m256i bytes, __m256 q[4]) {
  bytes32_to_float<i8x8_to_float>(bytes, q);
}

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
    u8x32_to_float(q5_codes(blk + (q5_1 ? 4 : 2)), q);
  } else {
    const bool q4_1 = F == BlockFormat::Q4_1;
    const uint8_t* blk = w + b * (q4_1 ? kQ4_1Bytes : kQ4_0Bytes);
    *d = half_to_float(load_u16(blk));
    *offset = q4_1 ? half_to_float(load_u16(blk + 2)) : -8.0f * *d;
    u8x32_to_float(q4_codes(blk + (q4_1 ? 4 : 2)), q);
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
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) {
    acc[0][x] = acc[1][x] = _mm256_setzero_ps();
    offset_sum[x] = 0.0f;
  }
  const auto block = [&](int64_t b, __m256* accumulators) {
    __m256 q[4];
    float d, offset;
    decode_block<F>(w, b, q, &d, &offset);
    const __m256 dv = _mm256_set1_ps(d);
    KVBENCH_UNROLL
    for (int x = 0; x < NX; ++x) {
      accumulators[x] = _mm256_fmadd_ps(dv, dot_block(q, xs[x] + b * kBlock), accumulators[x]);
      if constexpr (F != BlockFormat::Q8_0) offset_sum[x] += offset * x_sums[x][b];
    }
  };
  // acc[0] and acc[1] by name, not acc[b & 1]: an index the compiler cannot resolve kept
  // the accumulators in memory, a store-to-load round trip per block.
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    block(b, acc[0]);
    block(b + 1, acc[1]);
  }
  if (b < nb) block(b, acc[0]);
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x])) + offset_sum[x];
}

template <int NX>
void row_dot_f32(const float* w, int64_t cols, const float* const* xs, float* y) {
  __m256 acc0[NX], acc1[NX];
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) acc0[x] = acc1[x] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + c);
    const __m256 w1 = _mm256_loadu_ps(w + c + 8);
    KVBENCH_UNROLL
    for (int x = 0; x < NX; ++x) {
      acc0[x] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[x] + c), acc0[x]);
      acc1[x] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs[x] + c + 8), acc1[x]);
    }
  }
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) {
    float s = hsum(_mm256_add_ps(acc0[x], acc1[x]));
    for (int64_t cc = c; cc < cols; ++cc) s += w[cc] * xs[x][cc];
    y[x] = s;
  }
}

// Q4_K: each 32-element sub-block is a Q4_1 block with scale d * scale_j and offset
// -dmin * min_j, so it reuses the per-32 x sums for its offset.
template <int NX>
void row_dot_q4_k(const uint8_t* w, int64_t nb, const float* const* xs, const float* const* x_sums,
                  float* y) {
  __m256 acc[2][NX];
  float offset_sum[NX];
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) {
    acc[0][x] = acc[1][x] = _mm256_setzero_ps();
    offset_sum[x] = 0.0f;
  }
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t s = 0; s < nb / (kSuper / kBlock); ++s) {
    const uint8_t* blk = w + s * kQ4_KBytes;
    const float d = half_to_float(load_u16(blk));
    const float dmin = half_to_float(load_u16(blk + 2));
    uint64_t scales, mins;
    q4_k_scales_mins(blk + kQ4_KScales, &scales, &mins);
    for (int pair = 0; pair < kSuper / 64; ++pair) {
      const __m256i raw =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ4_KQs + 32 * pair));
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        const auto sc = static_cast<int>((scales >> (8 * j)) & 0xFF);
        const auto mn = static_cast<int>((mins >> (8 * j)) & 0xFF);
        const __m256 dv = _mm256_set1_ps(d * static_cast<float>(sc));
        const float offset = -dmin * static_cast<float>(mn);
        __m256 q[4];
        u8x32_to_float(_mm256_and_si256(half ? _mm256_srli_epi16(raw, 4) : raw, mask), q);
        const int64_t b = s * (kSuper / kBlock) + j;
        KVBENCH_UNROLL
        for (int x = 0; x < NX; ++x) {
          acc[half][x] = _mm256_fmadd_ps(dv, dot_block(q, xs[x] + b * kBlock), acc[half][x]);
          offset_sum[x] += offset * x_sums[x][b];
        }
      }
    }
  }
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x])) + offset_sum[x];
}

// Q6_K: codes q - 32 are exact signed bytes; each 16 elements carry their own int8 scale, so
// a 32-element group is two 16-element dot products, each scaled by d * scale.
template <int NX>
void row_dot_q6_k(const uint8_t* w, int64_t nb, const float* const* xs, const float* const*,
                  float* y) {
  __m256 acc[2][NX];
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) acc[0][x] = acc[1][x] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nb / (kSuper / kBlock); ++s) {
    const uint8_t* blk = w + s * kQ6_KBytes;
    const float d = half_to_float(load_u16(blk + kQ6_KD));
    const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6_KScales);
    for (int h = 0; h < 2; ++h) {
      __m256i codes[4];
      q6_k_codes(blk, h, codes);
      for (int g = 0; g < 4; ++g) {
        __m256 q[4];
        i8x32_to_float(codes[g], q);
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(scales[8 * h + 2 * g]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scales[8 * h + 2 * g + 1]));
        const int64_t e = s * kSuper + 128 * h + 32 * g;
        KVBENCH_UNROLL
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
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x]));
}

// Dispatch table over (format, x rows in this pass): one entry per template instance.
using RowDotQ = void (*)(const uint8_t*, int64_t, const float* const*, const float* const*, float*);
template <BlockFormat F>
constexpr RowDotQ kRowDotQ[kMaxRowsX] = {row_dot_q<F, 1>, row_dot_q<F, 2>, row_dot_q<F, 3>,
                                         row_dot_q<F, 4>, row_dot_q<F, 5>, row_dot_q<F, 6>,
                                         row_dot_q<F, 7>, row_dot_q<F, 8>};
constexpr RowDotQ kRowDotQ4_K[kMaxRowsX] = {row_dot_q4_k<1>, row_dot_q4_k<2>, row_dot_q4_k<3>,
                                            row_dot_q4_k<4>, row_dot_q4_k<5>, row_dot_q4_k<6>,
                                            row_dot_q4_k<7>, row_dot_q4_k<8>};
constexpr RowDotQ kRowDotQ6_K[kMaxRowsX] = {row_dot_q6_k<1>, row_dot_q6_k<2>, row_dot_q6_k<3>,
                                            row_dot_q6_k<4>, row_dot_q6_k<5>, row_dot_q6_k<6>,
                                            row_dot_q6_k<7>, row_dot_q6_k<8>};
using RowDotF = void (*)(const float*, int64_t, const float* const*, float*);
constexpr RowDotF kRowDotF32[kMaxRowsX] = {row_dot_f32<1>, row_dot_f32<2>, row_dot_f32<3>,
                                           row_dot_f32<4>, row_dot_f32<5>, row_dot_f32<6>,
                                           row_dot_f32<7>, row_dot_f32<8>};

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
