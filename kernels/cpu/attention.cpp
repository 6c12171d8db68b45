#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/narrow.h"
#include "kernels/cpu/scores.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/sparse_pairs.h"

namespace kvbench {
namespace {

using namespace tile;

constexpr int kTileRows = 192;          // target query rows (query x head) per work item
constexpr int kMinSplitKeys = 512;      // split-K never makes a split shorter than this
constexpr int kMinPageSplitKeys = 256;  // nor, over selected pages, shorter than this

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
  std::vector<float> kg, vg;  // [kKeyTile, head_dim] keys and values of one gathered tile
  std::vector<int32_t> pos;   // [kKeyTile] its positions
  std::vector<uint8_t> keep;  // [rows, kKeyTile] 1 where a sparse pattern reads the key
};

// A scored work item's softmax numerators, kept tile by tile so that the attention each key
// received can be summed once the rows' final max and denominator are known
// (attention_dense_scored_cpu): numerators [rows, ld] at the tile's columns, and the running
// max each tile's numerators were taken against, [rows, n_tiles] (-inf: the row read none of
// the tile).
struct TileTrace {
  std::vector<float> e, max;
  int64_t ld = 0;
  int n_tiles = 0;

  void begin(int rows, int64_t n_tokens) {
    n_tiles = static_cast<int>((n_tokens + kKeyTile - 1) / kKeyTile);
    ld = static_cast<int64_t>(n_tiles) * kKeyTile;
    if (e.size() < static_cast<size_t>(rows * ld)) e.resize(rows * ld);
    max.assign(static_cast<size_t>(rows) * n_tiles, kNegInf);
  }
};

struct Plan {
  int group;   // query heads per KV head
  int q_tile;  // queries per work item
  int n_q_tiles;
  int n_splits;       // key ranges per (kv head, query tile); > 1 only for few queries
  int64_t split_len;  // stored tokens per split (dense), selected pages per split (paged)
  int rows;           // q_tile * group
};

// Gathers the rows of query tile [q0, q1) for KV head kvh and clears their o, m, l.
QueryRange begin_rows(const AttentionQuery& query, const DenseKv& kv, const Plan& plan, int kvh,
                      int q0, int q1, Scratch& w) {
  const int dim = kv.head_dim;
  const int rows = (q1 - q0) * plan.group;
  const QueryRange queries = gather_query_rows(query, kvh, plan.group, dim, q0, q1,
                                               query.scale * kLog2e, w.q.data(), w.qpos.data());
  std::fill(w.o.begin(), w.o.begin() + static_cast<int64_t>(rows) * dim, 0.0f);
  std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);
  return queries;
}

