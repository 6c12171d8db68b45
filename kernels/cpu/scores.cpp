#include "kernels/cpu/scores.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/cpu/tile_gemm.h"

namespace kvbench {
namespace {

using namespace tile;

constexpr int kBlockRows = 24;  // most query rows (query x head) per block: 4 GEMM strips
// A block's scores (rows x stored tokens) are bounded by about one L2 (512 KiB), so the
// softmax passes after the GEMM re-read them from cache; long contexts get fewer rows.
constexpr int64_t kBlockScoreFloats = 128 * 1024;

#if KVBENCH_AVX2
inline float dot(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int d = 0;
  for (; d + 8 <= n; d += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  float sum = hsum(acc);
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}
#else
inline float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}
#endif

// How the query rows are cut into blocks and the blocks dealt to work items.
struct ScorePlan {
  int group;    // query heads per KV head
  int q_block;  // queries per block; a block's rows are (query, head in group), query-major
  int n_blocks;
  int slabs;    // work items per KV head; slab s takes blocks s, s + slabs, ... (causal balance)
  int n_tiles;  // key tiles of kKeyTile stored tokens
  int64_t ld;   // row stride of a block's scores: whole tiles, plus a line against 4K aliasing
  bool packed;  // blocks are large enough for the GEMM path: keys pre-transposed per tile
};

ScorePlan make_score_plan(const AttentionQuery& query, const DenseKv& kv, int threads) {
  ScorePlan p;
  p.group = query.n_heads / kv.n_kv_heads;
  p.n_tiles = static_cast<int>((kv.n_tokens + kKeyTile - 1) / kKeyTile);
  p.ld = static_cast<int64_t>(p.n_tiles) * kKeyTile + kNr;
  const int64_t rows = std::clamp<int64_t>(kBlockScoreFloats / p.ld, p.group, kBlockRows);
  p.q_block = std::min<int>(query.n_queries, std::max<int>(1, static_cast<int>(rows) / p.group));
  p.n_blocks = (query.n_queries + p.q_block - 1) / p.q_block;
  p.slabs = std::clamp((2 * threads + kv.n_kv_heads - 1) / kv.n_kv_heads, 1, p.n_blocks);
  p.packed = p.q_block * p.group > kDirectRows;
  return p;
}

// Per-thread buffers, reused across calls.
struct ScoreScratch {
  std::vector<float> q;       // [rows, head_dim] queries pre-scaled by scale * log2(e)
  std::vector<int32_t> qpos;  // [rows] query position of each row
  std::vector<float> s;       // [rows, ld] scores (log2 domain), then softmax numerators
  std::vector<float> m;       // [rows] row max
  std::vector<std::pair<int64_t, int64_t>> runs;  // stored-token ranges some row of the block sees
};

// Room in w for a block of `rows` rows.
void ensure(ScoreScratch& w, int rows, int dim, int64_t ld) {
  if (w.q.size() < static_cast<size_t>(rows) * dim) w.q.resize(static_cast<size_t>(rows) * dim);
  if (w.qpos.size() < static_cast<size_t>(rows)) {
    w.qpos.resize(rows);
    w.m.resize(rows);
  }
  if (w.s.size() < static_cast<size_t>(rows * ld)) w.s.resize(rows * ld);
}

// One block of queries [q0, q1) of KV head kvh: adds the softmax probabilities of query
// q0 + j's row for head g of the group into acc[j * query_stride + g * acc_stride + t]
// (query_stride 0: every query into its head's one row). kt: the head's keys, transposed per
// tile ([n_tiles, head_dim, kKeyTile]), or null when the block reads keys in place.
void score_block(const AttentionQuery& query, const DenseKv& kv, const ScorePlan& plan,
                 const float* kt, int kvh, int q0, int q1, ScoreScratch& w, float* acc,
                 int64_t acc_stride, int64_t query_stride) {
  const int dim = kv.head_dim;
  const int group = plan.group;
  const int rows = (q1 - q0) * group;
  const QueryRange queries = gather_query_rows(query, kvh, group, dim, q0, q1, query.scale * kLog2e,
                                               w.q.data(), w.qpos.data());
  std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
  w.runs.clear();

  // Pass 1: scores of every key tile some row sees, masked, and each row's max.
  const float* k_head = kv.k + static_cast<int64_t>(kvh) * kv.capacity * dim;
  const int32_t* head_pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity;
  for (int tile = 0; tile < plan.n_tiles; ++tile) {
    const int64_t k0 = static_cast<int64_t>(tile) * kKeyTile;
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kv.n_tokens - k0));
    const int32_t* pos = head_pos + k0;
    const TileMask mask = tile_mask(pos, nk, queries);
    if (mask == TileMask::Skip) continue;
    float* s = w.s.data() + k0;
    if (kt == nullptr) {
      scores_direct(rows, dim, w.q.data(), k_head + k0 * dim, nk, s, plan.ld);
    } else {
      const int ncols = (nk + kNr - 1) / kNr * kNr;  // padded keys of the last tile score 0
      gemm(rows, dim, ncols, w.q.data(), dim, kt + static_cast<int64_t>(tile) * dim * kKeyTile,
           kKeyTile, s, plan.ld, false);
    }
    for (int r = 0; r < rows; ++r) {
      float* srow = s + r * plan.ld;
      if (mask == TileMask::Partial) mask_after(srow, pos, nk, w.qpos[r]);
      w.m[r] = std::max(w.m[r], row_max(srow, nk));
    }
    if (!w.runs.empty() && w.runs.back().second == k0) {
      w.runs.back().second = k0 + nk;
    } else {
      w.runs.emplace_back(k0, k0 + nk);
    }
  }

