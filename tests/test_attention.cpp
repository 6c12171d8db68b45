// attention_dense_cpu against the double-precision reference over odd sizes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "kernels/cpu/attention.h"

namespace {

using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::max_abs_diff;

using kvbench::attention_dense_cpu;
using kvbench::attention_dense_reference;
using kvbench::AttentionQuery;
using kvbench::DenseKv;

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
          AttentionProblem p(c);
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
      AttentionProblem p(Case{9, 3, 64, n_tokens, n_queries, true}, 7);
      INFO("tokens " << n_tokens << " queries " << n_queries);
      CHECK(max_abs_diff(p.run(attention_dense_cpu), p.run(attention_dense_reference)) <= 2e-5f);
    }
  }
}

TEST_CASE("attention_dense_cpu: a decode query sees every stored key", "[unit]") {
  // Decode shape (split-K path): query position past all keys; 0 keys gives zeros. 2e-5
  // absolute as above.
  for (int64_t n_tokens : {0, 1, 513, 4097, 9000}) {
    AttentionProblem p(Case{9, 3, 64, n_tokens, 1}, 3);
    p.q_positions[0] = std::numeric_limits<int32_t>::max();
    INFO("tokens " << n_tokens);
    CHECK(max_abs_diff(p.run(attention_dense_cpu), p.run(attention_dense_reference)) <= 2e-5f);
  }
}

TEST_CASE("attention_dense_cpu: a query that sees no key outputs zeros", "[unit]") {
  // Exact: no key is visible, so both give 0 by convention, whatever the split.
  for (int64_t n_tokens : {15, 4097}) {
    AttentionProblem p(Case{4, 4, 128, n_tokens, 7}, 5);
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
  AttentionProblem p(Case{8, 1, 64, 1, 1}, 9);
  const auto got = p.run(attention_dense_cpu);
  for (int h = 0; h < 8; ++h) {
    for (int d = 0; d < 64; ++d) CHECK(std::fabs(got[h * 64 + d] - p.v[d]) <= 1e-6f);
  }
}
