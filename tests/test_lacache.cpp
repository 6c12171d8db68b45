// LaCache (methods/lacache.cpp): each layer keeps `budget` tokens, the sinks, a ladder
// where layers keep different tokens of each older segment, and the newest; the laddered
// region grows at every compaction and starts over (compacting itself again) when full.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "methods/lacache.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;
constexpr int32_t kDim = 4;

}  // namespace

TEST_CASE("lacache: the ladder over 4 layers, then iterative compaction", "[lacache]") {
  // 4 layers, span 2, overlap 0: segments of P_b = 1 + ceil((4 - 2) / 2) = 2 tokens, each
  // layer keeps P_a = 1, at offset layer mod 2. Budget 12, sinks min(2, 12 - 4 - 1) = 2.
  const KvShape shape{4, 1, kDim};
  KvCache cache = make_cache("lacache:budget=12,sink=2,span=2,overlap=0", shape);
  std::mt19937 rng(7);
  testing::feed(cache, kHeads, testing::random_chunk(16, shape, kHeads, rng));
  cache.end_context();
  // 4 to drop, room for 12 - 2 - 4 = 6 segments: 4 segments from the cursor (2), one token
  // of each kept, even layers the first, odd layers the second; 10-15 untouched.
  const std::vector<int32_t> even = {0, 1, 2, 4, 6, 8, 10, 11, 12, 13, 14, 15};
  const std::vector<int32_t> odd = {0, 1, 3, 5, 7, 9, 10, 11, 12, 13, 14, 15};
  for (int32_t layer = 0; layer < 4; ++layer) {
    INFO("layer " << layer);
    CHECK(testing::kept(cache, layer, 0) == (layer % 2 == 0 ? even : odd));
  }
  // Between them the layers still hold every position.
  std::set<int32_t> covered;
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t p : testing::kept(cache, layer, 0)) covered.insert(p);
  }
  CHECK(covered.size() == 16);

  // Each decode step ladders one more segment (cursor 6 -> 7 -> 8); the third finds no
  // room (12 - 8 - 4 = 0) and starts over: the first segment after the sinks (2, 4 in even
  // layers) is laddered again, cursor back to 3; the fourth goes on from there.
  const std::vector<std::vector<int32_t>> even_steps = {
      {0, 1, 2, 4, 6, 8, 10, 12, 13, 14, 15, 16},
      {0, 1, 2, 4, 6, 8, 10, 12, 14, 15, 16, 17},
      {0, 1, 2, 6, 8, 10, 12, 14, 15, 16, 17, 18},
      {0, 1, 2, 6, 10, 12, 14, 15, 16, 17, 18, 19}};
  const std::vector<std::vector<int32_t>> odd_steps = {
      {0, 1, 3, 5, 7, 9, 11, 12, 13, 14, 15, 16},
      {0, 1, 3, 5, 7, 9, 11, 13, 14, 15, 16, 17},
      {0, 1, 5, 7, 9, 11, 13, 14, 15, 16, 17, 18},
      {0, 1, 5, 9, 11, 13, 14, 15, 16, 17, 18, 19}};
  for (size_t step = 0; step < even_steps.size(); ++step) {
    INFO("step " << step);
    testing::decode_step(cache, kHeads, testing::random_chunk(1, shape, kHeads, rng));
    CHECK(testing::kept(cache, 0, 0) == even_steps[step]);
    CHECK(testing::kept(cache, 2, 0) == even_steps[step]);
    CHECK(testing::kept(cache, 1, 0) == odd_steps[step]);
    CHECK(testing::kept(cache, 3, 0) == odd_steps[step]);
  }
}