// Folds one key tile, nk <= kKeyTile consecutive rows of keys k, values v and positions pos,
// into the online softmax of the rows gathered by begin_rows. keep (a sparse pattern's
// [rows, nk], nullptr for all) masks the keys a row does not read, after the causal mask.
// trace (nullptr: none) keeps the tile's numerators as key tile `tile` of the item.
void attend_keys(int dim, int rows, QueryRange queries, const float* k, const float* v,
                 const int32_t* pos, int nk, Scratch& w, const uint8_t* keep = nullptr,
                 TileTrace* trace = nullptr, int tile = 0) {
  const TileMask mask = tile_mask(pos, nk, queries);
  if (mask == TileMask::Skip) return;
  const int ld = (nk + kNr - 1) / kNr * kNr;
  if (rows <= kDirectRows) {
    scores_direct(rows, dim, w.q.data(), k, nk, w.s.data(), ld);
  } else {
    pack_transposed(k, nk, dim, w.kt.data(), ld);
    gemm(rows, dim, ld, w.q.data(), dim, w.kt.data(), ld, w.s.data(), ld, false);
  }
  for (int r = 0; r < rows; ++r) {
    float* srow = w.s.data() + static_cast<int64_t>(r) * ld;
    if (mask == TileMask::Partial) mask_after(srow, pos, nk, w.qpos[r]);
    if (keep) {
      const uint8_t* row_keep = keep + static_cast<int64_t>(r) * nk;
      for (int j = 0; j < nk; ++j) {
        if (!row_keep[j]) srow[j] = kNegInf;
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
  if (trace) {
    for (int r = 0; r < rows; ++r) {
      std::copy_n(w.s.data() + static_cast<int64_t>(r) * ld, nk,
                  trace->e.data() + r * trace->ld + static_cast<int64_t>(tile) * kKeyTile);
      trace->max[static_cast<int64_t>(r) * trace->n_tiles + tile] = w.m[r];
    }
  }
  gemm(rows, nk, dim, w.s.data(), ld, v, dim, w.o.data(), dim, true);
}

// One dense work item: query tile [q0, q1) of KV head kvh over stored tokens [t0, t1).
// Leaves unnormalised o, m, l for rows (query, head-in-group) in the scratch buffers.
// trace (nullptr: none) keeps every tile's numerators, tiles counted from t0.
void attend_tile(const AttentionQuery& query, const DenseKv& kv, const Plan& plan, int kvh, int q0,
                 int q1, int64_t t0, int64_t t1, Scratch& w, TileTrace* trace = nullptr) {
  const int dim = kv.head_dim;
  const int rows = (q1 - q0) * plan.group;
  const QueryRange queries = begin_rows(query, kv, plan, kvh, q0, q1, w);
  // A one-head view is KV head kvh itself (attention_ragged_cpu's heads).
  const int64_t head = kv.n_kv_heads == 1 ? 0 : static_cast<int64_t>(kvh) * kv.capacity;
  const float* k_head = kv.k + head * dim;
  const float* v_head = kv.v + head * dim;
  const int32_t* pos_head = kv.positions + head;
  for (int64_t k0 = t0; k0 < t1; k0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, t1 - k0));
    attend_keys(dim, rows, queries, k_head + k0 * dim, v_head + k0 * dim, pos_head + k0, nk, w,
                nullptr, trace, static_cast<int>((k0 - t0) / kKeyTile));
  }
}

// A run of consecutive stored slots [start, start + len) of one KV head.
struct Segment {
  int64_t start;
  int len;
};

// dst[0, n) = src[0, n), eight vectors loaded before any is stored. A plain copy (memmove) to
// a destination 4 to 28 bytes past its source modulo 4 KiB runs over ten times slower, every
// load stalled behind a store it seems to overlap (4K aliasing); where the gather buffers sit
// against the pages is up to the allocators.
void copy_floats(const float* src, int64_t n, float* dst) {
  int64_t i = 0;
#if KVBENCH_AVX2
  for (; i + 64 <= n; i += 64) {
    __m256 r[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + i + 8 * j);
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + i + 8 * j, r[j]);
  }
#endif
  std::copy(src + i, src + n, dst + i);
}

// Folds a key tile made of n_seg runs of KV head kvh: one run is read in place; several are
// first copied together (keys, values, positions), which also streams scattered pages from
// memory faster than the tile kernels' strided reads do.
void attend_runs(const DenseKv& kv, int kvh, int rows, QueryRange queries, const Segment* seg,
                 int n_seg, int nk, Scratch& w) {
  const int dim = kv.head_dim;
  const int64_t head = static_cast<int64_t>(kvh) * kv.capacity;
  if (n_seg == 1) {
    const int64_t t = head + seg[0].start;
    attend_keys(dim, rows, queries, kv.k + t * dim, kv.v + t * dim, kv.positions + t, nk, w);
    return;
  }
  for (int s = 0, j = 0; s < n_seg; j += seg[s].len, ++s) {
    const int64_t t = head + seg[s].start;
    std::copy_n(kv.positions + t, seg[s].len, w.pos.data() + j);
    copy_floats(kv.k + t * dim, seg[s].len * dim, w.kg.data() + static_cast<int64_t>(j) * dim);
    copy_floats(kv.v + t * dim, seg[s].len * dim, w.vg.data() + static_cast<int64_t>(j) * dim);
  }
  attend_keys(dim, rows, queries, w.kg.data(), w.vg.data(), w.pos.data(), nk, w);
}