  // Pass 2, row by row while the row is in cache: numerators and their sum, then the
  // normalised probabilities into the row's head.
  for (int r = 0; r < rows; ++r) {
    const float m = w.m[r];
    if (m == kNegInf) continue;  // the query sees no stored key: it contributes nothing
    float* srow = w.s.data() + r * plan.ld;
    float sum = 0.0f;
    for (const auto& [a, b] : w.runs) sum += exp2_shift_sum(srow + a, static_cast<int>(b - a), m);
    const float inv = 1.0f / sum;  // sum >= 1: the max itself contributes 2^0
    float* dst = acc + (r / group) * query_stride + (r % group) * acc_stride;
    for (const auto& [a, b] : w.runs) {
      for (int64_t t = a; t < b; ++t) dst[t] += srow[t] * inv;
    }
  }
}

// Floats of one KV head's keys transposed tile by tile.
int64_t key_tiles_floats(const DenseKv& kv, const ScorePlan& plan) {
  return static_cast<int64_t>(plan.n_tiles) * kv.head_dim * kKeyTile;
}

// Keys of every KV head transposed tile by tile, for the GEMM path: [n_kv_heads, n_tiles,
// head_dim, kKeyTile], the last tile zero-padded.
void pack_key_tiles(const DenseKv& kv, const ScorePlan& plan, int threads, float* kt) {
  const int dim = kv.head_dim;
  const int64_t n_items = static_cast<int64_t>(kv.n_kv_heads) * plan.n_tiles;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    const int kvh = static_cast<int>(item / plan.n_tiles);
    const int64_t k0 = (item % plan.n_tiles) * kKeyTile;
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kv.n_tokens - k0));
    pack_transposed(kv.k + (kvh * kv.capacity + k0) * dim, nk, dim, kt + item * dim * kKeyTile,
                    kKeyTile);
  }
}

// The keys transposed per tile when the plan takes the GEMM path (else null), in a buffer of
// the calling thread reused across calls (layers, decode steps); workers reach it through the
// pointer, not by name (thread_local).
const float* packed_keys(const DenseKv& kv, const ScorePlan& plan, int threads) {
  if (!plan.packed) return nullptr;
  static thread_local std::vector<float> kt_buffer;
  kt_buffer.resize(kv.n_kv_heads * key_tiles_floats(kv, plan));
  pack_key_tiles(kv, plan, threads, kt_buffer.data());
  return kt_buffer.data();
}

}  // namespace

void attention_scores_cpu(const AttentionQuery& query, const DenseKv& kv, float* scores) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  if (query.n_queries <= 0 || kv.n_tokens <= 0) return;
  const int dim = kv.head_dim;
  const int64_t n = kv.n_tokens;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const ScorePlan plan = make_score_plan(query, kv, threads);
  const int group = plan.group;
  const float* kt = packed_keys(kv, plan, threads);
  const int64_t kt_head = key_tiles_floats(kv, plan);
  static thread_local std::vector<float> partial_buffer;
  // With one slab per KV head each work item owns its heads' rows of `scores`; otherwise the
  // slabs add into their own zeroed partial rows [item, group, n], summed in a fixed order.
  const int64_t n_items = static_cast<int64_t>(kv.n_kv_heads) * plan.slabs;
  if (plan.slabs > 1) partial_buffer.assign(n_items * group * n, 0.0f);
  float* partial = partial_buffer.data();

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    static thread_local ScoreScratch w;
    ensure(w, plan.q_block * group, dim, plan.ld);
    const int kvh = static_cast<int>(item / plan.slabs);
    const int slab = static_cast<int>(item % plan.slabs);
    float* acc = plan.slabs > 1 ? partial + item * group * n
                                : scores + static_cast<int64_t>(kvh) * group * n;
    const float* kt_kvh = plan.packed ? kt + kvh * kt_head : nullptr;
    for (int b = slab; b < plan.n_blocks; b += plan.slabs) {
      const int q0 = b * plan.q_block;
      const int q1 = std::min(query.n_queries, q0 + plan.q_block);
      score_block(query, kv, plan, kt_kvh, kvh, q0, q1, w, acc, n, 0);
    }
  }
  if (plan.slabs == 1) return;

