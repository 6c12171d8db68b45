#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/avx2.h"

namespace kvbench {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKeyTile = 64;        // keys per tile: K, K^T and V tiles stay in L1/L2
constexpr int kTileRows = 192;      // target query rows (query x head) per work item
constexpr int kMinSplitKeys = 512;  // split-K never makes a split shorter than this
constexpr int kMr = 6;              // micro-kernel rows
constexpr int kNr = 16;             // micro-kernel columns (two AVX vectors)
constexpr int kDirectRows = 8;      // up to this many query rows, scores skip the K transpose

// C[MR][nc] (+)= A[MR][kdim] * B[kdim][nc]; A(r, k) = a[r * lda + k], B rows are ldb apart.
template <int MR>
inline void gemm_rows_scalar(int kdim, int nc, const float* a, int64_t lda, const float* b,
                             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
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
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    c1[r] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int k = 0; k < kdim; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * ldb);
    const __m256 b1 = _mm256_loadu_ps(b + k * ldb + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
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
void gemm(int rows, int kdim, int ncols, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, bool accumulate) {
  int r = 0;
  for (; r + kMr <= rows; r += kMr) {
    gemm_rows<kMr>(kdim, ncols, a + r * lda, lda, b, ldb, c + r * ldc, ldc, accumulate);
  }
  const float* ar = a + r * lda;
  float* cr = c + r * ldc;
  switch (rows - r) {
    case 0:
      break;
    case 1:
      gemm_rows<1>(kdim, ncols, ar, lda, b, ldb, cr, ldc, accumulate);
      break;
    case 2:
      gemm_rows<2>(kdim, ncols, ar, lda, b, ldb, cr, ldc, accumulate);
      break;
    case 3:
      gemm_rows<3>(kdim, ncols, ar, lda, b, ldb, cr, ldc, accumulate);
      break;
    case 4:
      gemm_rows<4>(kdim, ncols, ar, lda, b, ldb, cr, ldc, accumulate);
      break;
    default:
      gemm_rows<5>(kdim, ncols, ar, lda, b, ldb, cr, ldc, accumulate);
      break;
  }
}

// kt[d][j] = k[j][d] for j < nk; columns nk..ld-1 are zeroed so the padded scores are finite.
void pack_transposed(const float* k, int nk, int head_dim, float* kt, int ld) {
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
void scores_direct(int rows, int dim, const float* q, const float* k, int nk, float* s,
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

float row_max(const float* s, int n) {
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
float exp2_shift_sum(float* s, int n, float m) {
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

void scale_row(float* o, int n, float alpha) {
  for (int d = 0; d < n; ++d) o[d] *= alpha;
}

// Per-thread buffers, reused across calls so decode does not allocate per layer.
struct Scratch {
  std::vector<float> q;       // [rows, head_dim] queries pre-scaled by scale * log2(e)
  std::vector<float> kt;      // [head_dim, kKeyTile] one key tile, transposed
  std::vector<float> s;       // [rows, kKeyTile] scores, then probabilities
  std::vector<float> o;       // [rows, head_dim] unnormalised output
  std::vector<float> m, l;    // [rows] running max (log2 domain) and softmax denominator
  std::vector<int32_t> qpos;  // [rows] query position of each row
};

struct Plan {
  int group;   // query heads per KV head
  int q_tile;  // queries per work item
  int n_q_tiles;
  int n_splits;  // key ranges per (kv head, query tile); > 1 only for few queries
  int64_t split_len;
  int rows;  // q_tile * group
};

// One work item: query tile [q0, q1) of KV head kvh over stored tokens [t0, t1).
// Leaves unnormalised o, m, l for rows (query, head-in-group) in the scratch buffers.
void attend_tile(const AttentionQuery& query, const DenseKv& kv, const Plan& plan, int kvh, int q0,
                 int q1, int64_t t0, int64_t t1, Scratch& w) {
  const int dim = kv.head_dim;
  const int group = plan.group;
  const int rows = (q1 - q0) * group;
  const float qscale = query.scale * kLog2e;
  int32_t qpos_min = std::numeric_limits<int32_t>::max();
  int32_t qpos_max = std::numeric_limits<int32_t>::min();
  for (int i = q0; i < q1; ++i) {
    const float* src = query.q + (static_cast<int64_t>(i) * query.n_heads + kvh * group) * dim;
    float* dst = w.q.data() + static_cast<int64_t>(i - q0) * group * dim;
    for (int e = 0; e < group * dim; ++e) dst[e] = src[e] * qscale;
    for (int g = 0; g < group; ++g) w.qpos[(i - q0) * group + g] = query.q_positions[i];
    qpos_min = std::min(qpos_min, query.q_positions[i]);
    qpos_max = std::max(qpos_max, query.q_positions[i]);
  }
  std::fill(w.o.begin(), w.o.begin() + static_cast<int64_t>(rows) * dim, 0.0f);
  std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);

  const float* k_head = kv.k + static_cast<int64_t>(kvh) * kv.capacity * dim;
  const float* v_head = kv.v + static_cast<int64_t>(kvh) * kv.capacity * dim;
  for (int64_t k0 = t0; k0 < t1; k0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, t1 - k0));
    const int32_t* pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity + k0;
    const auto [pmin_it, pmax_it] = std::minmax_element(pos, pos + nk);
    if (*pmin_it > qpos_max) continue;        // no query of the tile sees any key
    const bool masked = *pmax_it > qpos_min;  // some query misses some key
    const int ld = (nk + kNr - 1) / kNr * kNr;
    if (rows <= kDirectRows) {
      scores_direct(rows, dim, w.q.data(), k_head + k0 * dim, nk, w.s.data(), ld);
    } else {
      pack_transposed(k_head + k0 * dim, nk, dim, w.kt.data(), ld);
      gemm(rows, dim, ld, w.q.data(), dim, w.kt.data(), ld, w.s.data(), ld, false);
    }
    for (int r = 0; r < rows; ++r) {
      float* srow = w.s.data() + static_cast<int64_t>(r) * ld;
      if (masked) {
        const int32_t qp = w.qpos[r];
        for (int j = 0; j < nk; ++j) {
          if (pos[j] > qp) srow[j] = kNegInf;
        }
      }
      const float m_new = std::max(w.m[r], row_max(srow, nk));
      if (m_new == kNegInf) {  // nothing visible yet for this row
        std::fill(srow, srow + nk, 0.0f);
        continue;
      }
      const float alpha = std::exp2(w.m[r] - m_new);  // 0 when m was -inf
      const float sum = exp2_shift_sum(srow, nk, m_new);
      if (alpha != 1.0f) scale_row(w.o.data() + static_cast<int64_t>(r) * dim, dim, alpha);
      w.l[r] = w.l[r] * alpha + sum;
      w.m[r] = m_new;
    }
    gemm(rows, nk, dim, w.s.data(), ld, v_head + k0 * dim, dim, w.o.data(), dim, true);
  }
}

Plan make_plan(const AttentionQuery& query, const DenseKv& kv, int threads) {
  Plan p;
  p.group = query.n_heads / kv.n_kv_heads;
  p.q_tile = std::max(1, std::min<int>(query.n_queries, kTileRows / p.group));
  p.n_q_tiles = (query.n_queries + p.q_tile - 1) / p.q_tile;
  p.rows = p.q_tile * p.group;
  // Split-K (flash-decoding) when there are too few work items to keep every thread busy.
  const int64_t items = static_cast<int64_t>(kv.n_kv_heads) * p.n_q_tiles;
  const int64_t want = 8LL * threads;
  int64_t splits = 1;
  if (items < want) {
    splits = std::min<int64_t>((want + items - 1) / items, kv.n_tokens / kMinSplitKeys);
    splits = std::max<int64_t>(splits, 1);
  }
  p.split_len = (kv.n_tokens + splits - 1) / splits;
  p.split_len = std::max<int64_t>(kKeyTile, (p.split_len + kKeyTile - 1) / kKeyTile * kKeyTile);
  p.n_splits =
      static_cast<int>(std::max<int64_t>(1, (kv.n_tokens + p.split_len - 1) / p.split_len));
  return p;
}

void ensure(Scratch& w, int rows, int dim) {
  const size_t rd = static_cast<size_t>(rows) * dim;
  if (w.q.size() < rd) {
    w.q.resize(rd);
    w.o.resize(rd);
  }
  if (w.kt.size() < static_cast<size_t>(dim) * kKeyTile)
    w.kt.resize(static_cast<size_t>(dim) * kKeyTile);
  if (w.s.size() < static_cast<size_t>(rows) * kKeyTile)
    w.s.resize(static_cast<size_t>(rows) * kKeyTile);
  if (w.m.size() < static_cast<size_t>(rows)) {
    w.m.resize(rows);
    w.l.resize(rows);
    w.qpos.resize(rows);
  }
}

}  // namespace

void attention_dense_cpu(const AttentionQuery& query, const DenseKv& kv) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  if (query.n_queries <= 0) return;
  const int dim = kv.head_dim;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const Plan plan = make_plan(query, kv, threads);
  const int64_t n_items = static_cast<int64_t>(kv.n_kv_heads) * plan.n_q_tiles * plan.n_splits;
  // Partials of split-K items: [item][rows][dim + 2] holding o, then m and l.
  const int64_t part_stride = static_cast<int64_t>(plan.rows) * (dim + 2);
  std::vector<float> partial;
  if (plan.n_splits > 1) partial.resize(n_items * part_stride);

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    static thread_local Scratch w;
    ensure(w, plan.rows, dim);
    // Later query tiles see more keys: start them first for a better dynamic balance.
    const int split = static_cast<int>(item % plan.n_splits);
    const int64_t rest = item / plan.n_splits;
    const int kvh = static_cast<int>(rest % kv.n_kv_heads);
    const int tile = plan.n_q_tiles - 1 - static_cast<int>(rest / kv.n_kv_heads);
    const int q0 = tile * plan.q_tile;
    const int q1 = std::min(query.n_queries, q0 + plan.q_tile);
    const int64_t t0 = split * plan.split_len;
    const int64_t t1 = std::min(kv.n_tokens, t0 + plan.split_len);
    attend_tile(query, kv, plan, kvh, q0, q1, t0, t1, w);
    const int rows = (q1 - q0) * plan.group;
    if (plan.n_splits == 1) {
      for (int r = 0; r < rows; ++r) {
        const int i = q0 + r / plan.group;
        const int h = kvh * plan.group + r % plan.group;
        float* out = query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
        const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;  // no visible key: zeros
        const float* o = w.o.data() + static_cast<int64_t>(r) * dim;
        for (int d = 0; d < dim; ++d) out[d] = o[d] * inv;
      }
    } else {
      float* part = partial.data() + item * part_stride;
      for (int r = 0; r < rows; ++r) {
        float* dst = part + static_cast<int64_t>(r) * (dim + 2);
        std::copy(w.o.data() + static_cast<int64_t>(r) * dim,
                  w.o.data() + static_cast<int64_t>(r + 1) * dim, dst);
        dst[dim] = w.m[r];
        dst[dim + 1] = w.l[r];
      }
    }
  }
  if (plan.n_splits == 1) return;