// Folds a key tile made of n_seg runs of KV head kvh, decoded to fp32 into the gather
// buffers as they are read.
void attend_decoded_runs(const DecodeKvRows& decode, int dim, int kvh, int rows, QueryRange queries,
                         const Segment* seg, int n_seg, int nk, Scratch& w) {
  for (int s = 0, j = 0; s < n_seg; j += seg[s].len, ++s) {
    const int64_t at = static_cast<int64_t>(j) * dim;
    decode(kvh, seg[s].start, seg[s].len, w.kg.data() + at, w.vg.data() + at, w.pos.data() + j);
  }
  attend_keys(dim, rows, queries, w.kg.data(), w.vg.data(), w.pos.data(), nk, w);
}

// One paged work item: query tile [q0, q1) of KV head kvh over its selected pages i0..i1-1
// (indices into its row of pages.pages), in key tiles of up to kKeyTile slots; consecutive
// pages make one run, and fold(seg, n_seg, nk, rows, queries) attends each tile of runs.
template <class Fold>
void attend_pages(const AttentionQuery& query, const DenseKv& kv, const PageSelection& pages,
                  const Plan& plan, int kvh, int q0, int q1, int i0, int i1, Scratch& w,
                  const Fold& fold) {
  const int rows = (q1 - q0) * plan.group;
  const QueryRange queries = begin_rows(query, kv, plan, kvh, q0, q1, w);
  const int32_t* selected = pages.pages + static_cast<int64_t>(kvh) * pages.n_selected;
  Segment seg[kKeyTile];
  int n_seg = 0, nk = 0;
  for (int i = i0; i < i1; ++i) {
    int64_t a = static_cast<int64_t>(selected[i]) * pages.page_tokens;
    const int64_t b = std::min(a + pages.page_tokens, kv.n_tokens);
    assert(selected[i] >= 0 && a < kv.n_tokens);
    assert(i == 0 || selected[i] > selected[i - 1]);
    while (a < b) {
      const int take = static_cast<int>(std::min<int64_t>(b - a, kKeyTile - nk));
      if (n_seg > 0 && seg[n_seg - 1].start + seg[n_seg - 1].len == a) {
        seg[n_seg - 1].len += take;
      } else {
        seg[n_seg++] = Segment{a, take};
      }
      nk += take;
      a += take;
      if (nk == kKeyTile) {
        fold(seg, n_seg, nk, rows, queries);
        n_seg = nk = 0;
      }
    }
  }
  if (nk > 0) fold(seg, n_seg, nk, rows, queries);
}

// A sparse pattern's column and offset lists as one byte per (query head, position), so a
// key's test is a look-up: column[h * span + kp], offset[h * span + (qp - kp)]. span is one
// past the chunk's last query position: no visible key or offset reaches it.
struct PatternLookup {
  std::vector<uint8_t> column, offset;
  // Prefix counts of the same, [n_heads, span + 1]: a key tile's range is tested at once.
  std::vector<int32_t> column_count, offset_count;
  int64_t span = 0;
};

// Hits of head h's list in [lo, hi] (clamped to [0, span)).
int32_t hits_in(const std::vector<int32_t>& count, int64_t span, int h, int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, 0);
  hi = std::min<int64_t>(hi, span - 1);
  if (count.empty() || lo > hi) return 0;
  const int32_t* c = count.data() + h * (span + 1);
  return c[hi + 1] - c[lo];
}

PatternLookup make_lookup(const AttentionQuery& query, const SparsePattern& pattern) {
  PatternLookup lookup;
  int32_t last = 0;
  for (int i = 0; i < query.n_queries; ++i) last = std::max(last, query.q_positions[i]);
  lookup.span = static_cast<int64_t>(last) + 1;
  const auto fill = [&](const int32_t* list, int32_t n, std::vector<uint8_t>& hit,
                        std::vector<int32_t>& count) {
    if (n <= 0) return;
    hit.assign(static_cast<size_t>(query.n_heads * lookup.span), 0);
    count.assign(static_cast<size_t>(query.n_heads * (lookup.span + 1)), 0);
    for (int h = 0; h < query.n_heads; ++h) {
      for (int32_t j = 0; j < n; ++j) {
        const int32_t x = list[static_cast<int64_t>(h) * n + j];
        if (x >= 0 && x < lookup.span) hit[h * lookup.span + x] = 1;
      }
      for (int64_t x = 0; x < lookup.span; ++x) {
        count[h * (lookup.span + 1) + x + 1] =
            count[h * (lookup.span + 1) + x] + hit[h * lookup.span + x];
      }
    }
  };
  fill(pattern.columns, pattern.n_columns, lookup.column, lookup.column_count);
  fill(pattern.offsets, pattern.n_offsets, lookup.offset, lookup.offset_count);
  return lookup;
}