#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t row = 0; row < static_cast<int64_t>(query.n_heads); ++row) {
    const int64_t kvh = row / group, g = row % group;
    float* dst = scores + row * n;
    for (int slab = 0; slab < plan.slabs; ++slab) {
      const float* src = partial + ((kvh * plan.slabs + slab) * group + g) * n;
      for (int64_t t = 0; t < n; ++t) dst[t] += src[t];
    }
  }
}

void attention_row_scores_cpu(const AttentionQuery& query, const DenseKv& kv, float* probs) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  const int64_t n = kv.n_tokens;
  std::fill(probs, probs + static_cast<int64_t>(query.n_queries) * query.n_heads * n, 0.0f);
  if (query.n_queries <= 0 || n <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const ScorePlan plan = make_score_plan(query, kv, threads);
  const float* kt = packed_keys(kv, plan, threads);
  const int64_t kt_head = key_tiles_floats(kv, plan);
  // Every row is written by the one block that holds it: no partial sums.
  const int64_t n_items = static_cast<int64_t>(kv.n_kv_heads) * plan.slabs;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    static thread_local ScoreScratch w;
    ensure(w, plan.q_block * plan.group, kv.head_dim, plan.ld);
    const int kvh = static_cast<int>(item / plan.slabs);
    const float* kt_kvh = kt ? kt + kvh * kt_head : nullptr;
    for (int b = static_cast<int>(item % plan.slabs); b < plan.n_blocks; b += plan.slabs) {
      const int q0 = b * plan.q_block;
      const int q1 = std::min(query.n_queries, q0 + plan.q_block);
      float* rows = probs + (static_cast<int64_t>(q0) * query.n_heads + kvh * plan.group) * n;
      score_block(query, kv, plan, kt_kvh, kvh, q0, q1, w, rows, n, query.n_heads * n);
    }
  }
}

std::vector<float> last_row_scores_cpu(const AttentionQuery& query, const DenseKv& kv) {
  std::vector<float> scores(static_cast<size_t>(query.n_heads) * kv.n_tokens, 0.f);
  attention_scores_cpu(last_query_row(query, kv.head_dim), kv, scores.data());
  return scores;
}

void attention_scores_reference(const AttentionQuery& query, const DenseKv& kv, float* scores) {
  const int64_t n = kv.n_tokens;
  std::vector<double> acc(static_cast<size_t>(query.n_heads * n), 0.0);
  std::vector<double> logits(static_cast<size_t>(n));
  for (int i = 0; i < query.n_queries; ++i) {
    for (int h = 0; h < query.n_heads; ++h) {
      const double m = reference_logits(query, kv, i, h, logits.data());
      if (m == -std::numeric_limits<double>::infinity()) continue;  // sees no key
      double sum = 0.0;
      for (int64_t t = 0; t < n; ++t) sum += std::exp(logits[t] - m);  // exp(-inf) = 0
      for (int64_t t = 0; t < n; ++t) acc[h * n + t] += std::exp(logits[t] - m) / sum;
    }
  }
  for (size_t e = 0; e < acc.size(); ++e) scores[e] += static_cast<float>(acc[e]);
}

void key_norms_cpu(const DenseKv& kv, float* norms) {
  const int dim = kv.head_dim;
  const int64_t n_keys = static_cast<int64_t>(kv.n_kv_heads) * kv.n_tokens;
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < n_keys; ++e) {
    const int64_t h = e / kv.n_tokens, t = e % kv.n_tokens;
    const float* k = kv.k + (h * kv.capacity + t) * dim;
    norms[e] = std::sqrt(dot(k, k, dim));
  }
}

