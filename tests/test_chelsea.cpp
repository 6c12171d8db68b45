// Chelsea (methods/chelsea.cpp): inside chunks, alternate tokens are matched to their most
// key-similar partner; the most similar matches merge into centroids until the budget holds.
#include <algorithm>
#include <catch2/catch.hpp>
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

testing::Chunk tokens_with_keys(const std::vector<std::vector<float>>& keys) {
  testing::Chunk c;
  c.n = static_cast<int64_t>(keys.size());
  c.q.assign(c.n * kHeads * kDim, 0.5f);
  for (int64_t t = 0; t < c.n; ++t) {
    c.k.insert(c.k.end(), keys[t].begin(), keys[t].end());
    const std::vector<float> v = {static_cast<float>(t), 1.f, -2.f * t, 0.25f};
    c.v.insert(c.v.end(), v.begin(), v.end());
  }
  return c;
}

// Key and value each position holds in layer 0, KV head 0.
struct Held {
  std::vector<std::vector<float>> k, v;
};
Held held_by_position(const KvCache& cache, int64_t n) {
  const DenseKv kv = cache.layer(0).view();
  Held out{std::vector<std::vector<float>>(n), std::vector<std::vector<float>>(n)};
  for (int64_t s = 0; s < kv.n_tokens; ++s) {
    out.k[kv.positions[s]].assign(kv.k + s * kDim, kv.k + (s + 1) * kDim);
    out.v[kv.positions[s]].assign(kv.v + s * kDim, kv.v + (s + 1) * kDim);
  }
  return out;
}

// The mean of rows `of` of x ([n, kDim]), channel i.
float mean(const std::vector<float>& x, const std::vector<int>& of, int i) {
  double s = 0;
  for (const int t : of) s += x[t * kDim + i];
  return static_cast<float>(s / of.size());
}

}  // namespace

TEST_CASE("chelsea merges the most similar matches of each chunk into centroids", "[unit]") {
  // Prefix of 8 in two chunks of 4, window 2 (tokens 8, 9); budget 7: three merges.
  // Chunk [0, 4): sources 0, 2, destinations 1, 3; 0 -> 1 at cos 0.995, 2 -> 3 at 0.8.
  // Chunk [4, 8): sources 4, 6, destinations 5, 7; both match 5, at cos 0.99875 and 0.99877.
  const testing::Chunk c = tokens_with_keys({
      {1, 0.1f, 0, 0},
      {1, 0, 0, 0},
      {0, 1, 0, 0},
      {0.6f, 0.8f, 0, 0},
      {0, 0, 1, 0},
      {0, 0, 1, 0.05f},
      {0, 0, 1, 0.1f},
      {0, 0, 0, 1},
      {0, 1, 1, 0},
      {1, 0, 1, 0},
  });
  const KvShape shape{1, 1, kDim};
  KvCache cache = make_cache("chelsea:budget=7,window=2,chunk=4", shape);
  testing::feed(cache, kHeads, c);
  cache.end_context();
  // The three best matches merge (6 -> 5, 4 -> 5, 0 -> 1); 2 -> 3 is the fourth.
  REQUIRE(testing::kept(cache, 0, 0) == std::vector<int32_t>{1, 2, 3, 5, 7, 8, 9});
  CHECK(cache.stats().tokens_evicted == 3);
  const Held got = held_by_position(cache, 10);
  for (int i = 0; i < kDim; ++i) {
    INFO("channel " << i);
    CHECK(got.k[1][i] == Approx(mean(c.k, {0, 1}, i)));
    CHECK(got.v[1][i] == Approx(mean(c.v, {0, 1}, i)));
    CHECK(got.k[5][i] == Approx(mean(c.k, {4, 5, 6}, i)));
    CHECK(got.v[5][i] == Approx(mean(c.v, {4, 5, 6}, i)));
    for (const int t : {2, 3, 7, 8, 9}) {  // untouched, bit for bit
      CHECK(got.k[t][i] == c.k[t * kDim + i]);
      CHECK(got.v[t][i] == c.v[t * kDim + i]);
    }
  }
}

