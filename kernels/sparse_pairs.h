// The query-key pairs of a sparse prefill (AttentionPairs), counted from positions alone: the
// one count attention_sparse_cpu and attention_sparse_cuda both return. Host code, header-only
// so the CPU kernels and the CUDA wrapper (compiled apart, linked apart) share it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

// Per query head: `dense` the stored keys each query row sees (position <= its own), `computed`
// those of them the pattern reads (SparsePattern's rule), summed over the rows and heads. Host
// pointers: q_positions [n_queries], key_positions [n_kv_heads, capacity] (n_tokens per head),
// and the pattern's lists. A key position appears in each of a query's ranges and lists once,
// however often it is listed. Cost: one pass over the keys per KV head, then per (query, head)
// the pattern's columns and offsets, not the keys.
inline AttentionPairs count_sparse_pairs(const int32_t* q_positions, int32_t n_queries,
                                         int32_t n_heads, const int32_t* key_positions,
                                         int32_t n_kv_heads, int64_t capacity, int64_t n_tokens,
                                         const SparsePattern& pattern) {
  AttentionPairs pairs;
  if (n_queries <= 0 || n_kv_heads <= 0) return pairs;
  int32_t last = 0;
  for (int32_t i = 0; i < n_queries; ++i) last = std::max(last, q_positions[i]);
  const int64_t span = static_cast<int64_t>(last) + 1;  // no visible key reaches it
  const int32_t group = n_heads / n_kv_heads;
  // The sorted, distinct entries of head h's list that can name a visible key.
  const auto distinct = [span](const int32_t* list, int32_t n, int32_t h) {
    std::vector<int64_t> out;
    for (int32_t j = 0; n > 0 && j < n; ++j) {
      const int32_t x = list[static_cast<int64_t>(h) * n + j];
      if (x >= 0 && x < span) out.push_back(x);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  };
  std::vector<int64_t> below(static_cast<size_t>(span) + 1);  // slots at positions < x
  std::vector<uint8_t> is_column(static_cast<size_t>(span));
  for (int32_t kvh = 0; kvh < n_kv_heads; ++kvh) {
    std::fill(below.begin(), below.end(), 0);
    const int32_t* pos = key_positions + static_cast<int64_t>(kvh) * capacity;
    for (int64_t t = 0; t < n_tokens; ++t) {
      if (pos[t] >= 0 && pos[t] < span) ++below[pos[t] + 1];
    }
    for (int64_t x = 0; x < span; ++x) below[x + 1] += below[x];
    const auto slots_in = [&](int64_t lo, int64_t hi) {  // slots at positions [lo, hi]
      lo = std::max<int64_t>(lo, 0);
      return lo > hi ? int64_t{0} : below[hi + 1] - below[lo];
    };
    for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const std::vector<int64_t> columns = distinct(pattern.columns, pattern.n_columns, h);
      const std::vector<int64_t> offsets = distinct(pattern.offsets, pattern.n_offsets, h);
      for (int64_t c : columns) is_column[c] = 1;
      for (int32_t i = 0; i < n_queries; ++i) {
        const int64_t qp = q_positions[i];
        const int64_t visible = slots_in(0, qp);
        pairs.dense += visible;
        if (qp >= pattern.dense_from) {
          pairs.computed += visible;
          continue;
        }
        // The sink [0, sink_end] and the window [window_begin, qp] (empty when local <= 0).
        const int64_t sink_end = std::min<int64_t>(pattern.sink, qp + 1) - 1;
        const int64_t window_begin = pattern.local > 0 ? qp - pattern.local + 1 : qp + 1;
        const auto in_ranges = [&](int64_t kp) { return kp <= sink_end || kp >= window_begin; };
        int64_t read = slots_in(0, sink_end) + slots_in(std::max(window_begin, sink_end + 1), qp);
        for (int64_t c : columns) {
          if (c <= qp && !in_ranges(c)) read += slots_in(c, c);
        }
        for (int64_t o : offsets) {
          const int64_t kp = qp - o;
          if (kp >= 0 && !in_ranges(kp) && !is_column[kp]) read += slots_in(kp, kp);
        }
        pairs.computed += read;
      }
      for (int64_t c : columns) is_column[c] = 0;
    }
  }
  return pairs;
}

}  // namespace kvbench
