// Feeding a cache by hand, as the model's forward pass does, for tests of cache methods
// without a model: random chunks of keys, values and queries, stored and attended in every
// layer.
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cache/kv_cache.h"
#include "random_floats.h"

namespace kvbench::testing {

// One forward's tokens: the same k/v/q in every layer.
struct Chunk {
  int64_t n = 0;
  std::vector<float> k, v;  // [n, n_kv_heads, head_dim]
  std::vector<float> q;     // [n, n_heads, head_dim]
};

inline Chunk random_chunk(int64_t n, const KvShape& shape, int32_t n_heads, std::mt19937& rng) {
  Chunk c;
  c.n = n;
  c.k.resize(n * shape.n_kv_heads * shape.head_dim);
  c.v.resize(c.k.size());
  c.q.resize(n * n_heads * shape.head_dim);
  for (float& x : c.k) x = standard_normal(rng);
  for (float& x : c.v) x = standard_normal(rng);
  for (float& x : c.q) x = standard_normal(rng);
  return c;
}

// The forward pass as the model runs it: every layer stores the chunk and attends, then
// the cache advances (and the policy plans). Returns the attention outputs of every layer,
// [n_layers, n, n_heads, head_dim].
inline std::vector<float> feed(KvCache& cache, int32_t n_heads, const Chunk& c) {
  const KvShape& shape = cache.shape();
  std::vector<int32_t> positions(c.n);
  std::iota(positions.begin(), positions.end(), cache.next_position());
  const int64_t per_layer = c.n * n_heads * shape.head_dim;
  std::vector<float> out(shape.n_layers * per_layer);
  const float scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    cache.append(l, c.k.data(), c.v.data(), positions.data(), c.n);
    cache.attend(l, AttentionQuery{c.q.data(), positions.data(), out.data() + l * per_layer,
                                   static_cast<int32_t>(c.n), n_heads, scale});
  }
  cache.advance(static_cast<int32_t>(c.n));
  return out;
}

// A shared context fed as feed() does, but each layer its own chunk (the same positions):
// per_layer[l] for layer l. Ends the context.
inline void feed_context_per_layer(KvCache& cache, int32_t n_heads,
                                   const std::vector<Chunk>& per_layer) {
  const int64_t n = per_layer[0].n;
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), cache.next_position());
  std::vector<float> out(n * n_heads * cache.shape().head_dim);
  const float scale = 1.f / std::sqrt(static_cast<float>(cache.shape().head_dim));
  for (int32_t l = 0; l < cache.shape().n_layers; ++l) {
    const Chunk& c = per_layer[l];
    cache.append(l, c.k.data(), c.v.data(), positions.data(), n);
    cache.attend(l, AttentionQuery{c.q.data(), positions.data(), out.data(),
                                   static_cast<int32_t>(n), n_heads, scale});
  }
  cache.advance(static_cast<int32_t>(n));
  cache.end_context();
}

// One decode step of a one-token chunk (what LlamaModel::decode does).
inline std::vector<float> decode_step(KvCache& cache, int32_t n_heads, const Chunk& c) {
  cache.mark_decode_step();
  return feed(cache, n_heads, c);
}

// Rows [from, from + n) of a chunk.
inline Chunk slice(const Chunk& c, int64_t from, int64_t n, const KvShape& shape,
                   int32_t n_heads) {
  const int64_t kv_row = shape.n_kv_heads * shape.head_dim, q_row = n_heads * shape.head_dim;
  Chunk s;
  s.n = n;
  s.k.assign(c.k.begin() + from * kv_row, c.k.begin() + (from + n) * kv_row);
  s.v.assign(c.v.begin() + from * kv_row, c.v.begin() + (from + n) * kv_row);
  s.q.assign(c.q.begin() + from * q_row, c.q.begin() + (from + n) * q_row);
  return s;
}

}  // namespace kvbench::testing
