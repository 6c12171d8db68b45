// Building blocks of the tiled CPU attention kernels (attention.cpp, scores.cpp): query rows
// gathered per KV head, causal masking by position per key tile, a register-blocked fp32 GEMM
// (AVX2 micro-kernel, portable tail), a key-tile transpose, few-row dot products that read
// keys in place, exp2-based row softmax steps; and the logits of their double references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/avx2.h"
#include "kernels/layouts.h"

namespace kvbench::tile {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKeyTile = 64;    // keys per tile: K, K^T and V tiles stay in L1/L2
constexpr int kMr = 6;          // micro-kernel rows
constexpr int kNr = 16;         // micro-kernel columns (two AVX vectors)
constexpr int kDirectRows = 8;  // up to this many query rows, scores skip the K transpose

struct QueryRange {
  int32_t min, max;  // lowest and highest query position of a tile
};

// Rows of queries [q0, q1) for KV head kvh: row r = (i - q0) * group + g is query i, head
// kvh * group + g. Writes q * qscale into rows [rows, head_dim] and each row's position into
// row_pos [rows].
inline QueryRange gather_query_rows(const AttentionQuery& query, int kvh, int group, int dim,
                                    int q0, int q1, float qscale, float* rows, int32_t* row_pos) {
  QueryRange range{std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  for (int i = q0; i < q1; ++i) {
    const float* src = query.q + (static_cast<int64_t>(i) * query.n_heads + kvh * group) * dim;
    float* dst = rows + static_cast<int64_t>(i - q0) * group * dim;
    for (int e = 0; e < group * dim; ++e) dst[e] = src[e] * qscale;
    for (int g = 0; g < group; ++g) row_pos[(i - q0) * group + g] = query.q_positions[i];
    range.min = std::min(range.min, query.q_positions[i]);
    range.max = std::max(range.max, query.q_positions[i]);
  }
  return range;
}

// How a key tile (stored positions pos[0, nk)) meets a query tile: no query sees any key,
// every query sees every key, or some query misses some key (mask row by row).
enum class TileMask { Skip, None, Partial };

inline TileMask tile_mask(const int32_t* pos, int nk, QueryRange queries) {
  const auto [pmin_it, pmax_it] = std::minmax_element(pos, pos + nk);
  if (*pmin_it > queries.max) return TileMask::Skip;
  return *pmax_it > queries.min ? TileMask::Partial : TileMask::None;
}

// s[j] = -inf for every key j stored after query position qp.
inline void mask_after(float* s, const int32_t* pos, int nk, int32_t qp) {
  for (int j = 0; j < nk; ++j) {
    if (pos[j] > qp) s[j] = kNegInf;
  }
}

// C[MR][nc] (+)= A[MR][kdim] * B[kdim][nc]; A(r, k) = a[r * lda + k], B rows are ldb apart.
template <int MR>
inline void gemm_rows_scalar(int kdim, int nc, const float* a, int64_t lda, const float* b,
                             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  KVBENCH_UNROLL
  for (int r = 0; r < MR; ++r) {
    float* crow = c + r * ldc;
    if (!accumulate) std::fill(crow, crow + nc, 0.0f);
    for (int k = 0; k < kdim; ++k) {
      const float av = a[r * lda + k];
      const float* brow = b + k * ldb;
      for (int j = 0; j < nc; ++j) crow[j] += av * brow[j];
    }
  }
}

#if KVBENCH_AVX2
template <int MR>
inline void gemm_rows_x16(int kdim, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float* c, int64_t ldc, bool accumulate) {
  __m256 c0[MR], c1[MR];
  KVBENCH_UNROLL
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    c1[r] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int k = 0; k < kdim; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * ldb);
    const __m256 b1 = _mm256_loadu_ps(b + k * ldb + 8);
    KVBENCH_UNROLL
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
  KVBENCH_UNROLL
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * ldc, c0[r]);
    _mm256_storeu_ps(c + r * ldc + 8, c1[r]);
  }
}
#endif

