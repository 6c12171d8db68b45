// KVMerger (methods/kvmerger.cpp): runs of similar keys merge into their most attended
// token with Gaussian weights; never more tokens than before, the pivot's slot and position
// kept, the budget respected.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;

}  // namespace

TEST_CASE("kvmerger merges runs of similar keys into their most attended token", "[unit]") {
  // One layer, one KV head, head_dim 4. Context of 12: tokens 0-3 share one key direction
  // (a run), 4-7 another, 8-11 alternate directions (no run); window 2 (tokens 10, 11).
  const KvShape shape{1, 1, 4};
  KvCache cache = make_cache("kvmerger:budget=8,window=2,threshold=0.9", shape);
  testing::Chunk c;
  c.n = 12;
  c.k.assign(12 * 4, 0.f);
  c.v.assign(12 * 4, 0.f);
  c.q.assign(12 * kHeads * 4, 0.f);
  for (int t = 0; t < 12; ++t) {
    const int axis = t < 4 ? 0 : t < 8 ? 1 : 2 + t % 2;
    c.k[t * 4 + axis] = 1.f + 0.01f * t;  // same direction inside a run, slightly apart
    c.v[t * 4] = static_cast<float>(t);   // values tell the tokens apart
  }
  // The window's queries look along axis 0 with a preference for token 2's scale... all
  // tokens of run 0 get similar scores; make token 2 the most attended by a larger key.
  c.k[2 * 4 + 0] = 1.5f;
  for (int t = 10; t < 12; ++t) {
    for (int h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * 4 + 0] = 4.f;
  }
  testing::feed(cache, kHeads, c);
  cache.end_context();
  const std::vector<int32_t> kept = testing::kept(cache, 0, 0);
  // Runs 0-3 and 4-7 merge (2 tokens), 8, 9 stay, the window stays: 6 tokens, within 8.
  REQUIRE(kept.size() == 6);
  CHECK(cache.stats().tokens_evicted == 6);
  CHECK(kept[0] == 2);  // the pivot of run 0: the most attended
  CHECK(std::vector<int32_t>(kept.begin() + 2, kept.end()) == std::vector<int32_t>{8, 9, 10, 11});
  // The merged value is the Gaussian-weighted mean of the run's values, pivot weight 1.
  const DenseKv kv = cache.layer(0).view();
  for (int64_t s = 0; s < kv.n_tokens; ++s) {
    if (kv.positions[s] != 2) continue;
    double dist[4], mean = 0;
    for (int t = 0; t < 4; ++t) {
      const double k_t = t == 2 ? 1.5 : 1.0 + 0.01 * t;
      dist[t] = (k_t - 1.5) * (k_t - 1.5);
      mean += dist[t] / 3;
    }
    double num = 0, den = 0, key = 0;
    for (int t = 0; t < 4; ++t) {
      const double w = std::exp(-dist[t] / (2 * mean));
      num += w * t;
      key += w * (t == 2 ? 1.5 : 1.0 + 0.01 * t);
      den += w;
    }
    CHECK(kv.v[s * 4] == Approx(num / den).epsilon(1e-5));
    CHECK(kv.k[s * 4] == Approx(key / den).epsilon(1e-5));
    CHECK(kv.k[s * 4 + 1] == 0.f);
  }
}

TEST_CASE("kvmerger never adds tokens, keeps each set's pivot and holds the budget", "[unit]") {
  const KvShape shape{2, 2, 8};
  for (const int budget : {16, 40, 200}) {
    INFO("budget " << budget);
    std::mt19937 rng(budget);
    KvCache cache = make_cache("kvmerger:budget=" + std::to_string(budget) + ",window=8", shape);
    testing::Chunk c = testing::random_chunk(120, shape, kHeads, rng);
    // Neighbouring keys alike in stretches, so the threshold finds runs.
    for (int64_t t = 1; t < 120; ++t) {
      if (t % 7 == 0) continue;
      for (int64_t i = 0; i < 2 * 8; ++i) c.k[t * 16 + i] = c.k[(t - 1) * 16 + i] + 0.05f * (i % 3);
    }
    testing::feed(cache, kHeads, c);
    cache.end_context();
    const CacheStats s = cache.stats();
    for (int64_t n : s.tokens_per_layer) {
      CHECK(n <= std::min(budget, 120));
      CHECK(n >= 8);
    }
    for (int32_t l = 0; l < 2; ++l) {
      for (int32_t h = 0; h < 2; ++h) {
        const std::vector<int32_t> kept = testing::kept(cache, l, h);
        CHECK(std::adjacent_find(kept.begin(), kept.end()) == kept.end());  // no duplicates
        for (int32_t p = 112; p < 120; ++p) {                               // the window
          CHECK(std::binary_search(kept.begin(), kept.end(), p));
        }
      }
    }
    // Later tokens come in whole.
    testing::feed(cache, kHeads, testing::random_chunk(3, shape, kHeads, rng));
    CHECK(cache.stats().tokens_per_layer[0] == s.tokens_per_layer[0] + 3);
  }
}