// Whether query head h at position qp reads the key at position kp <= qp.
bool pattern_reads(const SparsePattern& pattern, const PatternLookup& lookup, int h, int32_t qp,
                   int32_t kp) {
  if (qp >= pattern.dense_from || kp < pattern.sink || qp - kp < pattern.local) return true;
  if (!lookup.column.empty() && lookup.column[h * lookup.span + kp]) return true;
  return !lookup.offset.empty() && lookup.offset[h * lookup.span + (qp - kp)];
}

// What a key tile (positions [kmin, kmax]) is to the rows of a query tile (positions
// queries, KV head kvh's group of query heads) under the pattern, by ranges alone: no
// visible pair read, every visible pair read, or some (tested key by key).
enum class TileRead { None, All, Some };

TileRead tile_read(const SparsePattern& pattern, const PatternLookup& lookup, int kvh, int group,
                   QueryRange queries, int32_t kmin, int32_t kmax) {
  // Visible pairs have 0 <= qp - kp <= queries.max - kmin.
  if (queries.min >= pattern.dense_from || kmax < pattern.sink ||
      static_cast<int64_t>(queries.max) - kmin < pattern.local) {
    return TileRead::All;
  }
  if (queries.max >= pattern.dense_from || kmin < pattern.sink ||
      static_cast<int64_t>(queries.min) - kmax < pattern.local) {
    return TileRead::Some;
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    if (hits_in(lookup.column_count, lookup.span, h, kmin, kmax) > 0 ||
        hits_in(lookup.offset_count, lookup.span, h, static_cast<int64_t>(queries.min) - kmax,
                static_cast<int64_t>(queries.max) - kmin) > 0) {
      return TileRead::Some;
    }
  }
  return TileRead::None;
}

// One sparse work item: attend_tile over the keys the pattern reads. A key tile is first
// tested by its position range (tile_read): one no row reads is skipped whole (it would add
// nothing), one every row reads whole is folded as the dense kernel folds it; the others
// are tested key by key and computed whole with the unread keys masked, as block-sparse
// kernels do.
void attend_sparse_tile(const AttentionQuery& query, const DenseKv& kv,
                        const SparsePattern& pattern, const PatternLookup& lookup,
                        const Plan& plan, int kvh, int q0, int q1, int64_t t0, int64_t t1,
                        Scratch& w) {
  const int dim = kv.head_dim;
  const int rows = (q1 - q0) * plan.group;
  const QueryRange queries = begin_rows(query, kv, plan, kvh, q0, q1, w);
  const int64_t head = static_cast<int64_t>(kvh) * kv.capacity;
  const float* k_head = kv.k + head * dim;
  const float* v_head = kv.v + head * dim;
  const int32_t* pos_head = kv.positions + head;
  for (int64_t k0 = t0; k0 < t1; k0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, t1 - k0));
    const int32_t* pos = pos_head + k0;
    const TileMask mask = tile_mask(pos, nk, queries);
    if (mask == TileMask::Skip) continue;
    const auto [kmin, kmax] = std::minmax_element(pos, pos + nk);
    const TileRead reads = tile_read(pattern, lookup, kvh, plan.group, queries, *kmin, *kmax);
    if (reads == TileRead::None) continue;
    if (reads == TileRead::All) {  // as the dense kernel folds it
      attend_keys(dim, rows, queries, k_head + k0 * dim, v_head + k0 * dim, pos, nk, w);
      continue;
    }
    bool any = false;
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * plan.group + r % plan.group;
      const int32_t qp = w.qpos[r];
      uint8_t* row_keep = w.keep.data() + static_cast<int64_t>(r) * nk;
      for (int j = 0; j < nk; ++j) {
        row_keep[j] = pos[j] <= qp && pattern_reads(pattern, lookup, h, qp, pos[j]);
        any = any || row_keep[j];
      }
    }
    if (!any) continue;
    attend_keys(dim, rows, queries, k_head + k0 * dim, v_head + k0 * dim, pos, nk, w,
                w.keep.data());
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
  if (w.kt.size() < static_cast<size_t>(dim) * kKeyTile) {
    w.kt.resize(static_cast<size_t>(dim) * kKeyTile);
    w.kg.resize(static_cast<size_t>(dim) * kKeyTile);
    w.vg.resize(static_cast<size_t>(dim) * kKeyTile);
    w.pos.resize(kKeyTile);
  }
  if (w.s.size() < static_cast<size_t>(rows) * kKeyTile)
    w.s.resize(static_cast<size_t>(rows) * kKeyTile);
  if (w.keep.size() < static_cast<size_t>(rows) * kKeyTile)
    w.keep.resize(static_cast<size_t>(rows) * kKeyTile);
  if (w.m.size() < static_cast<size_t>(rows)) {
    w.m.resize(rows);
    w.l.resize(rows);
    w.qpos.resize(rows);
  }
}