template <int MR>
inline void gemm_rows(int kdim, int ncols, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, bool accumulate) {
  int j = 0;
#if KVBENCH_AVX2
  for (; j + kNr <= ncols; j += kNr) {
    gemm_rows_x16<MR>(kdim, a, lda, b + j, ldb, c + j, ldc, accumulate);
  }
#endif
  if (j < ncols) {
    gemm_rows_scalar<MR>(kdim, ncols - j, a, lda, b + j, ldb, c + j, ldc, accumulate);
  }
}

// C[rows][ncols] (+)= A[rows][kdim] * B[kdim][ncols], in blocks of kMr rows.
inline void gemm(int rows, int kdim, int ncols, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int r = 0;
  for (; r + kMr <= rows; r += kMr) {
    gemm_rows<kMr>(kdim, ncols, a + r * lda, lda, b, ldb, c + r * ldc, ldc, accumulate);
  }
  // The last rows - r < kMr rows, one instantiation each.
  using RowsKernel =
      void (*)(int, int, const float*, int64_t, const float*, int64_t, float*, int64_t, bool);
  static constexpr RowsKernel kTail[kMr] = {nullptr,      gemm_rows<1>, gemm_rows<2>,
                                            gemm_rows<3>, gemm_rows<4>, gemm_rows<5>};
  static_assert(kMr == 6, "kTail lists the row counts below kMr");
  if (r < rows)
    kTail[rows - r](kdim, ncols, a + r * lda, lda, b, ldb, c + r * ldc, ldc, accumulate);
}

// kt[d][j] = k[j][d] for j < nk; columns nk..ld-1 are zeroed so the padded scores are finite.
inline void pack_transposed(const float* k, int nk, int head_dim, float* kt, int ld) {
  int j = 0;
#if KVBENCH_AVX2
  if (head_dim % 8 == 0) {
    for (; j + 8 <= nk; j += 8) {
      for (int d = 0; d < head_dim; d += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(k + (j + i) * head_dim + d);
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* out = kt + d * ld + j;
        _mm256_storeu_ps(out + 0 * ld, _mm256_permute2f128_ps(s0, s4, 0x20));
        _mm256_storeu_ps(out + 1 * ld, _mm256_permute2f128_ps(s1, s5, 0x20));
        _mm256_storeu_ps(out + 2 * ld, _mm256_permute2f128_ps(s2, s6, 0x20));
        _mm256_storeu_ps(out + 3 * ld, _mm256_permute2f128_ps(s3, s7, 0x20));
        _mm256_storeu_ps(out + 4 * ld, _mm256_permute2f128_ps(s0, s4, 0x31));
        _mm256_storeu_ps(out + 5 * ld, _mm256_permute2f128_ps(s1, s5, 0x31));
        _mm256_storeu_ps(out + 6 * ld, _mm256_permute2f128_ps(s2, s6, 0x31));
        _mm256_storeu_ps(out + 7 * ld, _mm256_permute2f128_ps(s3, s7, 0x31));
      }
    }
  }
#endif
  for (; j < nk; ++j) {
    for (int d = 0; d < head_dim; ++d) kt[d * ld + j] = k[j * head_dim + d];
  }
  for (int d = 0; d < head_dim; ++d) {
    for (int jj = nk; jj < ld; ++jj) kt[d * ld + jj] = 0.0f;
  }
}

