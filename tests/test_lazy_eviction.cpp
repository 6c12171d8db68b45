// LazyEviction (methods/lazy_eviction.cpp): per token, the last step its attention was high
// and its Maximum Recurrence Interval; eviction only at the end of the context and every
// `window` forwards, keeping the newest `window` and the highest MRI - idle.
#include <catch2/catch.hpp>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // two query heads over one KV head
constexpr int32_t kDim = 4;

// n tokens with the given keys (zero past the list) and every query equal to q.
testing::Chunk tokens(int64_t n, const std::vector<std::vector<float>>& keys,
                      const std::vector<float>& q) {
  testing::Chunk c;
  c.n = n;
  c.k.assign(n * kDim, 0.f);
  c.v.assign(c.k.size(), 1.f);
  c.q.assign(n * kHeads * kDim, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    if (t < static_cast<int64_t>(keys.size())) {
      std::copy(keys[t].begin(), keys[t].end(), c.k.begin() + t * kDim);
    }
    for (int32_t h = 0; h < kHeads; ++h) {
      std::copy(q.begin(), q.end(), c.q.begin() + (t * kHeads + h) * kDim);
    }
  }
  return c;
}

}  // namespace

TEST_CASE("lazy_eviction keeps recurring tokens and evicts once per window", "[unit]") {
  KvCache cache = make_cache("lazy_eviction:budget=5,window=2", KvShape{1, 1, kDim});
  // Context 0-7: the last query looks along channels 0 and 1, so 2 and 5 (spikes of 5) get
  // high attention (above 1/8), 3 (a spike of 2 on channel 0) some, the rest little.
  const std::vector<float> zero(kDim, 0.f);
  testing::feed(cache, kHeads,
                tokens(8, {zero, zero, {5, 0, 0, 0}, {2, 0, 0, 0}, zero, {0, 5, 0, 0}},
                       {1, 1, 0, 0}));
  cache.end_context();
  // The newest two (the window), 2 and 5 (high once: MRI 1, idle 0), then 3 among the
  // never-high ones by its latest attention.
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{2, 3, 5, 6, 7});

  // Decode queries look along channel 0 only: 2 stays high, 5 goes idle.
  const testing::Chunk step = tokens(1, {zero}, {1, 0, 0, 0});
  testing::decode_step(cache, kHeads, step);
  CHECK(cache.stats().tokens_per_layer[0] == 6);  // lagged: no eviction inside the window
  testing::decode_step(cache, kHeads, step);
  // Evicted at the window's end: newest 8, 9; 2 (MRI 1, idle 0); 5 (MRI 1, idle 2) and 3
  // (never high, idle 3) before 6 and 7 (never high, idle 3, less attention than 3).
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{2, 3, 5, 8, 9});
}

TEST_CASE("lazy_eviction ranks an overdue token between recurring and never-high ones", "[unit]") {
  // Budget 4 = window 2 + two: after the same steps 2 (MRI 1, idle 0) ranks first and 5
  // (MRI 1, idle 2: overdue) second, over 6 and 7 (never high, idle 3), though the current
  // query gives 5, 6 and 7 the same attention.
  KvCache cache = make_cache("lazy_eviction:budget=4,window=2", KvShape{1, 1, kDim});
  const std::vector<float> zero(kDim, 0.f);
  testing::feed(cache, kHeads,
                tokens(8, {zero, zero, {5, 0, 0, 0}, {2, 0, 0, 0}, zero, {0, 5, 0, 0}},
                       {1, 1, 0, 0}));
  cache.end_context();
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{2, 5, 6, 7});
  const testing::Chunk step = tokens(1, {zero}, {1, 0, 0, 0});
  testing::decode_step(cache, kHeads, step);
  testing::decode_step(cache, kHeads, step);
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{2, 5, 8, 9});
}

TEST_CASE("lazy_eviction refuses a zero window and a budget given twice", "[unit]") {
  const KvShape shape{1, 1, kDim};
  CHECK_THROWS(make_cache("lazy_eviction:window=0", shape));
  CHECK_THROWS(make_cache("lazy_eviction:budget=8,ratio=0.5", shape));
  CHECK_THROWS(make_cache("lazy_eviction:alpha=-1", shape));
  CHECK_NOTHROW(make_cache("lazy_eviction:ratio=0.5,window=16,alpha=2", shape));
}
