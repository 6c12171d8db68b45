// Keys, values and positions of one layer held per KV head in fp32, in DenseKv's layout
// ([n_kv_heads, capacity, head_dim]): the dense store's storage and KIVI's fp32 tail.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

struct HeadRows {
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t capacity = 0;            // rows per head the buffers hold
  int64_t n_tokens = 0;            // rows per head in use
  std::vector<float> k, v;         // [n_kv_heads, capacity, head_dim]
  std::vector<int32_t> positions;  // [n_kv_heads, capacity]

  HeadRows(int32_t n_kv_heads_, int32_t head_dim_) : n_kv_heads(n_kv_heads_), head_dim(head_dim_) {}

  // Moves the rows into buffers of exactly `capacity` (>= n_tokens) rows per head, so
  // shrinking really returns the memory.
  void reallocate(int64_t new_capacity);
  // Appends n_new tokens in the projection layout (k, v: [n_new, src_heads, head_dim]), this
  // store's heads taken from source heads first_head.. (a ragged layer holds each KV head in
  // a HeadRows of its own); the room must be there (capacity >= n_tokens + n_new).
  void append(const float* new_k, const float* new_v, const int32_t* new_positions, int64_t n_new,
              int32_t first_head = 0, int32_t src_heads = 0);
  DenseKv view() const {
    return DenseKv{k.data(), v.data(), positions.data(), n_kv_heads, head_dim, capacity, n_tokens};
  }
  int64_t bytes() const;  // what the buffers hold
};

}  // namespace kvbench