  // Merge the splits of each row: rescale every partial to the common max.
  const int64_t n_rows = static_cast<int64_t>(kv.n_kv_heads) * plan.n_q_tiles * plan.rows;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t row = 0; row < n_rows; ++row) {
    const int r = static_cast<int>(row % plan.rows);
    const int64_t rest = row / plan.rows;
    const int kvh = static_cast<int>(rest % kv.n_kv_heads);
    const int tile = plan.n_q_tiles - 1 - static_cast<int>(rest / kv.n_kv_heads);
    const int i = tile * plan.q_tile + r / plan.group;
    if (i >= query.n_queries) continue;
    const int h = kvh * plan.group + r % plan.group;
    const float* first =
        partial.data() + rest * plan.n_splits * part_stride + static_cast<int64_t>(r) * (dim + 2);
    float m = kNegInf;
    for (int s = 0; s < plan.n_splits; ++s) m = std::max(m, first[s * part_stride + dim]);
    float* out = query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
    std::fill(out, out + dim, 0.0f);
    if (m == kNegInf) continue;
    float l = 0.0f;
    for (int s = 0; s < plan.n_splits; ++s) {
      const float* p = first + s * part_stride;
      const float c = std::exp2(p[dim] - m);
      if (c == 0.0f) continue;
      l += c * p[dim + 1];
      for (int d = 0; d < dim; ++d) out[d] += c * p[d];
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < dim; ++d) out[d] *= inv;
  }
}

