// A random attention problem shared by the CPU and CUDA attention tests: dense KV with
// gapped (optionally shuffled) positions, NaN-filled slack past n_tokens, and queries whose
// positions spread over the key range.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/layouts.h"
#include "random_floats.h"

namespace kvbench::testing {

struct Case {
  int n_heads, n_kv_heads, head_dim;
  int64_t n_tokens;
  int n_queries;
  bool shuffled = false;  // stored positions not in ascending order (after eviction/merging)
};

// Random KV with gaps in positions starting above 0, capacity > n_tokens (the slack filled
// with NaN so any read past n_tokens shows), and queries whose positions spread over the key
// range: early queries see only a prefix of the keys, the last one sees all of them.
struct AttentionProblem {
  std::vector<float> k, v, q;
  std::vector<int32_t> positions, q_positions;
  DenseKv kv{};
  AttentionQuery query{};

  explicit AttentionProblem(const Case& c, uint32_t seed = 1) {
    std::mt19937 rng(seed);
    const testing::UniformFloat uni{-1.0f, 1.0f};
    const int64_t capacity = c.n_tokens + 13;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    k.assign(static_cast<size_t>(c.n_kv_heads * capacity * c.head_dim), nan);
    v.assign(k.size(), nan);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        for (int d = 0; d < c.head_dim; ++d) {
          k[(h * capacity + t) * c.head_dim + d] = uni(rng);
          v[(h * capacity + t) * c.head_dim + d] = uni(rng);
        }
      }
    }
    // Each KV head keeps its own tokens (per-head eviction): its own gaps and order. Slack
    // positions are -1, visible to every query, so a read past n_tokens would bring in NaN.
    positions.assign(static_cast<size_t>(c.n_kv_heads * capacity), -1);
    int32_t hi = 5;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      int32_t* head = positions.data() + h * capacity;
      int32_t p = 5;
      for (int64_t t = 0; t < c.n_tokens; ++t) {
        head[t] = p;
        p += 1 + static_cast<int32_t>(rng() % 3);  // gaps of 0..2 evicted tokens
      }
      if (c.shuffled) std::shuffle(head, head + c.n_tokens, rng);
      hi = std::max(hi, p - 1);
    }
    const int32_t lo = 5;
    q_positions.resize(c.n_queries);
    for (int i = 0; i < c.n_queries; ++i) {
      q_positions[i] = lo + static_cast<int32_t>(int64_t{hi - lo} * (i + 1) / c.n_queries);
    }
    // Scores of a few units so the softmax is far from uniform.
    q.resize(static_cast<size_t>(c.n_queries) * c.n_heads * c.head_dim);
    for (auto& x : q) x = 3.0f * uni(rng);
    kv = DenseKv{k.data(),   v.data(), positions.data(), c.n_kv_heads,
                 c.head_dim, capacity, c.n_tokens};
    query = AttentionQuery{q.data(),  q_positions.data(),
                           nullptr,   c.n_queries,
                           c.n_heads, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  }

  std::vector<float> run(void (*fn)(const AttentionQuery&, const DenseKv&)) {
    std::vector<float> out(q.size(), 123.0f);
    AttentionQuery qq = query;
    qq.out = out.data();
    fn(qq, kv);
    return out;
  }
};

// Largest |a - b| over all outputs; a NaN anywhere counts as infinitely far.
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    worst = std::isnan(d) ? std::numeric_limits<float>::infinity() : std::max(worst, d);
  }
  return worst;
}

}  // namespace kvbench::testing