#if KVBENCH_AVX2
// Sum of each of eight vectors, as one vector: out[i] = sum(v[i]).
inline __m256 sum8(const __m256 v[8]) {
  const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
  // a = [s0 s1 s2 s3 | s0' s1' s2' s3'] (low / high 128-bit halves of each sum), b alike.
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

// s[r][j] = q[r] . k[j] for a few query rows, reading each key row in place. For decode
// (rows = one GQA group) this beats transposing the key tile for a GEMM: the tile is
// used by only a handful of rows, so the transpose was most of the work.
inline void scores_direct(int rows, int dim, const float* q, const float* k, int nk, float* s,
                          int ld) {
  int j = 0;
#if KVBENCH_AVX2
  if (dim % 8 == 0) {
    for (; j + 8 <= nk; j += 8) {
      for (int r = 0; r < rows; ++r) {
        const float* qr = q + r * dim;
        __m256 acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
        for (int d = 0; d < dim; d += 8) {
          const __m256 qv = _mm256_loadu_ps(qr + d);
          for (int i = 0; i < 8; ++i) {
            acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (j + i) * dim + d), acc[i]);
          }
        }
        _mm256_storeu_ps(s + r * ld + j, sum8(acc));
      }
    }
  }
#endif
  for (; j < nk; ++j) {
    for (int r = 0; r < rows; ++r) {
      float dot = 0.0f;
      for (int d = 0; d < dim; ++d) dot += q[r * dim + d] * k[j * dim + d];
      s[r * ld + j] = dot;
    }
  }
}

#if KVBENCH_AVX2
// 2^x for x <= 0 (scores minus their running max): degree-7 Taylor polynomial on
// [-0.5, 0.5], relative error < 1e-7; x below -126 (masked keys) gives exactly 0.
inline __m256 exp2_nonpositive(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5252733804059841e-05f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), underflow);
}
#endif

inline float row_max(const float* s, int n) {
  int j = 0;
  float m = kNegInf;
#if KVBENCH_AVX2
  __m256 vm = _mm256_set1_ps(kNegInf);
  for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
  m = hmax(vm);
#endif
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// s[j] = 2^(s[j] - m) in place; returns the sum.
inline float exp2_shift_sum(float* s, int n, float m) {
  int j = 0;
  float sum = 0.0f;
#if KVBENCH_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 p = exp2_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, p);
    vs = _mm256_add_ps(vs, p);
  }
  sum = hsum(vs);
#endif
  for (; j < n; ++j) {
    s[j] = std::exp2(s[j] - m);
    sum += s[j];
  }
  return sum;
}

// Logits of query row (query i, head h) in double, for the reference kernels: scale * q . k_t
// for the keys the row sees, -inf for the others. Returns their max (-inf: it sees none).
inline double reference_logits(const AttentionQuery& query, const DenseKv& kv, int i, int h,
                               double* logits) {
  const int dim = kv.head_dim;
  const int kvh = h / (query.n_heads / kv.n_kv_heads);
  const float* q = query.q + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
  const int32_t* head_pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity;
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < kv.n_tokens; ++t) {
    logits[t] = -std::numeric_limits<double>::infinity();
    if (head_pos[t] > query.q_positions[i]) continue;
    const float* k = kv.k + (kvh * kv.capacity + t) * dim;
    double dot = 0.0;
    for (int d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * k[d];
    logits[t] = dot * query.scale;
    m = std::max(m, logits[t]);
  }
  return m;
}

// Split-K (flash-decoding) partials of one output row: n_splits entries part_stride apart,
// each dim unnormalised outputs, then the running max (log2 domain) and the softmax
// denominator. Writes the normalised row (zeros when no split saw a key).
inline void merge_split_partials(const float* first, int n_splits, int64_t part_stride, int dim,
                                 float* out) {
  float m = kNegInf;
  for (int s = 0; s < n_splits; ++s) m = std::max(m, first[s * part_stride + dim]);
  std::fill(out, out + dim, 0.0f);
  if (m == kNegInf) return;
  float l = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float* p = first + s * part_stride;
    const float c = std::exp2(p[dim] - m);
    if (c == 0.0f) continue;
    l += c * p[dim + 1];
    for (int d = 0; d < dim; ++d) out[d] += c * p[d];
  }
  const float inv = 1.0f / l;
  for (int d = 0; d < dim; ++d) out[d] *= inv;
}

}  // namespace kvbench::tile