void attention_dense_reference(const AttentionQuery& query, const DenseKv& kv) {
  const int dim = kv.head_dim;
  const int group = query.n_heads / kv.n_kv_heads;
  std::vector<double> scores(static_cast<size_t>(kv.n_tokens));
  std::vector<double> acc(dim);
  for (int i = 0; i < query.n_queries; ++i) {
    for (int h = 0; h < query.n_heads; ++h) {
      const float* q = query.q + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
      const int kvh = h / group;
      const int32_t* head_pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        scores[t] = -std::numeric_limits<double>::infinity();
        if (head_pos[t] > query.q_positions[i]) continue;
        const float* k = kv.k + (kvh * kv.capacity + t) * dim;
        double dot = 0.0;
        for (int d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        scores[t] = dot * query.scale;
        m = std::max(m, scores[t]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      if (m != -std::numeric_limits<double>::infinity()) {
        for (int64_t t = 0; t < kv.n_tokens; ++t) {
          if (head_pos[t] > query.q_positions[i]) continue;
          const double p = std::exp(scores[t] - m);
          sum += p;
          const float* v = kv.v + (kvh * kv.capacity + t) * dim;
          for (int d = 0; d < dim; ++d) acc[d] += p * v[d];
        }
      }
      float* out = query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
      for (int d = 0; d < dim; ++d) out[d] = sum > 0.0 ? static_cast<float>(acc[d] / sum) : 0.0f;
    }
  }
}

}  // namespace kvbench
