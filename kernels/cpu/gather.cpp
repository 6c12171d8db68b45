#include "kernels/cpu/gather.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvbench {

DenseKv gather_rows_cpu(const DenseKv& kv, const int32_t* slots, int64_t n_keep,
                        const GatherTarget& out) {
  if (n_keep < 0 || out.capacity < n_keep) {
    throw std::invalid_argument("gather_rows_cpu: n_keep (" + std::to_string(n_keep) +
                                ") must be in [0, out.capacity = " +
                                std::to_string(out.capacity) + "]");
  }
  const int64_t n_slots = static_cast<int64_t>(kv.n_kv_heads) * n_keep;
  for (int64_t e = 0; e < n_slots; ++e) {
    if (slots[e] < 0 || slots[e] >= kv.n_tokens) {
      throw std::invalid_argument("gather_rows_cpu: slot " + std::to_string(slots[e]) +
                                  " outside [0, " + std::to_string(kv.n_tokens) + ")");
    }
  }
  const int64_t dim = kv.head_dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for (int64_t h = 0; h < kv.n_kv_heads; ++h) {
    for (int64_t j = 0; j < n_keep; ++j) {
      const int64_t from = h * kv.capacity + slots[h * n_keep + j];
      const int64_t to = h * out.capacity + j;
      std::memcpy(out.k + to * dim, kv.k + from * dim, row_bytes);
      std::memcpy(out.v + to * dim, kv.v + from * dim, row_bytes);
      out.positions[to] = kv.positions[from];
    }
  }
  return DenseKv{out.k, out.v, out.positions, kv.n_kv_heads, kv.head_dim, out.capacity, n_keep};
}

void move_rows_cpu(const GatherTarget& rows, int32_t n_kv_heads, int32_t head_dim,
                   const int64_t* from, const int64_t* to, int64_t n_moves) {
  if (n_moves < 0) {
    throw std::invalid_argument("move_rows_cpu: n_moves (" + std::to_string(n_moves) +
                                ") must be >= 0");
  }
  const int64_t n_rows = static_cast<int64_t>(std::max(n_kv_heads, 0)) * rows.capacity;
  for (const int64_t* list : {from, to}) {
    for (int64_t i = 0; i < n_moves; ++i) {
      if (list[i] < 0 || list[i] >= n_rows) {
        throw std::invalid_argument("move_rows_cpu: row " + std::to_string(list[i]) +
                                    " outside [0, " + std::to_string(n_rows) + ")");
      }
    }
  }
  // A row both read and written, or written twice, would race on the device (its moves run
  // at once).
  std::vector<int64_t> sources(from, from + n_moves), targets(to, to + n_moves);
  std::sort(sources.begin(), sources.end());
  std::sort(targets.begin(), targets.end());
  const auto twice = std::adjacent_find(targets.begin(), targets.end());
  if (twice != targets.end()) {
    throw std::invalid_argument("move_rows_cpu: row " + std::to_string(*twice) +
                                " is written twice");
  }
  std::vector<int64_t> both;
  std::set_intersection(sources.begin(), sources.end(), targets.begin(), targets.end(),
                        std::back_inserter(both));
  if (!both.empty()) {
    throw std::invalid_argument("move_rows_cpu: row " + std::to_string(both.front()) +
                                " is both moved and written");
  }
  const size_t row_bytes = static_cast<size_t>(std::max(head_dim, 0)) * sizeof(float);
  for (int64_t i = 0; i < n_moves; ++i) {
    std::memcpy(rows.k + to[i] * head_dim, rows.k + from[i] * head_dim, row_bytes);
    std::memcpy(rows.v + to[i] * head_dim, rows.v + from[i] * head_dim, row_bytes);
    rows.positions[to[i]] = rows.positions[from[i]];
  }
}

}  // namespace kvbench
