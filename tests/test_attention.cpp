// attention_dense_cpu against the double-precision reference over odd sizes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"

namespace {

using kvbench::attention_dense_cpu;
using kvbench::attention_dense_reference;
using kvbench::AttentionQuery;
using kvbench::DenseKv;

struct Case {
  int n_heads, n_kv_heads, head_dim;
  int64_t n_tokens;
  int n_queries;
  bool shuffled = false;  // stored positions not in ascending order (after eviction/merging)
};

// Random KV with gaps in positions starting above 0, capacity > n_tokens (the slack filled
// with NaN so any read past n_tokens shows), and queries whose positions spread over the key
// range: early queries see only a prefix of the keys, the last one sees all of them.
struct Problem {
  std::vector<float> k, v, q;
  std::vector<int32_t> positions, q_positions;
  DenseKv kv{};
  AttentionQuery query{};

  explicit Problem(const Case& c, uint32_t seed = 1) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
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
    positions.resize(c.n_tokens);
    int32_t p = 5;
    for (auto& pos : positions) {
      pos = p;
      p += 1 + static_cast<int32_t>(rng() % 3);  // gaps of 0..2 evicted tokens
    }
    if (c.shuffled) std::shuffle(positions.begin(), positions.end(), rng);
    const int32_t lo = 5, hi = p - 1;
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
float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    worst = std::isnan(d) ? std::numeric_limits<float>::infinity() : std::max(worst, d);
  }
  return worst;
}

}  // namespace

TEST_CASE("attention_dense_cpu matches the reference over odd sizes", "[unit]") {
  // 2e-5 absolute: outputs are convex combinations of values in [-1, 1]; the kernel uses fp32
  // dot products, an online softmax and an exp2 polynomial (rel. error 1e-7) against a
  // double-accumulated two-pass reference, so its error stays at a few fp32 ulps of 1.
  const float tol = 2e-5f;
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{4, 4}, std::pair{8, 1}}) {
      for (int64_t n_tokens : {1, 15, 17, 4097}) {
        for (int n_queries : {1, 7, 64}) {
          Case c{n_heads, n_kv_heads, head_dim, n_tokens, n_queries};
          Problem p(c);
          const auto expected = p.run(attention_dense_reference);
          const auto got = p.run(attention_dense_cpu);
          INFO("head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads << " tokens "
                           << n_tokens << " queries " << n_queries);
          CHECK(max_abs_diff(got, expected) <= tol);
        }
      }
    }
  }
}

TEST_CASE("attention_dense_cpu handles unsorted stored positions", "[unit]") {
  // 2e-5 absolute, as above: masking by position must not rely on ascending order.
  for (int64_t n_tokens : {17, 1000, 4097}) {
    for (int n_queries : {1, 7, 64}) {
      Problem p(Case{9, 3, 64, n_tokens, n_queries, true}, 7);
      INFO("tokens " << n_tokens << " queries " << n_queries);
      CHECK(max_abs_diff(p.run(attention_dense_cpu), p.run(attention_dense_reference)) <= 2e-5f);
    }
  }
}

TEST_CASE("attention_dense_cpu: a decode query sees every stored key", "[unit]") {
  // Decode shape (split-K path): query position past all keys; 0 keys gives zeros. 2e-5
  // absolute as above.
  for (int64_t n_tokens : {0, 1, 513, 4097, 9000}) {
    Problem p(Case{9, 3, 64, n_tokens, 1}, 3);
    p.q_positions[0] = std::numeric_limits<int32_t>::max();
    INFO("tokens " << n_tokens);
    CHECK(max_abs_diff(p.run(attention_dense_cpu), p.run(attention_dense_reference)) <= 2e-5f);
  }
}

TEST_CASE("attention_dense_cpu: a query that sees no key outputs zeros", "[unit]") {
  // Exact: no key is visible, so both give 0 by convention, whatever the split.
  for (int64_t n_tokens : {15, 4097}) {
    Problem p(Case{4, 4, 128, n_tokens, 7}, 5);
    p.q_positions[0] = 4;  // stored positions start at 5
    const auto got = p.run(attention_dense_cpu);
    const auto expected = p.run(attention_dense_reference);
    for (int e = 0; e < 4 * 128; ++e) {
      REQUIRE(got[e] == 0.0f);
      REQUIRE(expected[e] == 0.0f);
    }
    CHECK(max_abs_diff(got, expected) <= 2e-5f);
  }
}

TEST_CASE("attention_dense_cpu: one key gives that key's value exactly", "[unit]") {
  // 1e-6 absolute: softmax over a single key is exactly 1, so out = v up to one rounding.
  Problem p(Case{8, 1, 64, 1, 1}, 9);
  const auto got = p.run(attention_dense_cpu);
  for (int h = 0; h < 8; ++h) {
    for (int d = 0; d < 64; ++d) CHECK(std::fabs(got[h * 64 + d] - p.v[d]) <= 1e-6f);
  }
}
