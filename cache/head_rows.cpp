#include "cache/head_rows.h"

#include <cassert>
#include <cstring>

namespace kvbench {

void HeadRows::reallocate(int64_t new_capacity) {
  assert(new_capacity >= n_tokens);
  std::vector<float> new_k(static_cast<size_t>(n_kv_heads) * new_capacity * head_dim);
  std::vector<float> new_v(new_k.size());
  std::vector<int32_t> new_positions(static_cast<size_t>(n_kv_heads) * new_capacity);
  const size_t row_floats = static_cast<size_t>(n_tokens) * head_dim;
  for (int32_t h = 0; h < n_kv_heads && n_tokens > 0; ++h) {
    std::memcpy(new_k.data() + h * new_capacity * head_dim, k.data() + h * capacity * head_dim,
                row_floats * sizeof(float));
    std::memcpy(new_v.data() + h * new_capacity * head_dim, v.data() + h * capacity * head_dim,
                row_floats * sizeof(float));
    std::memcpy(new_positions.data() + h * new_capacity, positions.data() + h * capacity,
                n_tokens * sizeof(int32_t));
  }
  k.swap(new_k);
  v.swap(new_v);
  positions.swap(new_positions);
  capacity = new_capacity;
}

void HeadRows::append(const float* new_k, const float* new_v, const int32_t* new_positions,
                      int64_t n_new, int32_t first_head, int32_t src_heads) {
  assert(n_tokens + n_new <= capacity);
  if (src_heads == 0) src_heads = n_kv_heads;
  assert(first_head + n_kv_heads <= src_heads);
  for (int64_t t = 0; t < n_new; ++t) {
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      const size_t src = (static_cast<size_t>(t) * src_heads + first_head + h) * head_dim;
      const size_t slot = static_cast<size_t>(h) * capacity + n_tokens + t;
      std::memcpy(&k[slot * head_dim], new_k + src, head_dim * sizeof(float));
      std::memcpy(&v[slot * head_dim], new_v + src, head_dim * sizeof(float));
      positions[slot] = new_positions[t];
    }
  }
  n_tokens += n_new;
}

int64_t HeadRows::bytes() const {
  return static_cast<int64_t>(k.capacity() + v.capacity()) * sizeof(float) +
         static_cast<int64_t>(positions.capacity()) * sizeof(int32_t);
}

}  // namespace kvbench
