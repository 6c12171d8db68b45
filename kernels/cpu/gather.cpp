#include "kernels/cpu/gather.h"

#include <cstring>
#include <stdexcept>
#include <string>

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

}  // namespace kvbench
