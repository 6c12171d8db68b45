#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/tile_gemm.h"

namespace kvbench {
namespace {

using namespace tile;

constexpr int kTileRows = 192;      // target query rows (query x head) per work item
constexpr int kMinSplitKeys = 512;  // split-K never makes a split shorter than this

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
  const QueryRange queries = gather_query_rows(query, kvh, group, dim, q0, q1, query.scale * kLog2e,
                                               w.q.data(), w.qpos.data());
  std::fill(w.o.begin(), w.o.begin() + static_cast<int64_t>(rows) * dim, 0.0f);
  std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);

  const float* k_head = kv.k + static_cast<int64_t>(kvh) * kv.capacity * dim;
  const float* v_head = kv.v + static_cast<int64_t>(kvh) * kv.capacity * dim;
  for (int64_t k0 = t0; k0 < t1; k0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, t1 - k0));
    const int32_t* pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity + k0;
    const TileMask mask = tile_mask(pos, nk, queries);
    if (mask == TileMask::Skip) continue;
    const int ld = (nk + kNr - 1) / kNr * kNr;
    if (rows <= kDirectRows) {
      scores_direct(rows, dim, w.q.data(), k_head + k0 * dim, nk, w.s.data(), ld);
    } else {
      pack_transposed(k_head + k0 * dim, nk, dim, w.kt.data(), ld);
      gemm(rows, dim, ld, w.q.data(), dim, w.kt.data(), ld, w.s.data(), ld, false);
    }
    for (int r = 0; r < rows; ++r) {
      float* srow = w.s.data() + static_cast<int64_t>(r) * ld;
      if (mask == TileMask::Partial) mask_after(srow, pos, nk, w.qpos[r]);
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
      const int kvh = h / group;
      const int32_t* head_pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity;
      const double m = reference_logits(query, kv, i, h, scores.data());
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
