// Expected Attention (methods/expected_attention.cpp): the context queries' mean and
// covariance before RoPE, carried to the future positions by the mean RoPE, give each token
// its expected attention, times ||v||; the first `sink` tokens kept.
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

// n tokens with zero keys, unit values along axis 3, zero queries.
testing::Chunk blank(int64_t n) {
  testing::Chunk c;
  c.n = n;
  c.k.assign(n * kDim, 0.f);
  c.v.assign(n * kDim, 0.f);
  c.q.assign(n * kHeads * kDim, 0.f);
  for (int64_t t = 0; t < n; ++t) c.v[t * kDim + 3] = 1.f;
  return c;
}

void set(std::vector<float>& x, int64_t row, std::vector<float> values) {
  std::copy(values.begin(), values.end(), x.begin() + row * kDim);
}

std::vector<int32_t> kept_after(const std::string& spec, const KvShape& shape,
                                const testing::Chunk& c) {
  KvCache cache = make_cache(spec, shape);
  testing::feed(cache, kHeads, c);
  cache.end_context();
  return testing::kept(cache, 0, 0);
}

}  // namespace

TEST_CASE("expected_attention keeps the keys the queries' mean points at, scaled by ||v||",
          "[unit]") {
  const KvShape shape{1, 1, kDim};  // no RoPE: queries are taken as they are
  testing::Chunk c = blank(8);
  for (int64_t t = 0; t < 8; ++t) {
    for (int h = 0; h < kHeads; ++h) set(c.q, t * kHeads + h, {2, 0, 0, 0});
  }
  set(c.k, 0, {-4, 0, 0, 0});  // the sink: kept though the queries point away
  set(c.k, 2, {3, 0, 0, 0});
  set(c.k, 5, {3, 0, 0, 0});
  set(c.k, 6, {2, 0, 0, 0});
  set(c.v, 5, {0, 0, 0, 0});  // attended, but its value is zero
  CHECK(kept_after("expected_attention:budget=3,sink=1", shape, c) ==
        std::vector<int32_t>{0, 2, 6});
  // Without the value norm token 5 is as good as token 2.
  CHECK(kept_after("expected_attention:budget=3,sink=1,vnorm=off", shape, c) ==
        std::vector<int32_t>{0, 2, 5});
}

TEST_CASE("expected_attention's covariance favours keys along the queries' spread", "[unit]") {
  const KvShape shape{1, 1, kDim};
  // Queries alternate +-3 along axis 0: mean zero, variance 9 along axis 0 only.
  testing::Chunk c = blank(10);
  for (int64_t t = 0; t < 10; ++t) {
    for (int h = 0; h < kHeads; ++h) set(c.q, t * kHeads + h, {t % 2 ? 3.f : -3.f, 0, 0, 0});
  }
  set(c.k, 3, {-2, 0, 0, 0});  // along the spread, either sign
  set(c.k, 7, {2, 0, 0, 0});
  set(c.k, 4, {0, 2, 0, 0});  // as long, across it
  set(c.k, 8, {0, 0, 2, 0});
  // sink 0; the statistics take every row (10, an even count: the mean is exactly 0).
  CHECK(kept_after("expected_attention:budget=2,sink=0", shape, c) == std::vector<int32_t>{3, 7});
  // Mean alone (zero) scores every token alike: the ties keep the lowest slots.
  CHECK(kept_after("expected_attention:budget=2,sink=0,covariance=off", shape, c) ==
        std::vector<int32_t>{0, 1});
}

TEST_CASE("expected_attention turns the queries back before RoPE and forward to the future",
          "[unit]") {
  KvShape shape{1, 1, kDim};
  shape.rope_inv_freq = {1.f, 0.25f};
  // Every query is q* = (3, 0, 0, 0) before RoPE, turned to its position as the model does.
  const int64_t n = 9;
  testing::Chunk c = blank(n);
  for (int64_t t = 0; t < n; ++t) {
    const double angle = static_cast<double>(t) * shape.rope_inv_freq[0];
    for (int h = 0; h < kHeads; ++h) {
      set(c.q, t * kHeads + h,
          {static_cast<float>(3 * std::cos(angle)), static_cast<float>(3 * std::sin(angle)), 0, 0});
    }
  }
  // With future=1 the next query (position 9) is q* turned by 9 rad: token 4's key points
  // along it, token 6's the opposite way, token 2's along q* unturned. Token 7's points
  // where the RoPE'd queries' own mean (positions 1-8: angle 4.5 + pi) lands when turned by
  // 9 rad: statistics that skipped turning the queries back would keep it.
  const float c9 = static_cast<float>(std::cos(9.0)), s9 = static_cast<float>(std::sin(9.0));
  const double naive = 4.5 + M_PI + 9.0;
  set(c.k, 4, {2 * c9, 2 * s9, 0, 0});
  set(c.k, 6, {-2 * c9, -2 * s9, 0, 0});
  set(c.k, 2, {2, 0, 0, 0});
  set(c.k, 7,
      {static_cast<float>(2 * std::cos(naive)), static_cast<float>(2 * std::sin(naive)), 0, 0});
  CHECK(kept_after("expected_attention:budget=2,sink=1,future=1", shape, c) ==
        std::vector<int32_t>{0, 4});
  CHECK(kept_after("expected_attention:budget=2,sink=1,future=1,covariance=off", shape, c) ==
        std::vector<int32_t>{0, 4});
}
