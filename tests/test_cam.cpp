// CaM (methods/cam.cpp): SnapKV's selection, then each dropped token's value goes, with
// probability its attention over its receivers' mean, to the next `merge` kept tokens.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

// Eight tokens, keys along axis 0 of lengths key0 (token 0), 2 (token 1), 1.5 (token 4) and
// 0 (the rest); the window (tokens 6, 7) queries along axis 0, so tokens 1 and 4 are the
// most attended. Values tell the tokens apart.
testing::Chunk eight_tokens(float key0) {
  testing::Chunk c;
  c.n = 8;
  c.k.assign(8 * kDim, 0.f);
  c.v.assign(8 * kDim, 0.f);
  c.q.assign(8 * kHeads * kDim, 0.f);
  c.k[0 * kDim] = key0;
  c.k[1 * kDim] = 2.f;
  c.k[4 * kDim] = 1.5f;
  for (int t = 0; t < 8; ++t) {
    c.v[t * kDim + 0] = static_cast<float>(t + 1);
    c.v[t * kDim + 1] = -0.5f * static_cast<float>(t + 1);
    c.v[t * kDim + 2] = 1.f;
  }
  for (int t = 6; t < 8; ++t) {
    for (int h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * kDim] = 4.f;
  }
  return c;
}

// The value each position holds in layer 0, KV head 0.
std::vector<std::vector<float>> values_by_position(const KvCache& cache) {
  const DenseKv kv = cache.layer(0).view();
  std::vector<std::vector<float>> out(8);
  for (int64_t s = 0; s < kv.n_tokens; ++s) {
    out[kv.positions[s]].assign(kv.v + s * kDim, kv.v + (s + 1) * kDim);
  }
  return out;
}

const char* kSpec = "cam:budget=4,window=2,kernel=1,merge=2";

}  // namespace

TEST_CASE("cam merges each dropped value into the next kept ones in proportion to attention",
          "[unit]") {
  const KvShape shape{1, 1, kDim};
  KvCache cache = make_cache(std::string(kSpec) + ",sample=expected", shape);
  const testing::Chunk c = eight_tokens(0.f);
  testing::feed(cache, kHeads, c);
  cache.end_context();
  // Kept: the two most attended prefix tokens and the window.
  REQUIRE(testing::kept(cache, 0, 0) == std::vector<int32_t>{1, 4, 6, 7});
  CHECK(cache.stats().tokens_evicted == 4);

  // The window's attention A_t, summed over rows 6 and 7 (scale 1/2, logits 2 k_t).
  double a[8] = {};
  for (int row = 6; row < 8; ++row) {
    double z = 0;
    for (int t = 0; t <= row; ++t) z += std::exp(2.0 * c.k[t * kDim]);
    for (int t = 0; t <= row; ++t) a[t] += std::exp(2.0 * c.k[t * kDim]) / z;
  }
  // Receivers, by hand: 0 -> {1, 4}; 2, 3 -> {4, 6}; 5 -> {6, 7}.
  const double p0 = std::min(1.0, a[0] / ((a[1] + a[4]) / 2));
  const double p2 = std::min(1.0, a[2] / ((a[4] + a[6]) / 2));
  const double p5 = std::min(1.0, a[5] / ((a[6] + a[7]) / 2));
  CHECK(p0 < 0.1);
  CHECK(p2 < 0.3);
  CHECK(p5 == 1.0);  // token 5 is attended as token 6 and more than token 7
  const auto v = [&](int t, int i) { return static_cast<double>(c.v[t * kDim + i]); };
  const std::vector<std::vector<float>> got = values_by_position(cache);
  for (int i = 0; i < kDim; ++i) {
    INFO("channel " << i);
    CHECK(got[1][i] == Approx(v(1, i) + p0 * v(0, i) / 2).margin(1e-5));
    CHECK(got[4][i] ==
          Approx(v(4, i) + p0 * v(0, i) / 2 + p2 * (v(2, i) + v(3, i)) / 2).margin(1e-5));
    CHECK(got[6][i] == Approx(v(6, i) + p2 * (v(2, i) + v(3, i)) / 2 + v(5, i) / 2).margin(1e-5));
    CHECK(got[7][i] == Approx(v(7, i) + v(5, i) / 2).margin(1e-5));
  }
  // Keys are not merged.
  const DenseKv kv = cache.layer(0).view();
  for (int64_t s = 0; s < kv.n_tokens; ++s) {
    CHECK(std::equal(kv.k + s * kDim, kv.k + (s + 1) * kDim, c.k.begin() + kv.positions[s] * kDim));
  }
}

