#include "kernels/cpu/block_matvec.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVBENCH_MATVEC_AVX2 1
#endif

namespace kvbench {
namespace {

constexpr int kBlock = 32;
constexpr int64_t kQ4_0Bytes = 18;  // fp16 d, 16 bytes of nibbles
constexpr int64_t kQ4_1Bytes = 20;  // fp16 d, fp16 m, 16 bytes of nibbles
constexpr int64_t kQ8_0Bytes = 34;  // fp16 d, 32 int8
constexpr int kMaxRowsX = 4;        // x rows sharing one pass over a weight row

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN included).
inline float half_to_float(uint16_t h) {
#if KVBENCH_MATVEC_AVX2
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float f = static_cast<float>(mant) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
#endif
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// One 32-element block of a weight row, dequantized to floats.
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
    case BlockFormat::F32:
      std::memcpy(out, blk, kBlock * sizeof(float));
      break;
  }
}

int64_t block_bytes(BlockFormat format) {
  switch (format) {
    case BlockFormat::Q4_0:
      return kQ4_0Bytes;
    case BlockFormat::Q4_1:
      return kQ4_1Bytes;
    case BlockFormat::Q8_0:
      return kQ8_0Bytes;
    case BlockFormat::F32:
      return kBlock * 4;
  }
  return 0;
}

#if KVBENCH_MATVEC_AVX2
// x quantized per 32-block to int8 (q8_1-style, as llama.cpp does), so a weight block's
// dot product is one maddubs + madd. Per-element error <= d / 2 = max|x_blk| / 254.
struct BlockQ8 {
  float d;  // x ~= d * q
  float s;  // Q4_1: exact float sum of x; Q4_0: 8 * d * sum(q)
  int8_t q[kBlock];
};

void quantize_x(const float* x, int64_t cols, BlockFormat format, BlockQ8* out) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    __m256 sum = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
      sum = _mm256_add_ps(sum, v[i]);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    // Packs interleave 128-bit lanes; the permute restores element order.
    const __m256i q01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i q23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i q8 = _mm256_packs_epi16(q01, q23);
    q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), q8);
    out[b].d = d;
    if (format == BlockFormat::Q4_1) {
      __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
      s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
      out[b].s = _mm_cvtss_f32(s4);
    } else {
      int isum = 0;
      for (int i = 0; i < kBlock; ++i) isum += out[b].q[i];
      out[b].s = 8.0f * d * static_cast<float>(isum);
    }
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 nibbles -> 32 bytes in 0..15: low nibbles are elements 0..15, high ones 16..31.
inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m128 load_ds(const BlockQ8& b) {
  return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(&b.d)));
}

// Adds one weight block's contribution to NX x rows' accumulators.
template <BlockFormat F, int NX>
inline void block_dot(const uint8_t* w, int64_t b, const BlockQ8* const* xq, __m256* acc,
                      __m128* acc_s) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (F == BlockFormat::Q4_1) {
    const uint8_t* blk = w + b * kQ4_1Bytes;
    int32_t dm_bits;
    std::memcpy(&dm_bits, blk, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // [d, m, 0, 0]
    const __m256i q = unpack_nibbles(blk + 4);
    for (int x = 0; x < NX; ++x) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[x][b].q));
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones);
      const __m128 prod = _mm_mul_ps(dm, load_ds(xq[x][b]));  // [d dx, m s]
      acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcastss_ps(prod), acc[x]);
      acc_s[x] = _mm_add_ps(acc_s[x], prod);
    }
  } else if constexpr (F == BlockFormat::Q4_0) {
    const uint8_t* blk = w + b * kQ4_0Bytes;
    const __m128 dd = _mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(blk))));
    const __m256i q = unpack_nibbles(blk + 2);
    for (int x = 0; x < NX; ++x) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[x][b].q));
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones);
      const __m128 prod = _mm_mul_ps(dd, load_ds(xq[x][b]));  // [d dx, d s]
      acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcastss_ps(prod), acc[x]);
      acc_s[x] = _mm_sub_ps(acc_s[x], prod);
    }
  } else {  // Q8_0: maddubs needs one unsigned operand, so move w's sign onto x.
    const uint8_t* blk = w + b * kQ8_0Bytes;
    const __m128 dd = _mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(blk))));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i q_abs = _mm256_sign_epi8(q, q);
    for (int x = 0; x < NX; ++x) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[x][b].q));
      const __m256i dot =
          _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(xv, q)), ones);
      const __m128 prod = _mm_mul_ss(dd, load_ds(xq[x][b]));
      acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcastss_ps(prod), acc[x]);
    }
  }
}