void key_anchor_cosine_cpu(const DenseKv& kv, float* cosine) {
  const int dim = kv.head_dim;
  const int64_t n = kv.n_tokens;
  if (n <= 0) return;
  // norms first (into `cosine`), then each head's anchor, then the cosines in place.
  key_norms_cpu(kv, cosine);
  std::vector<float> anchors(static_cast<size_t>(kv.n_kv_heads) * dim);
#pragma omp parallel for schedule(static)
  for (int h = 0; h < kv.n_kv_heads; ++h) {
    // Double sums: thousands of unit vectors would lose digits in fp32.
    std::vector<double> sum(dim, 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const float norm = cosine[h * n + t];
      if (norm == 0.0f) continue;  // a zero key has no direction: it adds nothing
      const float* k = kv.k + (h * kv.capacity + t) * dim;
      for (int d = 0; d < dim; ++d) sum[d] += k[d] / static_cast<double>(norm);
    }
    for (int d = 0; d < dim; ++d) anchors[h * dim + d] = static_cast<float>(sum[d] / n);
  }
  std::vector<float> anchor_norms(kv.n_kv_heads);
  for (int h = 0; h < kv.n_kv_heads; ++h) {
    const float* a = anchors.data() + h * dim;
    anchor_norms[h] = std::sqrt(dot(a, a, dim));
  }
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < kv.n_kv_heads * n; ++e) {
    const int64_t h = e / n, t = e % n;
    const float denom = cosine[e] * anchor_norms[h];
    const float* k = kv.k + (h * kv.capacity + t) * dim;
    cosine[e] = denom > 0.0f ? dot(k, anchors.data() + h * dim, dim) / denom : 0.0f;
  }
}

void pool1d_cpu(const float* in, float* out, int64_t rows, int64_t n, int32_t kernel,
                PoolKind kind) {
  assert(kernel > 0 && kernel % 2 == 1 && in != out);
  const int64_t half = kernel / 2;
  const float inv_kernel = 1.0f / static_cast<float>(kernel);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * n;
    float* y = out + r * n;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t lo = std::max<int64_t>(0, j - half), hi = std::min(n, j + half + 1);
      if (kind == PoolKind::Max) {
        y[j] = *std::max_element(x + lo, x + hi);
      } else {
        y[j] = std::accumulate(x + lo, x + hi, 0.0f) * inv_kernel;  // padding counts as zeros
      }
    }
  }
}

void top_k_indices_cpu(const float* values, int64_t rows, int64_t n, int64_t k, int32_t* out) {
  assert(0 <= k && k <= n);
  if (k == 0) return;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = values + r * n;
    int32_t* dst = out + r * k;
    static thread_local std::vector<int32_t> order;
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    // Larger value first, ties to the lower index; NaN ranks below every number, so the
    // order stays strict and weak whatever the input.
    const auto before = [v](int32_t a, int32_t b) {
      const bool nan_a = std::isnan(v[a]), nan_b = std::isnan(v[b]);
      if (nan_a != nan_b) return nan_b;
      if (!nan_a && v[a] != v[b]) return v[a] > v[b];
      return a < b;
    };
    if (k < n) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
    std::copy(order.begin(), order.begin() + k, dst);
    std::sort(dst, dst + k);
  }
}

void gemm_cpu(int rows, int kdim, int ncols, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc) {
  tile::gemm(rows, kdim, ncols, a, lda, b, ldb, c, ldc, false);
}

void nearest_columns_cpu(const float* a, int64_t rows, int kdim, const float* b, int64_t ncols,
                         int64_t* best, float* best_dot) {
  constexpr int64_t kRows = 256;  // rows per block: kRows x ncols products at once
  const int64_t n_blocks = (rows + kRows - 1) / kRows;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t block = 0; block < n_blocks; ++block) {
    static thread_local std::vector<float> dots;
    const int64_t r0 = block * kRows;
    const int n = static_cast<int>(std::min(kRows, rows - r0));
    dots.resize(static_cast<size_t>(n * ncols));
    tile::gemm(n, kdim, static_cast<int>(ncols), a + r0 * kdim, kdim, b, ncols, dots.data(),
               ncols, false);
    for (int r = 0; r < n; ++r) {
      const float* row = dots.data() + r * ncols;
      // The vector max, then its first column: std::max_element's answer, without its
      // serial compare chain.
      const float top = tile::row_max(row, static_cast<int>(ncols));
      int64_t j = 0;
      while (j < ncols && !(row[j] == top)) ++j;
      if (j == ncols) j = std::max_element(row, row + ncols) - row;  // NaN products
      best[r0 + r] = j;
      best_dot[r0 + r] = row[j];
    }
  }
}

}  // namespace kvbench