TEST_CASE("chelsea's rounds merge clusters into the centroid of all their tokens", "[unit]") {
  // One chunk of 4 and a window of 2; budget 3 leaves one prefix token: round one merges
  // both sources into destinations, round two the first cluster into the second, whatever
  // the matches were. Size-weighted: the mean of the four, at position 3.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(0.1f, 1.f);
  std::vector<std::vector<float>> keys(6, std::vector<float>(kDim));
  for (auto& k : keys) {
    for (float& x : k) x = dist(rng);
  }
  const testing::Chunk c = tokens_with_keys(keys);
  KvCache cache = make_cache("chelsea:budget=3,window=2,chunk=4", KvShape{1, 1, kDim});
  testing::feed(cache, kHeads, c);
  cache.end_context();
  REQUIRE(testing::kept(cache, 0, 0) == std::vector<int32_t>{3, 4, 5});
  const Held got = held_by_position(cache, 6);
  for (int i = 0; i < kDim; ++i) {
    CHECK(got.k[3][i] == Approx(mean(c.k, {0, 1, 2, 3}, i)));
    CHECK(got.v[3][i] == Approx(mean(c.v, {0, 1, 2, 3}, i)));
  }
}

TEST_CASE("chelsea holds the budget: chunks grow when fewer tokens than chunks fit", "[unit]") {
  struct Case {
    std::string spec;
    int64_t n, limit, window;
  };
  const KvShape shape{2, 2, 8};
  for (const Case& t : {Case{"chelsea:budget=4,window=2,chunk=4", 18, 4, 2},  // 4 chunks, 2 kept
                        Case{"chelsea:budget=2,window=2,chunk=4", 18, 2, 2},  // the window alone
                        Case{"chelsea:ratio=0.2,window=8", 118, 24, 8},
                        Case{"chelsea:budget=90,window=8", 118, 90, 8}}) {
    INFO(t.spec);
    std::mt19937 rng(4);
    KvCache cache = make_cache(t.spec, shape);
    testing::feed(cache, kHeads, testing::random_chunk(t.n, shape, kHeads, rng));
    cache.end_context();
    for (const int64_t n : cache.stats().tokens_per_layer) CHECK(n == t.limit);
    for (int32_t l = 0; l < 2; ++l) {
      for (int32_t h = 0; h < 2; ++h) {
        const std::vector<int32_t> kept = testing::kept(cache, l, h);
        for (int64_t p = t.n - t.window; p < t.n; ++p) {
          CHECK(std::binary_search(kept.begin(), kept.end(), static_cast<int32_t>(p)));
        }
      }
    }
    // Later tokens come in whole.
    testing::feed(cache, kHeads, testing::random_chunk(3, shape, kHeads, rng));
    CHECK(cache.stats().tokens_per_layer[0] == t.limit + 3);
  }
}

TEST_CASE("chelsea composes in front of a storage method", "[unit]") {
  const KvShape shape{2, 2, 32};  // KIVI packs channels in groups of 32
  std::mt19937 rng(5);
  const testing::Chunk c = testing::random_chunk(300, shape, kHeads, rng);
  KvCache plain = make_cache("chelsea:ratio=0.5", shape);
  KvCache packed = make_cache("chelsea:ratio=0.5+kivi:bits=4,residual=32", shape);
  KvCache rounded = make_cache("chelsea:ratio=0.5+bf16", shape);
  for (KvCache* cache : {&plain, &packed, &rounded}) {
    testing::feed(*cache, kHeads, c);
    cache->end_context();
  }
  for (KvCache* cache : {&packed, &rounded}) {
    CHECK(cache->stats().tokens_per_layer == plain.stats().tokens_per_layer);
    CHECK(cache->stats().bytes_resident < plain.stats().bytes_resident);
  }
  // KIVI packs once the context has ended: chelsea matches the same fp32 keys.
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t h = 0; h < 2; ++h) {
      CHECK(testing::kept(packed, l, h) == testing::kept(plain, l, h));
    }
  }
}
