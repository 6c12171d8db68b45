// SAGE-KV (methods/sage_kv.cpp): at the end of the context each KV head keeps the sinks, the
// top-k middle tokens by the last prompt token's attention and the recent window; decode
// tokens then push the window's oldest out (FIFO) while the selection stays.
#include <catch2/catch.hpp>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 4;  // two query heads over each of two KV heads
constexpr int32_t kDim = 4;
constexpr int64_t kContext = 16;

// A context whose keys are zero except a spike along channel 0 at `hits` (KV head 0) and
// at `hits1` (KV head 1), the larger spikes first; every query looks along channel 0.
testing::Chunk spiked_context(const std::vector<int32_t>& hits0, const std::vector<int32_t>& hits1) {
  testing::Chunk c;
  c.n = kContext;
  c.k.assign(kContext * 2 * kDim, 0.f);
  c.v.assign(c.k.size(), 1.f);
  c.q.assign(kContext * kHeads * kDim, 0.f);
  const std::vector<int32_t>* hits[2] = {&hits0, &hits1};
  for (int32_t g = 0; g < 2; ++g) {
    float spike = 8.f;
    for (int32_t t : *hits[g]) {
      c.k[(t * 2 + g) * kDim] = spike;
      spike -= 1.f;
    }
  }
  for (int64_t t = 0; t < kContext; ++t) {
    for (int32_t h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * kDim] = 1.f;
  }
  return c;
}

testing::Chunk one_token(float key) {
  testing::Chunk c;
  c.n = 1;
  c.k.assign(2 * kDim, 0.f);
  c.k[0] = key;
  c.k[kDim] = key;
  c.v.assign(c.k.size(), 1.f);
  c.q.assign(kHeads * kDim, 0.f);
  for (int32_t h = 0; h < kHeads; ++h) c.q[h * kDim] = 1.f;
  return c;
}

}  // namespace

TEST_CASE("sage_kv keeps sinks, each head's top-k by the last query and the window", "[unit]") {
  const KvShape shape{1, 2, kDim};
  // budget 8 = sink 2 + top-3 + recent 3.
  KvCache cache = make_cache("sage_kv:budget=8,sink=2,recent=3", shape);
  // Spikes at 5, 9, 11 (and a smaller one at 7) in head 0; at 3, 6, 8 (smaller at 10) in head 1.
  testing::feed(cache, kHeads, spiked_context({5, 9, 11, 7}, {3, 6, 8, 10}));
  cache.end_context();
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 5, 9, 11, 13, 14, 15});
  CHECK(testing::kept(cache, 0, 1) == std::vector<int32_t>{0, 1, 3, 6, 8, 13, 14, 15});

  // Decode: the new tokens enter the window, the window's oldest leave, nothing is rescored
  // (a decode token whose key the query likes most does not displace the selection).
  testing::decode_step(cache, kHeads, one_token(20.f));
  testing::decode_step(cache, kHeads, one_token(0.f));
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 5, 9, 11, 15, 16, 17});
  CHECK(testing::kept(cache, 0, 1) == std::vector<int32_t>{0, 1, 3, 6, 8, 15, 16, 17});
  CHECK(cache.stats().tokens_per_layer[0] == 8);
}

TEST_CASE("sage_kv with a budget above the context keeps it, then slides the newest", "[unit]") {
  const KvShape shape{1, 2, kDim};
  KvCache cache = make_cache("sage_kv:budget=18,sink=2,recent=3", shape);
  testing::feed(cache, kHeads, spiked_context({5}, {6}));
  cache.end_context();
  CHECK(cache.stats().tokens_evicted == 0);
  for (int i = 0; i < 4; ++i) testing::decode_step(cache, kHeads, one_token(0.f));
  // 20 tokens over a budget of 18: the context before its window (0-12) stays, the window
  // (13-15) and the decode tokens (16-19) share the 5 places left, newest first.
  std::vector<int32_t> expected;
  for (int32_t p = 0; p <= 12; ++p) expected.push_back(p);
  for (int32_t p = 15; p <= 19; ++p) expected.push_back(p);
  CHECK(testing::kept(cache, 0, 0) == expected);
  CHECK(testing::kept(cache, 0, 1) == expected);
}

TEST_CASE("sage_kv refuses a zero window and a budget given twice", "[unit]") {
  const KvShape shape{1, 2, kDim};
  CHECK_THROWS(make_cache("sage_kv:recent=0", shape));
  CHECK_THROWS(make_cache("sage_kv:budget=8,ratio=0.5", shape));
  CHECK_THROWS(make_cache("sage_kv:sink=-1", shape));
  CHECK_NOTHROW(make_cache("sage_kv:ratio=0.5", shape));
}
