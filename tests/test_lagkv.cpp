// LagKV (methods/lagkv.cpp): each `lag`-token partition ranked by the spread of its keys and
// values normalised by the next partition's per-channel range; sinks and the last
// partition kept; a context too short for a reference keeps the sinks and the newest.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

// Against a partition holding all four, per-channel ranges are [0, 3], [0, 1], [0, 3],
// [0, 1]: A normalises to (1, 0, 1, 0), C to (1/3, 1, 1/3, 1), B to (0, .5, 0, .5), D to 0,
// so their spreads rank A > C > B > D.
const std::vector<float> kA = {3, 0, 3, 0}, kB = {0, 0.5f, 0, 0.5f}, kC = {1, 1, 1, 1},
                         kD = {0, 0, 0, 0};

}  // namespace

TEST_CASE("lagkv keeps each partition's most spread tokens, the sink and the last partition",
          "[unit]") {
  const KvShape shape{1, 1, kDim};
  // sink 1, lag 4: partitions 1-4 (against 5-8), 5-8 (against 9-12), 9-12 kept whole.
  KvCache cache = make_cache("lagkv:budget=9,sink=1,lag=4", shape);
  const std::vector<std::vector<float>> rows = {
      {5, 5, 5, 5},               // the sink
      kA,           kB, kC, kD,   // positions 1-4: A at 1, C at 3
      kD,           kC, kB, kA,   // positions 5-8: C at 6, A at 8
      kB,           kD, kA, kC};  // positions 9-12: the last partition
  testing::Chunk c;
  c.n = static_cast<int64_t>(rows.size());
  for (const auto& r : rows) {
    c.k.insert(c.k.end(), r.begin(), r.end());
    c.v.insert(c.v.end(), r.begin(), r.end());
  }
  c.q.assign(c.n * kHeads * kDim, 0.f);
  testing::feed(cache, kHeads, c);
  cache.end_context();
  // Two tokens of each scored partition (ranks 3/4 and 2/4), the sink, the last partition.
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 3, 6, 8, 9, 10, 11, 12});
  CHECK(cache.stats().tokens_evicted == 4);
}

TEST_CASE("lagkv on a context shorter than sink + 2 lag keeps the sinks and the newest", "[unit]") {
  const KvShape shape{2, 2, kDim};
  KvCache cache = make_cache("lagkv:budget=8", shape);  // sink 4, lag 128
  std::mt19937 rng(3);
  testing::feed(cache, kHeads * 2, testing::random_chunk(20, shape, kHeads * 2, rng));
  cache.end_context();
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t head = 0; head < 2; ++head) {
      CHECK(testing::kept(cache, layer, head) == std::vector<int32_t>{0, 1, 2, 3, 16, 17, 18, 19});
    }
  }
}
