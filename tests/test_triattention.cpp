// TriAttention (methods/triattention.cpp): keys scored by the expected future attention
// logit from the pre-RoPE queries' frequency statistics (mean and mean magnitude per RoPE
// pair), the GQA group's max; compressed at the end of the context (or the context pinned)
// and again every `divide` positions once over the budget.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

// n tokens with zero keys, values and queries.
testing::Chunk blank(int64_t n) {
  testing::Chunk c;
  c.n = n;
  c.k.assign(n * kDim, 0.f);
  c.v.assign(n * kDim, 0.f);
  c.q.assign(n * kHeads * kDim, 0.f);
  return c;
}

void set(std::vector<float>& x, int64_t row, std::vector<float> values) {
  std::copy(values.begin(), values.end(), x.begin() + row * kDim);
}

// Every query head of every row set to `q`.
void set_queries(testing::Chunk& c, std::vector<float> q) {
  for (int64_t t = 0; t < c.n; ++t) {
    for (int h = 0; h < kHeads; ++h) set(c.q, t * kHeads + h, q);
  }
}

std::vector<int32_t> kept_after(const std::string& spec, const KvShape& shape,
                                const testing::Chunk& c) {
  KvCache cache = make_cache(spec, shape);
  testing::feed(cache, kHeads, c);
  cache.end_context();
  return testing::kept(cache, 0, 0);
}

}  // namespace

TEST_CASE("triattention keeps the keys the queries' mean points at, and the spread's", "[unit]") {
  const KvShape shape{1, 1, kDim};  // no RoPE: the score is q̄.k + (E|q_f| - |q̄_f|)|k_f|
  testing::Chunk c = blank(8);
  set_queries(c, {2, 0, 0, 0});
  set(c.k, 1, {-4, 0, 0, 0});
  set(c.k, 3, {3, 0, 0, 0});
  set(c.k, 6, {1, 0, 0, 0});
  set(c.k, 7, {0, 0, 5, 0});  // across the mean, and the queries never spread there
  CHECK(kept_after("triattention:budget=2", shape, c) == std::vector<int32_t>{3, 6});

  // Query head 1 points at token 7's channel: the GQA group's max keeps it.
  for (int64_t t = 0; t < c.n; ++t) set(c.q, t * kHeads + 1, {0, 0, 1, 0});
  CHECK(kept_after("triattention:budget=2", shape, c) == std::vector<int32_t>{3, 7});

  // Queries alternating +-3 in pair 0: mean 0 there, E|q_0| = 3, so the norm term keeps the
  // keys long in that pair, either sign; pair 1 is empty.
  testing::Chunk spread = blank(10);
  for (int64_t t = 0; t < spread.n; ++t) {
    for (int h = 0; h < kHeads; ++h) set(spread.q, t * kHeads + h, {t % 2 ? 3.f : -3.f, 0, 0, 0});
  }
  set(spread.k, 2, {0, -2, 0, 0});  // |k_0| = 2, along the pair's other axis
  set(spread.k, 5, {1, 0, 0, 0});
  set(spread.k, 8, {0, 0, 4, 4});
  CHECK(kept_after("triattention:budget=2", shape, spread) == std::vector<int32_t>{2, 5});
}

TEST_CASE("triattention turns the queries back before RoPE and looks past the next position",
          "[unit]") {
  KvShape shape{1, 1, kDim};
  shape.rope_inv_freq = {1.f, 0.25f};
  // Every query is q* = (3, 0, 0, 0) before RoPE, turned to its position as the model does.
  const int64_t n = 9;
  testing::Chunk c = blank(n);
  for (int64_t t = 0; t < n; ++t) {
    const double angle = static_cast<double>(t);
    for (int h = 0; h < kHeads; ++h) {
      set(c.q, t * kHeads + h,
          {static_cast<float>(3 * std::cos(angle)), static_cast<float>(3 * std::sin(angle)), 0, 0});
    }
  }
  // offset_max=1: the one future query sits at t + 1 = 10, q* turned by 10 rad. Token 4's
  // stored key points along it, token 6's the other way, token 2's along q* unturned. Token
  // 7's points where the RoPE'd queries' own mean (angle 4 + pi) lands turned by 10 rad:
  // statistics that skipped turning the queries back would keep it.
  const double ahead = 10.0, naive = 4.0 + M_PI + 10.0;
  set(c.k, 4,
      {static_cast<float>(2 * std::cos(ahead)), static_cast<float>(2 * std::sin(ahead)), 0, 0});
  set(c.k, 6,
      {static_cast<float>(-2 * std::cos(ahead)), static_cast<float>(-2 * std::sin(ahead)), 0, 0});
  set(c.k, 2, {2, 0, 0, 0});
  set(c.k, 7,
      {static_cast<float>(2 * std::cos(naive)), static_cast<float>(2 * std::sin(naive)), 0, 0});
  CHECK(kept_after("triattention:budget=1,offset_max=1", shape, c) == std::vector<int32_t>{4});
  CHECK(kept_after("triattention:budget=2,offset_max=1", shape, c) == std::vector<int32_t>{4, 7});
}

TEST_CASE("triattention compresses every `divide` positions; context=pin keeps the context",
          "[unit]") {
  const KvShape shape{1, 1, kDim};
  const auto run = [&](const std::string& spec, std::vector<int64_t>* sizes) {
    KvCache cache = make_cache(spec, shape);
    testing::Chunk context = blank(6);
    set_queries(context, {1, 0, 0, 0});
    for (int64_t t = 0; t < 6; ++t) set(context.k, t, {-5, 0, 0, 0});
    testing::feed(cache, kHeads, context);
    cache.end_context();
    // Decode positions 6..11 (rounds at 8 and 12): keys along the queries, 9 and 11 most.
    for (int32_t p = 6; p < 12; ++p) {
      testing::Chunk step = blank(1);
      set_queries(step, {1, 0, 0, 0});
      const float along = p == 9 || p == 11 ? 3.f : 0.1f * static_cast<float>(p - 6);
      set(step.k, 0, {along, 0, 0, 0});
      testing::decode_step(cache, kHeads, step);
      sizes->push_back(cache.layer(0).n_tokens());
    }
    return testing::kept(cache, 0, 0);
  };
  std::vector<int64_t> sizes;
  // Pinned: only tokens 6..11 compete for the 2 places the budget leaves, at position 12.
  CHECK(run("triattention:budget=8,divide=4,context=pin", &sizes) ==
        std::vector<int32_t>{0, 1, 2, 3, 4, 5, 9, 11});
  CHECK(sizes == std::vector<int64_t>{7, 8, 9, 10, 11, 8});
  // Compressed: the context's keys point away from the queries and lose to every later one.
  sizes.clear();
  CHECK(run("triattention:budget=8,divide=4", &sizes) ==
        std::vector<int32_t>{0, 1, 6, 7, 8, 9, 10, 11});
  CHECK(sizes == std::vector<int64_t>{7, 8, 9, 10, 11, 8});
  // A ratio of the context compresses it at its end (3 of 6), then at positions 8 and 12.
  sizes.clear();
  CHECK(run("triattention:ratio=0.5,divide=4", &sizes) == std::vector<int32_t>{9, 10, 11});
  CHECK(sizes == std::vector<int64_t>{4, 3, 4, 5, 6, 3});
}

TEST_CASE("triattention refuses what it cannot do", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("triattention:ratio=0.5,context=pin"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("triattention:divide=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("triattention:offset_max=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("triattention:context=drop"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("triattention:budget=8,ratio=0.5"), InputError);
  CHECK_NOTHROW(resolve_method_spec("triattention:budget=8,context=pin"));
}
