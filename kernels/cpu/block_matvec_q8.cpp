#include "kernels/cpu/block_matvec_q8.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/block_layout.h"
#include "kernels/cpu/half.h"

namespace kvbench {
namespace {

using namespace block_layout;

// x rows sharing one pass over a weight row: a decode batch's rows (LlamaModel::decode_batch)
// decode each weight block once for up to eight of them.
constexpr int kMaxRowsX = 8;
// Weight bytes requested ahead of the row stream. One thread, Qwen2.5-0.5B decode ran 2-7%
// faster with it (side by side, 2026-11-29); on two threads, bound by memory, the same.
constexpr int64_t kPrefetchBytes = 1024;

// One quantized x row, as the row kernels read it.
struct Q8Row {
  const int8_t* codes;
  const float* scales;
  const int32_t* sums;
};

#if KVBENCH_AVX2
// Asks for the cache lines kPrefetchBytes beyond a block of `bytes`, every line it spans.
inline void prefetch_ahead(const uint8_t* block, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(block + kPrefetchBytes + at), _MM_HINT_T0);
  }
}

inline __m256i load_bytes(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Eight int32 partial sums of u[e] * s[e] over 32 bytes: u unsigned, s signed. maddubs
// adds adjacent products in int16, which cannot saturate here: u <= 128 and |s| <= 127.
// With AVX-512 VNNI one instruction (vpdpbusd) does both steps, exactly the same sums.
inline __m256i dot_u8_i8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Both signed: move a's sign onto b.
inline __m256i dot_i8_i8(__m256i a, __m256i b) {
  return dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// The 32-element formats: value = code * d + m, the codes unsigned (m = -8 d for Q4_0 and
// -16 d for Q5_0, whose codes are q - 8 and q - 16), so a block contributes
// d dx sum(code * xcode) + m dx sum(xcode); Q8_0's codes are signed and have no m. Unsigned
// codes go straight into the u8 x i8 dot product, without moving signs.
template <BlockFormat F, int NX>
void row_dot(const uint8_t* w, int64_t nb, const Q8Row* xs, float* y) {
  constexpr int64_t bytes = block_format_bytes(F);
  constexpr bool has_min = F == BlockFormat::Q4_1 || F == BlockFormat::Q5_1;
  constexpr float zero = F == BlockFormat::Q4_0 ? 8.0f : F == BlockFormat::Q5_0 ? 16.0f : 0.0f;
  constexpr bool unsigned_codes = F != BlockFormat::Q8_0;
  __m256 even[NX], odd[NX];
  float offset_sum[NX];
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) {
    even[x] = odd[x] = _mm256_setzero_ps();
    offset_sum[x] = 0.0f;
  }
  const auto block = [&](int64_t b, __m256* acc) {
    const uint8_t* blk = w + b * bytes;
    prefetch_ahead(blk, bytes);
    const float d = half_to_float(load_u16(blk));
    const float m = has_min ? half_to_float(load_u16(blk + 2)) : -zero * d;
    __m256i codes;
    if constexpr (F == BlockFormat::Q8_0) {
      codes = load_bytes(blk + 2);
    } else if constexpr (F == BlockFormat::Q4_0 || F == BlockFormat::Q4_1) {
      codes = q4_codes(blk + (has_min ? 4 : 2));
    } else {
      codes = q5_codes(blk + (has_min ? 4 : 2));
    }
    KVBENCH_UNROLL
    for (int x = 0; x < NX; ++x) {
      const __m256i xq = load_bytes(xs[x].codes + b * kBlock);
      const __m256i dot = unsigned_codes ? dot_u8_i8(codes, xq) : dot_i8_i8(codes, xq);
      const float dx = xs[x].scales[b];
      acc[x] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(dot), acc[x]);
      if constexpr (unsigned_codes) offset_sum[x] += m * dx * static_cast<float>(xs[x].sums[b]);
    }
  };
  // Two accumulator sets, named rather than indexed by b so that they stay in registers.
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    block(b, even);
    block(b + 1, odd);
  }
  if (b < nb) block(b, even);
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(even[x], odd[x])) + offset_sum[x];
}