TEST_CASE("cam's Bernoulli draws: p = 1 always merges, p = 0 never, a seed reproduces", "[unit]") {
  const KvShape shape{1, 1, kDim};
  // Token 0's key points away from the queries: its attention underflows to 0, so p0 = 0.
  const testing::Chunk c = eight_tokens(-100.f);
  std::vector<std::vector<std::vector<float>>> runs;
  for (const char* seed : {"7", "7", "8"}) {
    KvCache cache = make_cache(std::string(kSpec) + ",seed=" + seed, shape);
    testing::feed(cache, kHeads, c);
    cache.end_context();
    REQUIRE(testing::kept(cache, 0, 0) == std::vector<int32_t>{1, 4, 6, 7});
    runs.push_back(values_by_position(cache));
  }
  CHECK(runs[0] == runs[1]);
  for (const auto& got : runs) {
    for (int i = 0; i < kDim; ++i) {
      const auto v = [&](int t) { return c.v[t * kDim + i]; };
      CHECK(got[1][i] == v(1));                                  // token 0 never merges
      CHECK(got[7][i] == Approx(v(7) + v(5) / 2).margin(1e-6));  // token 5 always does
      // Tokens 2 and 3 each merge into 4 and 6, or not: one of four sums.
      bool one_of = false;
      for (const float extra : {0.f, v(2) / 2, v(3) / 2, (v(2) + v(3)) / 2}) {
        one_of = one_of || std::fabs(got[4][i] - (v(4) + extra)) < 1e-5f;
      }
      CHECK(one_of);
    }
  }
}

TEST_CASE("cam: seeds draw differently from each other and from the expected merge", "[unit]") {
  const KvShape shape{2, 2, 8};
  std::mt19937 rng(3);
  const testing::Chunk c = testing::random_chunk(200, shape, kHeads, rng);
  std::vector<std::vector<float>> values;
  for (const std::string sample : {"seed=1", "seed=2", "sample=expected"}) {
    KvCache cache = make_cache("cam:budget=64,window=8," + sample, shape);
    testing::feed(cache, kHeads, c);
    cache.end_context();
    for (const int64_t n : cache.stats().tokens_per_layer) CHECK(n == 64);
    const DenseKv kv = cache.layer(1).view();
    values.emplace_back(kv.v, kv.v + kv.n_kv_heads * kv.capacity * kv.head_dim);
  }
  CHECK(values[0] != values[1]);
  CHECK(values[0] != values[2]);
}

TEST_CASE("cam composes in front of a storage method", "[unit]") {
  const KvShape shape{2, 2, 32};  // KIVI packs channels in groups of 32
  std::mt19937 rng(5);
  const testing::Chunk c = testing::random_chunk(300, shape, kHeads, rng);
  KvCache plain = make_cache("cam:ratio=0.5,window=8", shape);
  KvCache packed = make_cache("cam:ratio=0.5,window=8+kivi:bits=4,residual=32", shape);
  KvCache rounded = make_cache("cam:ratio=0.5,window=8+bf16", shape);
  for (KvCache* cache : {&plain, &packed, &rounded}) {
    testing::feed(*cache, kHeads, c);
    cache->end_context();
  }
  for (KvCache* cache : {&packed, &rounded}) {
    CHECK(cache->stats().tokens_per_layer == plain.stats().tokens_per_layer);
    CHECK(cache->stats().bytes_resident < plain.stats().bytes_resident);
  }
  // KIVI packs once the context has ended, so cam decides on the same fp32 context.
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t h = 0; h < 2; ++h) {
      CHECK(testing::kept(packed, l, h) == testing::kept(plain, l, h));
    }
  }
  // Later tokens come in whole, through the store.
  testing::feed(packed, kHeads, testing::random_chunk(3, shape, kHeads, rng));
  CHECK(packed.stats().tokens_per_layer[0] == plain.stats().tokens_per_layer[0] + 3);
}
