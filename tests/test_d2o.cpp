// D2O (methods/d2o.cpp): layer budgets from attention density, H2O's eviction with sinks,
// and evicted tokens merged into their most similar kept key past an EMA threshold.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

namespace kvbench {
std::vector<int64_t> d2o_layer_budgets(const std::vector<double>& density, int64_t budget,
                                       int64_t n_context);
}

using namespace kvbench;

TEST_CASE("d2o's layer budgets: softmax(-v) x layers x budget, clamped", "[unit][d2o]") {
  // softmax(0, -1) = (0.731, 0.269), times 2 x 10.
  CHECK(d2o_layer_budgets({0, 1}, 10, 100) == std::vector<int64_t>{14, 5});
  // The 1% floor (10 of 1000) lifts both over the total 8: the largest give back.
  CHECK(d2o_layer_budgets({0, 1}, 4, 1000) == std::vector<int64_t>{4, 4});
  CHECK(d2o_layer_budgets({0.5, 0.5, 0.5}, 7, 100) == std::vector<int64_t>{7, 7, 7});
}

namespace {

constexpr int32_t kDim = 4;

// The stored key and value of the token at `position` in layer 0, KV head 0.
std::vector<float> stored(const KvCache& cache, int32_t position, bool value) {
  const DenseKv kv = cache.layer(0).view();
  for (int64_t s = 0; s < kv.n_tokens; ++s) {
    if (kv.positions[s] != position) continue;
    const float* at = (value ? kv.v : kv.k) + s * kv.head_dim;
    return std::vector<float>(at, at + kv.head_dim);
  }
  return {};
}

testing::Chunk tokens(const std::vector<std::vector<float>>& keys,
                      const std::vector<std::vector<float>>& values, int32_t n_heads) {
  testing::Chunk c;
  c.n = static_cast<int64_t>(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    c.k.insert(c.k.end(), keys[i].begin(), keys[i].end());
    c.v.insert(c.v.end(), values[i].begin(), values[i].end());
  }
  c.q.assign(c.n * n_heads * kDim, 0.f);  // zero queries: uniform causal attention
  return c;
}

}  // namespace

TEST_CASE("d2o gives denser layers more: min-max normalised head variances", "[unit][d2o]") {
  // Three query heads on one KV head; a zero query spreads its attention (column sums vary
  // little), one aimed at token 0 piles it there (they vary a lot). Layer 0's heads are
  // (spread, spread, piled): normalised (0, 0, 1), v = 1/3; layer 1's (spread, piled,
  // piled): v = 2/3. softmax(-1/3, -2/3) x 2 x 20 = (23.3, 16.7).
  constexpr int32_t kHeads = 3;
  constexpr int64_t n = 60;
  const KvShape shape{2, 1, kDim};
  KvCache cache = make_cache("d2o:budget=20", shape);
  std::vector<testing::Chunk> layers(2);
  for (int32_t l = 0; l < 2; ++l) {
    testing::Chunk& c = layers[l];
    c.n = n;
    c.k.assign(n * kDim, 0.f);
    c.v.assign(n * kDim, 1.f);
    c.q.assign(n * kHeads * kDim, 0.f);
    c.k[0] = 10.f;
    for (int64_t i = 0; i < n; ++i) {
      for (int32_t h = l == 0 ? 2 : 1; h < kHeads; ++h) c.q[(i * kHeads + h) * kDim] = 10.f;
    }
  }
  testing::feed_context_per_layer(cache, kHeads, layers);
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{23, 16});
  // Layer 0 keeps 11 recent (49-59), the 4 sinks and the 8 heaviest of the rest: under
  // causal attention the earliest tokens have received the most.
  std::vector<int32_t> expected;
  for (int32_t p = 0; p < 12; ++p) expected.push_back(p);
  for (int32_t p = 49; p < 60; ++p) expected.push_back(p);
  CHECK(testing::kept(cache, 0, 0) == expected);
}

TEST_CASE("d2o merges an evicted token into its nearest kept key past the EMA threshold",
          "[unit][d2o]") {
  const KvShape shape{1, 1, kDim};
  // Budget 4: 2 recent, 2 heavy hitters (no sinks); zero queries rank earlier tokens
  // heavier, so the context's positions 2 and 3 are evicted.
  KvCache cache = make_cache("d2o:budget=4,sink=0", shape);
  const std::vector<std::vector<float>> keys = {
      {1, 0, 0, 0}, {0, 1, 0, 0}, {2, 0, 0, 0}, {-1, 0, 0, 0}, {1, -3, 0, 0}, {0, 1, 0, 0}};
  const std::vector<std::vector<float>> values = {
      {1, 1, 0, 0}, {0, 0, 1, 0}, {3, 5, 0, 0}, {7, 7, 7, 7}, {9, 9, 9, 9}, {0, 0, 0, 1}};
  testing::feed(cache, 1, tokens(keys, values, 1));
  cache.end_context();
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 4, 5});
  // Token 2 is parallel to token 0 (similarity 1), token 3 has at best 0: the threshold
  // starts at their mean 0.5, so token 2 merges into 0, as (k0 + 1 * k2) / 2, and 3 is lost.
  CHECK(stored(cache, 0, false) == std::vector<float>{1.5f, 0, 0, 0});
  CHECK(stored(cache, 0, true) == std::vector<float>{2, 3, 0, 0});
  CHECK(stored(cache, 1, false) == std::vector<float>{0, 1, 0, 0});
  CHECK(stored(cache, 1, true) == std::vector<float>{0, 0, 1, 0});

  // A decode step evicts token 4, whose best similarity is 1 / sqrt(10) = 0.32 (to token
  // 0): the threshold moves to 0.5 * 0.5 + 0.5 * 0.32 = 0.41, above it, so nothing merges
  // (a threshold of the step's own mean would have merged it).
  testing::decode_step(cache, 1, tokens({{0, 1, 0, 0}}, {{0, 0, 0, 2}}, 1));
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 5, 6});
  CHECK(stored(cache, 0, false) == std::vector<float>{1.5f, 0, 0, 0});
  CHECK(stored(cache, 0, true) == std::vector<float>{2, 3, 0, 0});
}

TEST_CASE("d2o refuses bad parameters", "[unit][d2o]") {
  CHECK_THROWS_AS(resolve_method_spec("d2o:budget=64,ratio=0.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("d2o:recent=2"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("d2o:alpha=-1"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("d2o:sink=-1"), InputError);
  CHECK_NOTHROW(resolve_method_spec("d2o:ratio=0.5"));
}
