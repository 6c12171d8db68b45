// UNComp (methods/uncomp.cpp): the truncated matrix entropy of known matrices and keys, budgets
// by entropy groups, and a cache whose low-entropy head and layer keep fewer tokens.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "methods/uncomp.h"
#include "tests/cache_feed.h"

using namespace kvbench;

TEST_CASE("uncomp's spectral entropy: identity log d, rank one 0", "[unit][uncomp]") {
  constexpr int32_t d = 6;
  std::vector<double> identity(d * d, 0.0);
  for (int32_t i = 0; i < d; ++i) identity[i * d + i] = 2.0;  // the scale does not matter
  CHECK(spectral_entropy(identity, d, 0) == Approx(std::log(d)));
  CHECK(spectral_entropy(identity, d, 4) == Approx(4 * std::log(d) / d));  // truncated
  std::vector<double> rank_one(d * d);
  const double u[d] = {1, -2, 0.5, 3, 0, 1};
  for (int32_t i = 0; i < d; ++i)
    for (int32_t j = 0; j < d; ++j) rank_one[i * d + j] = u[i] * u[j];
  CHECK(spectral_entropy(rank_one, d, 0) == Approx(0).margin(1e-9));
  CHECK(spectral_entropy(std::vector<double>(d * d, 0.0), d, 0) == 0);
  // Not diagonal: eigenvalues 3 and 1 of [[2, 1], [1, 2]] -> 3/4, 1/4.
  CHECK(spectral_entropy({2, 1, 1, 2}, 2, 0) ==
        Approx(-0.75 * std::log(0.75) - 0.25 * std::log(0.25)));
}

TEST_CASE("uncomp's key entropy: keys along one direction 0, isotropic near log d",
          "[unit][uncomp]") {
  constexpr int32_t d = 8;
  constexpr int64_t n = 400;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> line(n * d), iso(n * d);
  for (int64_t t = 0; t < n; ++t) {
    const float a = dist(rng);
    for (int32_t j = 0; j < d; ++j) line[t * d + j] = a * (j + 1) + 5.f;  // offset: centred
  }
  for (float& x : iso) x = dist(rng);
  CHECK(key_entropy(line.data(), n, d, d, 0) == Approx(0).margin(1e-9));
  CHECK(key_entropy(iso.data(), n, d, d, 0) > 0.97 * std::log(d));
  CHECK(key_entropy(iso.data(), n, d, d, 4) <= std::log(4) + 1e-9);
}

TEST_CASE("uncomp's groups: lower entropy keeps less, the total held, capped", "[unit][uncomp]") {
  // Two groups, spread 1/3: weights 2/3 and 4/3 (the authors' 1 : 2).
  CHECK(entropy_counts({2.0, 0.5}, 30, 100, 2, 1.0 / 3) == std::vector<int64_t>{20, 10});
  // Four units in two groups by rank: {0.1, 0.2} low (7.5 each), {0.3, 0.9} high (22.5);
  // the two spare tokens to the lower units of equal remainders.
  CHECK(entropy_counts({0.9, 0.1, 0.3, 0.2}, 60, 100, 2, 0.5) ==
        std::vector<int64_t>{23, 8, 22, 7});
  // One group or no spread: even.
  CHECK(entropy_counts({0.9, 0.1}, 30, 100, 1, 0.5) == std::vector<int64_t>{15, 15});
  CHECK(entropy_counts({0.9, 0.1}, 30, 100, 2, 0.0) == std::vector<int64_t>{15, 15});
  // The high unit capped at 18: the rest goes to the low one.
  CHECK(entropy_counts({2.0, 0.5}, 30, 18, 2, 1.0 / 3) == std::vector<int64_t>{18, 12});
  CHECK(entropy_counts({2.0, 0.5}, 50, 18, 2, 1.0 / 3) == std::vector<int64_t>{18, 18});
}

