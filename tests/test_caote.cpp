// CAOTE (methods/caote.cpp): a token's score is the change of the window's attention output
// when it alone is evicted, a / (1 - a) * ||o - v||; the window is kept.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

// Seven tokens; the window is token 6, whose query (2, 0, 0, 0) at scale 1/2 gives logits
// k_t[0]: tokens 1 (2) and 2 (1.9) draw most attention (a ~ 0.38, 0.35), the rest ~0.05.
// Values are zero but token 3's (M, 0, 0, 0), so o = a_3 M: tokens 1 and 2 sit next to the
// output (error a/(1-a) * a_3 M ~ 0.6 a_3 M and 0.55 a_3 M) and token 3 far from it
// (a_3 / (1 - a_3) * (1 - a_3) M = a_3 M).
testing::Chunk seven_tokens() {
  testing::Chunk c;
  c.n = 7;
  c.k.assign(7 * kDim, 0.f);
  c.v.assign(7 * kDim, 0.f);
  c.q.assign(7 * kHeads * kDim, 0.f);
  c.k[1 * kDim] = 2.f;
  c.k[2 * kDim] = 1.9f;
  c.v[3 * kDim] = 20.f;
  for (int h = 0; h < kHeads; ++h) c.q[(6 * kHeads + h) * kDim] = 2.f;
  return c;
}

}  // namespace

TEST_CASE("caote keeps the token whose eviction moves the output most, not the most attended",
          "[unit]") {
  const KvShape shape{1, 1, kDim};
  const testing::Chunk c = seven_tokens();
  // The scores by hand: a from the window's softmax, o = sum a v.
  double a[7], z = 0;
  for (int t = 0; t < 7; ++t) z += a[t] = std::exp(c.k[t * kDim] * 1.0);
  for (double& x : a) x /= z;
  const double o = a[3] * 20.0;
  const auto err = [&](int t) { return a[t] / (1 - a[t]) * std::abs(o - c.v[t * kDim]); };
  REQUIRE(err(3) > err(1));
  REQUIRE(err(1) > err(2));
  REQUIRE(err(2) > err(0));

  KvCache cache = make_cache("caote:budget=3,window=1", shape);
  testing::feed(cache, kHeads, c);
  cache.end_context();
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{1, 3, 6});

  // SnapKV over the same attention (no pooling) keeps the two most attended instead.
  KvCache snap = make_cache("snapkv:budget=3,window=1,kernel=1", shape);
  testing::feed(snap, kHeads, c);
  snap.end_context();
  CHECK(testing::kept(snap, 0, 0) == std::vector<int32_t>{1, 2, 6});
}

TEST_CASE("caote keeps its window and compresses once", "[unit]") {
  const KvShape shape{2, 2, kDim};
  KvCache cache = make_cache("caote:budget=6,window=4", shape);
  std::mt19937 rng(5);
  testing::feed(cache, kHeads * 2, testing::random_chunk(20, shape, kHeads * 2, rng));
  cache.end_context();
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t head = 0; head < 2; ++head) {
      const std::vector<int32_t> kept = testing::kept(cache, layer, head);
      REQUIRE(kept.size() == 6);
      CHECK(std::vector<int32_t>(kept.end() - 4, kept.end()) ==
            std::vector<int32_t>{16, 17, 18, 19});
    }
  }
  // Later tokens are appended whole.
  testing::feed(cache, kHeads * 2, testing::random_chunk(3, shape, kHeads * 2, rng));
  CHECK(cache.stats().tokens_per_layer[0] == 9);
}
