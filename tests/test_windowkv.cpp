// WindowKV (methods/windowkv.cpp): the suffix queries score windows of consecutive tokens;
// the lowest windows are dropped, a group of layers shares its first layer's windows, and
// group budgets decrease arithmetically.
#include <catch2/catch.hpp>
#include <numeric>
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

// Sixteen tokens: review windows of 4 {0-3}, {4-7}, {8-11}, then the suffix {12-15},
// whose queries point along axis 0 (logit 2 x key length). Window {0-3} has one strong
// token (e^4) and three at e^0: mean 14.4, top-2 mean 27.8. Window {4-7} is even (e^2.9
// each): mean and top-2 mean 18.2. Window {8-11} is weak (e^2 each).
testing::Chunk sixteen_tokens() {
  testing::Chunk c;
  c.n = 16;
  c.k.assign(16 * kDim, 0.f);
  c.v.assign(16 * kDim, 1.f);
  c.q.assign(16 * kHeads * kDim, 0.f);
  c.k[0 * kDim] = 2.f;
  for (int t = 4; t < 8; ++t) c.k[t * kDim] = 1.45f;
  for (int t = 8; t < 12; ++t) c.k[t * kDim] = 1.f;
  for (int t = 12; t < 16; ++t) {
    for (int h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * kDim] = 4.f;
  }
  return c;
}

// Feeds each layer its own chunk (the same positions), then ends the context.
void feed_layers(KvCache& cache, const std::vector<testing::Chunk>& per_layer) {
  testing::feed_context_per_layer(cache, kHeads, per_layer);
}

const char* kSpec = "windowkv:budget=8,suffix=4,window=4";

}  // namespace

TEST_CASE("windowkv keeps the best window by the strategy's score, plus the suffix", "[unit]") {
  const KvShape shape{1, 1, kDim};
  KvCache max = make_cache(std::string(kSpec) + ",strategy=max", shape);
  feed_layers(max, {sixteen_tokens()});
  CHECK(testing::kept(max, 0, 0) == std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15});
  CHECK(max.stats().tokens_evicted == 8);
  KvCache average = make_cache(std::string(kSpec) + ",strategy=average", shape);
  feed_layers(average, {sixteen_tokens()});
  CHECK(testing::kept(average, 0, 0) == std::vector<int32_t>{4, 5, 6, 7, 12, 13, 14, 15});
}

TEST_CASE("windowkv drops windows until the review part fits, the short last one included",
          "[unit]") {
  const KvShape shape{1, 1, kDim};
  // Windows of 5 over the review 0..11: {0-4}, {5-9} and the short {10, 11}, the weakest.
  // Budget 4 + 7: dropping {10, 11} leaves 10 > 7, so {5-9} goes too.
  KvCache cache = make_cache("windowkv:budget=11,suffix=4,window=5,strategy=average", shape);
  feed_layers(cache, {sixteen_tokens()});
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 2, 3, 4, 12, 13, 14, 15});
}

TEST_CASE("windowkv: a group's later layers keep its first layer's windows", "[unit]") {
  const KvShape shape{2, 1, kDim};
  // Layer 1 on its own would keep {8-11}: the strongest there.
  testing::Chunk other = sixteen_tokens();
  for (int t = 0; t < 12; ++t) other.k[t * kDim] = t >= 8 ? 3.f : 0.f;
  const std::vector<testing::Chunk> layers = {sixteen_tokens(), other};
  KvCache own = make_cache(std::string(kSpec) + ",group=1,decay=uniform", shape);
  feed_layers(own, layers);
  CHECK(testing::kept(own, 1, 0) == std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14, 15});
  KvCache grouped = make_cache(std::string(kSpec) + ",group=2", shape);
  feed_layers(grouped, layers);
  CHECK(testing::kept(grouped, 0, 0) == std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15});
  CHECK(testing::kept(grouped, 1, 0) == std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15});
}

TEST_CASE("windowkv's group budgets decrease arithmetically and average the budget", "[unit]") {
  const KvShape shape{4, 1, kDim};
  // Two groups of 2, budget 20, beta 4: the last group keeps 20 * 2 / 4 = 10, the first
  // 2 * 20 - 10 = 30. Of 40 tokens (review 36 in windows of 4, suffix 4), the first group
  // keeps 6 windows + 4 = 28 <= 30, the last 1 window + 4 = 8 <= 10.
  KvCache cache = make_cache("windowkv:budget=20,suffix=4,window=4,group=2,beta=4", shape);
  std::mt19937 rng(3);
  testing::feed(cache, kHeads, testing::random_chunk(40, shape, kHeads, rng));
  cache.end_context();
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{28, 28, 8, 8});
}

TEST_CASE("windowkv: a context within the average budget stays whole in every group", "[unit]") {
  const KvShape shape{4, 1, kDim};
  // Two groups, budget 40 = the context: the last group's share (20) would evict.
  KvCache cache = make_cache("windowkv:budget=40,suffix=4,window=4,group=2,beta=4", shape);
  std::mt19937 rng(3);
  testing::feed(cache, kHeads, testing::random_chunk(40, shape, kHeads, rng));
  cache.end_context();
  CHECK(cache.stats().tokens_evicted == 0);
}