// Pages plan as the dense kernel, splitting each head's selected pages instead of its stored
// tokens. A split is shorter than the dense minimum: decode reads few keys, and 2 threads
// over 3 KV heads balance only when each head gives them several items.
Plan make_page_plan(const AttentionQuery& query, const DenseKv& kv, const PageSelection& pages,
                    int threads) {
  Plan p;
  p.group = query.n_heads / kv.n_kv_heads;
  p.q_tile = std::max(1, std::min<int>(query.n_queries, kTileRows / p.group));
  p.n_q_tiles = (query.n_queries + p.q_tile - 1) / p.q_tile;
  p.rows = p.q_tile * p.group;
  const int64_t selected_keys = static_cast<int64_t>(pages.n_selected) * pages.page_tokens;
  const int64_t items = static_cast<int64_t>(kv.n_kv_heads) * p.n_q_tiles;
  const int64_t want = 8LL * threads;
  int64_t splits = 1;
  if (items < want) {
    splits = std::min<int64_t>((want + items - 1) / items, selected_keys / kMinPageSplitKeys);
    splits = std::max<int64_t>(splits, 1);
  }
  // Whole key tiles per split where pages pack them exactly.
  const int64_t tile_pages = kKeyTile % pages.page_tokens == 0 ? kKeyTile / pages.page_tokens : 1;
  p.split_len = (pages.n_selected + splits - 1) / splits;
  p.split_len =
      std::max<int64_t>(tile_pages, (p.split_len + tile_pages - 1) / tile_pages * tile_pages);
  p.n_splits =
      static_cast<int>(std::max<int64_t>(1, (pages.n_selected + p.split_len - 1) / p.split_len));
  return p;
}

// Writes the normalised output rows of an unsplit work item (query tile [q0, q1) of KV head
// kvh) from its o and l.
void write_rows(const AttentionQuery& query, const Plan& plan, int dim, int kvh, int q0, int q1,
                const Scratch& w) {
  const int rows = (q1 - q0) * plan.group;
  for (int r = 0; r < rows; ++r) {
    const int i = q0 + r / plan.group;
    const int h = kvh * plan.group + r % plan.group;
    float* out = query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
    const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;  // no visible key: zeros
    const float* o = w.o.data() + static_cast<int64_t>(r) * dim;
    for (int d = 0; d < dim; ++d) out[d] = o[d] * inv;
  }
}