// Q4_K: sub-block j of a super-block is a 32-element block with scale d * scale_j and
// offset -dmin * min_j, aligned with x's blocks. The eight sub-blocks' scales times x's and
// their offsets are computed as vectors once per super-block.
template <int NX>
void row_dot_q4_k(const uint8_t* w, int64_t nb, const Q8Row* xs, float* y) {
  constexpr int kSubBlocks = kSuper / kBlock;
  __m256 acc[2][NX], offsets[NX];
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) acc[0][x] = acc[1][x] = offsets[x] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t s = 0; s < nb / kSubBlocks; ++s) {
    const uint8_t* blk = w + s * kQ4_KBytes;
    prefetch_ahead(blk, kQ4_KBytes);
    const __m256 d = _mm256_set1_ps(half_to_float(load_u16(blk)));
    const __m256 minus_dmin = _mm256_set1_ps(-half_to_float(load_u16(blk + 2)));
    uint64_t sc, mn;
    q4_k_scales_mins(blk + kQ4_KScales, &sc, &mn);
    const auto widen = [](uint64_t bytes) {
      return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes))));
    };
    const __m256 scales = _mm256_mul_ps(d, widen(sc));
    const __m256 mins = _mm256_mul_ps(minus_dmin, widen(mn));
    const int64_t b0 = s * kSubBlocks;
    alignas(32) float scale_x[NX][kSubBlocks];  // d * scale_j * dx_j
    KVBENCH_UNROLL
    for (int x = 0; x < NX; ++x) {
      const __m256 dx = _mm256_loadu_ps(xs[x].scales + b0);
      _mm256_store_ps(scale_x[x], _mm256_mul_ps(scales, dx));
      const __m256 sums = _mm256_cvtepi32_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[x].sums + b0)));
      offsets[x] = _mm256_fmadd_ps(mins, _mm256_mul_ps(dx, sums), offsets[x]);
    }
    for (int pair = 0; pair < kSuper / 64; ++pair) {
      const __m256i raw = load_bytes(blk + kQ4_KQs + 32 * pair);
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        const __m256i codes = _mm256_and_si256(half ? _mm256_srli_epi16(raw, 4) : raw, mask);
        KVBENCH_UNROLL
        for (int x = 0; x < NX; ++x) {
          const __m256i dot = dot_u8_i8(codes, load_bytes(xs[x].codes + (b0 + j) * kBlock));
          acc[half][x] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale_x[x][j]),
                                         _mm256_cvtepi32_ps(dot), acc[half][x]);
        }
      }
    }
  }
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) {
    y[x] = hsum(_mm256_add_ps(_mm256_add_ps(acc[0][x], acc[1][x]), offsets[x]));
  }
}

// Q6_K: signed codes, and a scale per 16 elements: a 32-element group's eight int32 sums
// hold elements 0-15 in lanes 0-3 and 16-31 in lanes 4-7, so one scale vector carries both.
template <int NX>
void row_dot_q6_k(const uint8_t* w, int64_t nb, const Q8Row* xs, float* y) {
  __m256 acc[2][NX];
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) acc[0][x] = acc[1][x] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nb / (kSuper / kBlock); ++s) {
    const uint8_t* blk = w + s * kQ6_KBytes;
    prefetch_ahead(blk, kQ6_KBytes);
    const float d = half_to_float(load_u16(blk + kQ6_KD));
    const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6_KScales);
    for (int h = 0; h < 2; ++h) {
      __m256i codes[4];
      q6_k_codes(blk, h, codes);
      for (int g = 0; g < 4; ++g) {
        const __m256i magnitude = _mm256_sign_epi8(codes[g], codes[g]);
        const float d0 = d * static_cast<float>(scales[8 * h + 2 * g]);
        const float d1 = d * static_cast<float>(scales[8 * h + 2 * g + 1]);
        const int64_t b = s * (kSuper / kBlock) + 4 * h + g;
        KVBENCH_UNROLL
        for (int x = 0; x < NX; ++x) {
          const __m256i xq = load_bytes(xs[x].codes + b * kBlock);
          const __m256i dot = dot_u8_i8(magnitude, _mm256_sign_epi8(xq, codes[g]));
          const float dx = xs[x].scales[b];
          const __m256 scale = _mm256_set_m128(_mm_set1_ps(d1 * dx), _mm_set1_ps(d0 * dx));
          acc[g & 1][x] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[g & 1][x]);
        }
      }
    }
  }
  KVBENCH_UNROLL
  for (int x = 0; x < NX; ++x) y[x] = hsum(_mm256_add_ps(acc[0][x], acc[1][x]));
}

using RowDot = void (*)(const uint8_t*, int64_t, const Q8Row*, float*);
template <BlockFormat F>
constexpr RowDot kRowDot[kMaxRowsX] = {row_dot<F, 1>, row_dot<F, 2>, row_dot<F, 3>,
                                       row_dot<F, 4>, row_dot<F, 5>, row_dot<F, 6>,
                                       row_dot<F, 7>, row_dot<F, 8>};
constexpr RowDot kRowDotQ4_K[kMaxRowsX] = {row_dot_q4_k<1>, row_dot_q4_k<2>, row_dot_q4_k<3>,
                                           row_dot_q4_k<4>, row_dot_q4_k<5>, row_dot_q4_k<6>,
                                           row_dot_q4_k<7>, row_dot_q4_k<8>};
