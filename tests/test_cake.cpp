// CAKE (methods/cake.cpp): layer budgets by preference (entropy x variance of the window's
// attention), the authors' adjust_budgets, and the mean + gamma * variance indicator.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

namespace kvbench {
std::vector<int64_t> cake_adjust_budgets(const std::vector<double>& shares, int64_t total,
                                         int64_t cap);
}

using namespace kvbench;

TEST_CASE("cake's adjust_budgets matches the authors' (cake/utils.py)", "[unit][cake]") {
  // Truncated to {10, 0, 5}: the missing token goes to the first layer that can take it.
  CHECK(cake_adjust_budgets({10.7, 0.2, 5.1}, 16, 100) == std::vector<int64_t>{11, 0, 5});
  // {20, 3, 0} capped at 12: the excess 8 split over the other two, then the remainder.
  CHECK(cake_adjust_budgets({20.5, 3.5, 0.0}, 24, 12) == std::vector<int64_t>{12, 8, 4});
  CHECK(cake_adjust_budgets({30, 0, 0}, 30, 12) == std::vector<int64_t>{12, 9, 9});
}

namespace {

constexpr int32_t kDim = 8;
constexpr int64_t kContext = 40, kWindow = 8;

// One layer's context of kContext tokens, one KV head and one query head.
// Layer 0: zero prefix keys, window keys pointing away from every window query, so each
// window row spreads the same uniform weights over the prefix: no shift across rows
// (variance 0), hence preference 0. Layer 1: window row r attends to the prefix token at
// 4r + 1 most, a different one per row: a large shift.
testing::Chunk layer_context(bool shifting) {
  testing::Chunk c;
  c.n = kContext;
  c.k.assign(kContext * kDim, 0.f);
  c.v.assign(kContext * kDim, 1.f);
  c.q.assign(kContext * kDim, 0.f);
  for (int64_t r = 0; r < kWindow; ++r) {
    const int64_t row = kContext - kWindow + r;
    if (shifting) {
      c.k[(4 * r + 1) * kDim + r] = 3.f;  // about 0.4 of the row's weight
      c.q[row * kDim + r] = 3.f;
    } else {
      c.k[row * kDim] = -10.f;
      c.q[row * kDim] = 10.f;
    }
  }
  return c;
}

}  // namespace

TEST_CASE("cake gives the budget to the layer whose window attention shifts", "[unit][cake]") {
  const KvShape shape{2, 1, kDim};
  // Average budget 16 with window 8: 2 x 8 prefix tokens to split.
  KvCache cache = make_cache("cake:budget=16,window=8,kernel=1", shape);
  testing::feed_context_per_layer(cache, 1, {layer_context(false), layer_context(true)});
  // Layer 0's preference is 0: it keeps its window alone; layer 1 takes all 16.
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{8, 24});
  std::vector<int32_t> window(kWindow);
  for (int64_t i = 0; i < kWindow; ++i) window[i] = static_cast<int32_t>(kContext - kWindow + i);
  CHECK(testing::kept(cache, 0, 0) == window);
  const std::vector<int32_t> kept = testing::kept(cache, 1, 0);
  for (int32_t r = 0; r < kWindow; ++r) {
    INFO("target " << 4 * r + 1);
    CHECK(std::count(kept.begin(), kept.end(), 4 * r + 1) == 1);  // each row's target
  }
  for (int32_t p : window) CHECK(std::count(kept.begin(), kept.end(), p) == 1);
}

TEST_CASE("cake with equal layers keeps the budget in each", "[unit][cake]") {
  const KvShape shape{2, 1, kDim};
  KvCache cache = make_cache("cake:budget=16,window=8,kernel=1", shape);
  testing::feed_context_per_layer(cache, 1, {layer_context(true), layer_context(true)});
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{16, 16});
}

TEST_CASE("cake refuses bad parameters", "[unit][cake]") {
  CHECK_THROWS_AS(resolve_method_spec("cake:budget=4,window=8"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("cake:kernel=4"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("cake:tau1=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("cake:gamma=-1"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("cake:budget=64,ratio=0.5"), InputError);
  CHECK_NOTHROW(resolve_method_spec("cake:ratio=0.5"));
}