// Adds the attention each key received from an unsplit work item's rows (its trace, against
// the rows' final max and denominator in w) into received[g * n_tokens + t] for the row's
// head g within the group.
void add_received(const TileTrace& trace, const Scratch& w, int rows, int group, int64_t n_tokens,
                  float* received) {
  for (int r = 0; r < rows; ++r) {
    if (!(w.l[r] > 0.0f)) continue;  // the row sees no key
    const float inv = 1.0f / w.l[r];
    float* col = received + (r % group) * n_tokens;
    const float* e = trace.e.data() + r * trace.ld;
    const float* tile_max = trace.max.data() + static_cast<int64_t>(r) * trace.n_tiles;
    for (int tile = 0; tile < trace.n_tiles; ++tile) {
      if (tile_max[tile] == kNegInf) continue;
      // Numerators were taken against the running max then: rescale to the final one.
      const float f = std::exp2(tile_max[tile] - w.m[r]) * inv;
      const int64_t k0 = static_cast<int64_t>(tile) * kKeyTile;
      const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, n_tokens - k0));
      for (int j = 0; j < nk; ++j) col[k0 + j] += e[k0 + j] * f;
    }
  }
}

// Runs every work item (KV head, query tile, split) of the plan over the threads and writes
// query.out. attend(kvh, q0, q1, split, w) leaves the item's unnormalised o, m, l in w; the
// splits of a row are then merged.
template <class Attend>
void run_items(const AttentionQuery& query, const DenseKv& kv, const Plan& plan, int threads,
               const Attend& attend) {
  const int dim = kv.head_dim;
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
    attend(kvh, q0, q1, split, w);
    const int rows = (q1 - q0) * plan.group;
    if (plan.n_splits == 1) {
      write_rows(query, plan, dim, kvh, q0, q1, w);
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
    merge_split_partials(first, plan.n_splits, part_stride, dim,
                         query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim);
  }
}

}  // namespace

void attention_dense_cpu(const AttentionQuery& query, const DenseKv& kv) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  if (query.n_queries <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const Plan plan = make_plan(query, kv, threads);
  run_items(query, kv, plan, threads, [&](int kvh, int q0, int q1, int split, Scratch& w) {
    const int64_t t0 = split * plan.split_len;
    const int64_t t1 = std::min(kv.n_tokens, t0 + plan.split_len);
    attend_tile(query, kv, plan, kvh, q0, q1, t0, t1, w);
  });
}

void attention_dense_scored_cpu(const AttentionQuery& query, const DenseKv& kv, float* scores) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  if (query.n_queries <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const Plan plan = make_plan(query, kv, threads);
  if (plan.n_splits > 1 || kv.n_tokens == 0) {  // few queries (decode): a second pass is cheap
    attention_dense_cpu(query, kv);
    attention_scores_cpu(query, kv, scores);
    return;
  }
  // The dense kernel's plan, items and order (bit for bit its output); each item adds what
  // its rows gave into rows of its own, summed in a fixed order after.
  const int dim = kv.head_dim;
  const int group = plan.group;
  const int64_t n = kv.n_tokens;
  const int64_t n_items = static_cast<int64_t>(kv.n_kv_heads) * plan.n_q_tiles;
  // The calling thread's buffer, reused across calls; workers reach it through the pointer,
  // not by name (thread_local).
  static thread_local std::vector<float> received_buffer;
  received_buffer.assign(static_cast<size_t>(n_items * group * n), 0.0f);
  float* received = received_buffer.data();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    static thread_local Scratch w;
    static thread_local TileTrace trace;
    ensure(w, plan.rows, dim);
    const int kvh = static_cast<int>(item % kv.n_kv_heads);
    const int tile = plan.n_q_tiles - 1 - static_cast<int>(item / kv.n_kv_heads);
    const int q0 = tile * plan.q_tile;
    const int q1 = std::min(query.n_queries, q0 + plan.q_tile);
    const int rows = (q1 - q0) * group;
    trace.begin(rows, n);
    attend_tile(query, kv, plan, kvh, q0, q1, 0, n, w, &trace);
    write_rows(query, plan, dim, kvh, q0, q1, w);
    add_received(trace, w, rows, group, n, received + item * group * n);
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t h = 0; h < query.n_heads; ++h) {
    const int64_t kvh = h / group, g = h % group;
    float* dst = scores + h * n;
    for (int64_t item = kvh; item < n_items; item += kv.n_kv_heads) {
      const float* src = received + (item * group + g) * n;
      for (int64_t t = 0; t < n; ++t) dst[t] += src[t];
    }
  }
}