TEST_CASE("lacache: every compaction keeps a valid, budgeted, equal-sized set", "[lacache]") {
  // Depths and the authors' span/overlap settings, budgets from barely room for a ladder
  // up; contexts up to 20x the budget (several start-over rounds at once), then forwards
  // of 1 and 37 tokens.
  for (const int32_t n_layers : {4, 24, 32, 36}) {
    for (const auto& so : std::vector<std::pair<int, int>>{{16, 0}, {9, 3}, {8, 4}, {9, 7},
                                                           {2, 0}, {3, 1}}) {
      const int64_t span = so.first, overlap = so.second;
      if (span >= n_layers) continue;
      for (const int64_t budget : {int64_t{n_layers} + 4, int64_t{97}, int64_t{300}}) {
        for (const int64_t context : {budget + 1, 2 * budget, 20 * budget + 3}) {
          INFO(n_layers << " layers, span " << span << ", overlap " << overlap << ", budget "
                        << budget << ", context " << context);
          const int64_t step = span - overlap;
          const int64_t p_before = 1 + (n_layers - span + step - 1) / step;
          const int64_t p_after = std::min(p_before, (span + step - 1) / step);
          const int64_t start = std::min<int64_t>(128, budget - n_layers - p_after);
          if (p_before == p_after || start < 1) continue;  // no ladder: the policy streams
          std::vector<int64_t> cursor(n_layers, start);
          int64_t n = context;
          for (int forward = 0; forward < 30; ++forward) {
            int64_t kept = -1;
            for (int32_t layer = 0; layer < n_layers; ++layer) {
              const LacacheStep s = lacache_step(n, budget, start, cursor[layer], layer,
                                                 n_layers, span, overlap);
              const int64_t size = static_cast<int64_t>(s.keep.size());
              REQUIRE(size <= budget);
              REQUIRE(std::adjacent_find(s.keep.begin(), s.keep.end(),
                                         [](int64_t a, int64_t b) { return a >= b; }) ==
                      s.keep.end());
              REQUIRE(s.keep.front() == 0);
              REQUIRE(s.keep.back() == n - 1);  // the newest token stays
              REQUIRE(s.keep[start - 1] == start - 1);  // the sinks stay
              REQUIRE(s.cursor >= start);
              REQUIRE(s.cursor <= size);
              if (kept >= 0) REQUIRE(size == kept);  // all layers alike
              kept = size;
              cursor[layer] = s.cursor;
            }
            n = kept + (forward % 2 == 0 ? 1 : 37);
            if (n <= budget) n = budget + 1;
          }
        }
      }
    }
  }
}

TEST_CASE("lacache: a ratio, and StreamingLLM where no ladder fits", "[lacache]") {
  const KvShape shape{4, 1, kDim};
  std::mt19937 rng(11);
  const testing::Chunk context = testing::random_chunk(40, shape, kHeads, rng);
  {
    KvCache cache = make_cache("lacache:ratio=0.5,sink=2,span=2", shape);
    testing::feed(cache, kHeads, context);
    cache.end_context();
    CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{20, 20, 20, 20});
    CHECK(testing::kept(cache, 0, 0) != testing::kept(cache, 1, 0));
  }
  // span 16 over 4 layers: one rung covers every layer, no layer may drop a token.
  KvCache no_ladder = make_cache("lacache:budget=10,sink=2", shape);
  testing::feed(no_ladder, kHeads, context);
  no_ladder.end_context();
  for (int32_t layer = 0; layer < 4; ++layer) {
    CHECK(testing::kept(no_ladder, layer, 0) ==
          std::vector<int32_t>{0, 1, 32, 33, 34, 35, 36, 37, 38, 39});
  }
  // A budget of n_layers + 1 leaves no room between the sinks and the newest n_layers.
  KvCache tight = make_cache("lacache:budget=5,sink=2,span=2", shape);
  testing::feed(tight, kHeads, context);
  tight.end_context();
  CHECK(testing::kept(tight, 0, 0) == std::vector<int32_t>{0, 1, 37, 38, 39});
}

TEST_CASE("lacache: parameter refusals", "[lacache]") {
  CHECK_THROWS_AS(resolve_method_spec("lacache:span=4,overlap=4"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("lacache:span=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("lacache:sink=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("lacache:budget=8,ratio=0.5"), InputError);
  CHECK_NOTHROW(resolve_method_spec("lacache:ratio=0.5,span=9,overlap=3"));
}