// y[x] = dot(weight row, x row) for NX x rows, weight blocks decoded once for all of them.
// Two accumulator sets (even / odd blocks) hide the FMA latency, which otherwise bounds a
// block at ~5 cycles: slower than DRAM delivers Q4 blocks.
template <BlockFormat F, int NX>
void row_dot_q(const uint8_t* w, int64_t nb, const BlockQ8* const* xq, float* y) {
  __m256 acc0[NX], acc1[NX];
  __m128 acc_s0[NX], acc_s1[NX];  // lane 1: per-block offsets (m sum(x), or d 8 dx sum(q))
  for (int x = 0; x < NX; ++x) {
    acc0[x] = acc1[x] = _mm256_setzero_ps();
    acc_s0[x] = acc_s1[x] = _mm_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block_dot<F, NX>(w, b, xq, acc0, acc_s0);
    block_dot<F, NX>(w, b + 1, xq, acc1, acc_s1);
  }
  if (b < nb) block_dot<F, NX>(w, b, xq, acc0, acc_s0);
  for (int x = 0; x < NX; ++x) {
    const __m128 s = _mm_add_ps(acc_s0[x], acc_s1[x]);
    y[x] = hsum(_mm256_add_ps(acc0[x], acc1[x])) + _mm_cvtss_f32(_mm_movehdup_ps(s));
  }
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

// Dispatch table over (format, x rows in this pass): one entry per template instance.
using RowDotQ = void (*)(const uint8_t*, int64_t, const BlockQ8* const*, float*);
template <BlockFormat F>
constexpr RowDotQ kRowDotQ[kMaxRowsX] = {row_dot_q<F, 1>, row_dot_q<F, 2>, row_dot_q<F, 3>,
                                         row_dot_q<F, 4>};
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
  const int64_t nb = w.cols / kBlock;
  std::vector<BlockQ8> xq(static_cast<size_t>(n * nb));
  for (int64_t i = 0; i < n; ++i) quantize_x(x + i * w.cols, w.cols, w.format, &xq[i * nb]);
  RowDotQ const* table = row_dot_table(w.format);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* wr = base + r * w.row_bytes;
    for (int64_t x0 = 0; x0 < n; x0 += kMaxRowsX) {
      const int nx = static_cast<int>(std::min<int64_t>(kMaxRowsX, n - x0));
      const BlockQ8* xs[kMaxRowsX];
      float out[kMaxRowsX];
      for (int i = 0; i < nx; ++i) xs[i] = &xq[(x0 + i) * nb];
      table[nx - 1](wr, nb, xs, out);
      for (int i = 0; i < nx; ++i) y[(x0 + i) * w.rows + r] = out[i];
    }
  }
}
#endif

// Portable path: dequantize a block to floats and take exact-x float dot products.
[[maybe_unused]] void block_matmul_portable(const BlockMatrix& w, const float* x, float* y,
                                            int64_t n) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t bb = block_bytes(w.format);
  const int64_t nb = w.format == BlockFormat::F32 ? 0 : w.cols / kBlock;
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
        float deq[kBlock];
        for (int64_t b = 0; b < nb; ++b) {
          dequant_block(w.format, wr + b * bb, deq);
          float s = 0.0f;
          for (int e = 0; e < kBlock; ++e) s += deq[e] * xi[b * kBlock + e];
          sum += s;
        }
      }
      y[i * w.rows + r] = sum;
    }
  }
}

}  // namespace

void block_matmul_cpu(const BlockMatrix& w, const float* x, float* y, int64_t n) {
  assert(w.format == BlockFormat::F32 || w.cols % kBlock == 0);
#if KVBENCH_MATVEC_AVX2
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
      const int64_t bb = block_bytes(w.format);
      for (int64_t b = 0; b < w.cols / kBlock; ++b) {
        dequant_block(w.format, wr + b * bb, row.data() + b * kBlock);
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