AttentionPairs attention_sparse_cpu(const AttentionQuery& query, const DenseKv& kv,
                                    const SparsePattern& pattern) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  AttentionPairs total;
  if (query.n_queries <= 0) return total;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // The dense kernel's plan and work items, so a pattern that reads every key folds the same
  // tiles in the same order: bit for bit attention_dense_cpu.
  const Plan plan = make_plan(query, kv, threads);
  const PatternLookup lookup = make_lookup(query, pattern);
  run_items(query, kv, plan, threads, [&](int kvh, int q0, int q1, int split, Scratch& w) {
    const int64_t t0 = split * plan.split_len;
    const int64_t t1 = std::min(kv.n_tokens, t0 + plan.split_len);
    attend_sparse_tile(query, kv, pattern, lookup, plan, kvh, q0, q1, t0, t1, w);
  });
  // Counted from positions, as attention_sparse_cuda counts: exactly the pairs folded above
  // (a whole tile read counts its visible pairs, a masked one the keys kept).
  return count_sparse_pairs(query.q_positions, query.n_queries, query.n_heads, kv.positions,
                            kv.n_kv_heads, kv.capacity, kv.n_tokens, pattern);
}

void attention_ragged_cpu(const AttentionQuery& query, const DenseKv* heads, int32_t n_kv_heads) {
  assert(n_kv_heads > 0 && query.n_heads % n_kv_heads == 0);
  if (query.n_queries <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // The layer's shape for the plan: work items per head, splits over the longest head.
  DenseKv shape{nullptr, nullptr, nullptr, n_kv_heads, heads[0].head_dim, 0, 0};
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    assert(heads[h].n_kv_heads == 1 && heads[h].head_dim == shape.head_dim);
    shape.n_tokens = std::max(shape.n_tokens, heads[h].n_tokens);
  }
  const Plan plan = make_plan(query, shape, threads);
  run_items(query, shape, plan, threads, [&](int kvh, int q0, int q1, int split, Scratch& w) {
    const int64_t t0 = split * plan.split_len;
    const int64_t t1 = std::min(heads[kvh].n_tokens, t0 + plan.split_len);
    attend_tile(query, heads[kvh], plan, kvh, q0, q1, t0, t1, w);
  });
}