namespace {

constexpr int32_t kKvHeads = 2, kHeads = 4, kDim = 8;
constexpr int64_t kContext = 48;

// A layer's context: random queries and values; head 0's keys along one direction (rank 1)
// when `flat_head0`, else every head's keys isotropic.
testing::Chunk layer_context(bool flat_head0, std::mt19937& rng) {
  const KvShape shape{1, kKvHeads, kDim};
  testing::Chunk c = testing::random_chunk(kContext, shape, kHeads, rng);
  if (flat_head0) {
    for (int64_t t = 0; t < kContext; ++t) {
      const float a = c.k[(t * kKvHeads) * kDim];
      for (int32_t j = 0; j < kDim; ++j) c.k[(t * kKvHeads) * kDim + j] = a * (1 + 0.5f * j);
    }
  }
  return c;
}

}  // namespace

TEST_CASE("uncomp: the rank-one head and its layer keep fewer tokens, the mean the budget",
          "[unit][uncomp]") {
  const KvShape shape{2, kKvHeads, kDim};
  std::mt19937 rng(3);
  // Layer 0: one flat head and one isotropic; layer 1: both isotropic (twice the entropy).
  const std::vector<testing::Chunk> context = {layer_context(true, rng),
                                               layer_context(false, rng)};
  KvCache cache = make_cache("uncomp:budget=24,window=4,kernel=1", shape);
  testing::feed_context_per_layer(cache, kHeads, context);
  const CacheStats stats = cache.stats();
  const std::vector<int64_t>& per_head = stats.tokens_per_head;  // [layer * kKvHeads + h]
  REQUIRE(per_head.size() == 4);
  // Prefix 20 per head on average; the layers 2/3 and 4/3 of it (13 and 27 after rounding);
  // layer 0's heads split its 26 prefix tokens 1 : 2 (9 and 17), each plus the window of 4.
  const int64_t layer0 = per_head[0] + per_head[1], layer1 = per_head[2] + per_head[3];
  CHECK(per_head[0] == 9 + 4);
  CHECK(per_head[1] == 17 + 4);
  CHECK(layer0 < layer1);
  int64_t total = 0;
  for (int64_t k : per_head) total += k;
  CHECK(total == 2 * kKvHeads * 24);
  // Bytes are those of what each head holds.
  const int64_t token_bytes = 2 * kDim * sizeof(float) + sizeof(int32_t);
  CHECK(cache.layer(0).bytes_resident() == layer0 * token_bytes);
}

TEST_CASE("uncomp at a budget over the context keeps everything", "[unit][uncomp]") {
  const KvShape shape{2, kKvHeads, kDim};
  std::mt19937 rng(5);
  const std::vector<testing::Chunk> context = {layer_context(true, rng),
                                               layer_context(false, rng)};
  KvCache cache = make_cache("uncomp:budget=64,window=4", shape);
  testing::feed_context_per_layer(cache, kHeads, context);
  CHECK(cache.stats().tokens_per_head == std::vector<int64_t>(4, kContext));
}

TEST_CASE("uncomp refuses storage methods that cannot split heads, and bad parameters",
          "[unit][uncomp]") {
  CHECK_NOTHROW(resolve_method_spec("uncomp:ratio=0.5"));
  CHECK_NOTHROW(resolve_method_spec("uncomp:ratio=0.5+kivi"));  // tests/test_head_split.cpp
  CHECK_THROWS_WITH(resolve_method_spec("uncomp:ratio=0.5+mikv"), Catch::Contains("fp32 store"));
  CHECK_THROWS_AS(resolve_method_spec("adakv+uncomp:ratio=0.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("uncomp:budget=64,ratio=0.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("uncomp:budget=16,window=32"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("uncomp:spread=1.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("uncomp:head_groups=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("uncomp:kernel=4"), InputError);
  const MethodInfo* info = find_method("uncomp");
  REQUIRE(info);
  CHECK(info->ragged_heads);  // refused on --device cuda (make_cuda_cache) and by storage
}