constexpr RowDot kRowDotQ6_K[kMaxRowsX] = {row_dot_q6_k<1>, row_dot_q6_k<2>, row_dot_q6_k<3>,
                                           row_dot_q6_k<4>, row_dot_q6_k<5>, row_dot_q6_k<6>,
                                           row_dot_q6_k<7>, row_dot_q6_k<8>};

RowDot const* row_dot_table(BlockFormat format) {
  switch (format) {
    case BlockFormat::Q4_0: return kRowDot<BlockFormat::Q4_0>;
    case BlockFormat::Q4_1: return kRowDot<BlockFormat::Q4_1>;
    case BlockFormat::Q8_0: return kRowDot<BlockFormat::Q8_0>;
    case BlockFormat::Q5_0: return kRowDot<BlockFormat::Q5_0>;
    case BlockFormat::Q5_1: return kRowDot<BlockFormat::Q5_1>;
    case BlockFormat::Q4_K: return kRowDotQ4_K;
    case BlockFormat::Q6_K: return kRowDotQ6_K;
    case BlockFormat::F32: break;
  }
  return nullptr;
}

void block_matmul_q8_avx2(const BlockMatrix& w, const Q8Activations& x, float* y) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.cols / kBlock;
  RowDot const* table = row_dot_table(w.format);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* wr = base + r * w.row_bytes;
    for (int64_t x0 = 0; x0 < x.n; x0 += kMaxRowsX) {
      const int nx = static_cast<int>(std::min<int64_t>(kMaxRowsX, x.n - x0));
      Q8Row xs[kMaxRowsX];
      float out[kMaxRowsX];
      for (int i = 0; i < nx; ++i) {
        xs[i] = {x.codes.data() + (x0 + i) * w.cols, x.scales.data() + (x0 + i) * nb,
                 x.sums.data() + (x0 + i) * nb};
      }
      table[nx - 1](wr, nb, xs, out);
      for (int i = 0; i < nx; ++i) y[(x0 + i) * w.rows + r] = out[i];
    }
  }
}
#endif

// Portable path: the weights dequantized to floats, times x's codes * scale.
[[maybe_unused]] void block_matmul_q8_portable(const BlockMatrix& w, const Q8Activations& x,
                                               float* y) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t block_bytes = block_format_bytes(w.format);
  const int64_t block_elements = block_format_elements(w.format);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; ++r) {
    float values[kSuper];
    for (int64_t i = 0; i < x.n; ++i) {
      const int8_t* codes = x.codes.data() + i * w.cols;
      const float* scales = x.scales.data() + i * (w.cols / kBlock);
      float sum = 0.0f;
      for (int64_t b = 0; b < w.cols / block_elements; ++b) {
        dequant_block(w.format, base + r * w.row_bytes + b * block_bytes, values);
        for (int64_t e = 0; e < block_elements; ++e) {
          const int64_t c = b * block_elements + e;
          sum += values[e] * static_cast<float>(codes[c]) * scales[c / kBlock];
        }
      }
      y[i * w.rows + r] = sum;
    }
  }
}

}  // namespace

// GCC 12's AVX-512 intrinsics pass self-initialized "undefined" vectors that its own
// -Wmaybe-uninitialized then reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void quantize_activations_q8(const float* x, int64_t n, int64_t cols, Q8Activations* out) {
  assert(cols % kBlock == 0);
  const int64_t nb = n * cols / kBlock;
  out->n = n;
  out->cols = cols;
  out->codes.resize(static_cast<size_t>(n * cols));
  out->scales.resize(static_cast<size_t>(nb));
  out->sums.resize(static_cast<size_t>(nb));
  int8_t* codes = out->codes.data();
  float* scales = out->scales.data();
  int32_t* sums = out->sums.data();
  // Threads only for prefill-sized inputs: a decode step's few blocks cost less than a fork.
#pragma omp parallel for schedule(static) if (nb >= 4096)
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kBlock;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    // The scalar loop below, 16 lanes at a time: the same max, product and rounding.
    scales[b] = round_block_q8(xb, codes + b * kBlock, &sums[b]);
#else
    float amax = 0.0f;
    for (int e = 0; e < kBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int e = 0; e < kBlock; ++e) {
      const auto code = static_cast<int8_t>(std::nearbyint(xb[e] * inverse));
      codes[b * kBlock + e] = code;
      sum += code;
    }
    scales[b] = amax / 127.0f;
    sums[b] = sum;
#endif
  }
}
#pragma GCC diagnostic pop

void block_matmul_q8(const BlockMatrix& w, const Q8Activations& x, float* y) {
  assert(w.format != BlockFormat::F32 && x.cols == w.cols);
#if KVBENCH_AVX2
  block_matmul_q8_avx2(w, x, y);
#else
  block_matmul_q8_portable(w, x, y);
#endif
}

}  // namespace kvbench