void attention_pages_cpu(const AttentionQuery& query, const DenseKv& kv,
                         const PageSelection& pages) {
  assert(query.n_heads % kv.n_kv_heads == 0);
  assert(pages.page_tokens > 0 && pages.n_selected >= 0);
  if (query.n_queries <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const Plan plan = make_page_plan(query, kv, pages, threads);
  run_items(query, kv, plan, threads, [&](int kvh, int q0, int q1, int split, Scratch& w) {
    const int i0 = static_cast<int>(split * plan.split_len);
    const int i1 = static_cast<int>(std::min<int64_t>(pages.n_selected, i0 + plan.split_len));
    attend_pages(query, kv, pages, plan, kvh, q0, q1, i0, i1, w,
                 [&](const Segment* seg, int n_seg, int nk, int rows, QueryRange queries) {
                   attend_runs(kv, kvh, rows, queries, seg, n_seg, nk, w);
                 });
  });
}

void attention_narrow_cpu(const AttentionQuery& query, const NarrowKv& kv,
                          const PageSelection* pages) {
  const int64_t element_bytes = kv_element_bytes(kv.element);
  const int dim = kv.head_dim;
  attention_decoded_cpu(
      query, kv.n_kv_heads, dim, kv.n_tokens, pages,
      [&](int32_t kvh, int64_t start, int32_t n, float* k, float* v, int32_t* positions) {
        const int64_t t = static_cast<int64_t>(kvh) * kv.capacity + start;
        std::copy_n(kv.positions + t, n, positions);
        const int64_t offset = t * dim * element_bytes;
        decode_kv_rows(kv.element, static_cast<const uint8_t*>(kv.k) + offset,
                       kv.k_scale ? kv.k_scale + t : nullptr, n, dim, k);
        decode_kv_rows(kv.element, static_cast<const uint8_t*>(kv.v) + offset,
                       kv.v_scale ? kv.v_scale + t : nullptr, n, dim, v);
      });
}

void attention_decoded_cpu(const AttentionQuery& query, int32_t n_kv_heads, int32_t head_dim,
                           int64_t n_tokens, const PageSelection* pages,
                           const DecodeKvRows& decode) {
  assert(query.n_heads % n_kv_heads == 0);
  if (query.n_queries <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // The plans need only the shape; every tile reads its rows through `decode`.
  const DenseKv shape{nullptr, nullptr, nullptr, n_kv_heads, head_dim, 0, n_tokens};
  const auto fold = [&](int kvh, Scratch& w) {
    return [&, kvh](const Segment* seg, int n_seg, int nk, int rows, QueryRange queries) {
      attend_decoded_runs(decode, head_dim, kvh, rows, queries, seg, n_seg, nk, w);
    };
  };
  if (pages) {
    assert(pages->page_tokens > 0 && pages->n_selected >= 0);
    const Plan plan = make_page_plan(query, shape, *pages, threads);
    run_items(query, shape, plan, threads, [&](int kvh, int q0, int q1, int split, Scratch& w) {
      const int i0 = static_cast<int>(split * plan.split_len);
      const int i1 = static_cast<int>(std::min<int64_t>(pages->n_selected, i0 + plan.split_len));
      attend_pages(query, shape, *pages, plan, kvh, q0, q1, i0, i1, w, fold(kvh, w));
    });
    return;
  }
  const Plan plan = make_plan(query, shape, threads);
  run_items(query, shape, plan, threads, [&](int kvh, int q0, int q1, int split, Scratch& w) {
    const int64_t t0 = split * plan.split_len;
    const int64_t t1 = std::min(n_tokens, t0 + plan.split_len);
    const QueryRange queries = begin_rows(query, shape, plan, kvh, q0, q1, w);
    const int rows = (q1 - q0) * plan.group;
    for (int64_t k0 = t0; k0 < t1; k0 += kKeyTile) {
      const Segment seg{k0, static_cast<int>(std::min<int64_t>(kKeyTile, t1 - k0))};
      attend_decoded_runs(decode, head_dim, kvh, rows, queries, &seg, 1, seg.len, w);
    }
  });
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

void attention_pages_reference(const AttentionQuery& query, const DenseKv& kv,
                               const PageSelection& pages) {
  const int dim = kv.head_dim;
  const int group = query.n_heads / kv.n_kv_heads;
  std::vector<double> logits;
  std::vector<double> acc(dim);
  for (int i = 0; i < query.n_queries; ++i) {
    for (int h = 0; h < query.n_heads; ++h) {
      const int kvh = h / group;
      const int32_t* head_pos = kv.positions + static_cast<int64_t>(kvh) * kv.capacity;
      const float* q = query.q + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
      // The slots this row reads: its head's selected pages, visible by position.
      std::vector<int64_t> slots;
      for (int s = 0; s < pages.n_selected; ++s) {
        const int64_t page = pages.pages[static_cast<int64_t>(kvh) * pages.n_selected + s];
        const int64_t end = std::min(kv.n_tokens, (page + 1) * pages.page_tokens);
        for (int64_t t = page * pages.page_tokens; t < end; ++t) {
          if (head_pos[t] <= query.q_positions[i]) slots.push_back(t);
        }
      }
      logits.assign(slots.size(), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < slots.size(); ++j) {
        const float* k = kv.k + (kvh * kv.capacity + slots[j]) * dim;
        double dot = 0.0;
        for (int d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        logits[j] = dot * query.scale;
        m = std::max(m, logits[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      for (size_t j = 0; j < slots.size(); ++j) {
        const double p = std::exp(logits[j] - m);
        sum += p;
        const float* v = kv.v + (kvh * kv.capacity + slots[j]) * dim;
        for (int d = 0; d < dim; ++d) acc[d] += p * v[d];
      }
      float* out = query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim;
      for (int d = 0; d < dim; ++d) out[d] = sum > 0.0 ? static_cast<float>(acc[d] / sum) : 0.0f;
    }
  }
}

}  // namespace kvbench
