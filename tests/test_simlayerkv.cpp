// SimLayerKV (methods/simlayerkv.cpp): a layer whose last context query puts more than
// `threshold` of its attention on the sinks and the recent window keeps only those
// (StreamingLLM); any other layer keeps the whole context.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // two query heads over one KV head
constexpr int32_t kDim = 4;
constexpr int64_t kContext = 20;

// A context whose last query (score 5 * k0 per key, from q = (10, 0, 0, 0) / sqrt(4)) looks
// at the keys with k0 = 2 and almost nowhere else (e^10 against e^0).
testing::Chunk context_looking_at(const std::vector<int32_t>& looked_at) {
  testing::Chunk c;
  c.n = kContext;
  c.k.assign(kContext * kDim, 0.f);
  c.v.assign(kContext * kDim, 1.f);
  c.q.assign(kContext * kHeads * kDim, 0.f);
  for (int32_t p : looked_at) c.k[p * kDim] = 2.f;
  for (int32_t h = 0; h < kHeads; ++h) c.q[((kContext - 1) * kHeads + h) * kDim] = 10.f;
  return c;
}

// Layer 0 lazy: its last query looks at the 2 sinks and the 4 newest, what budget=6 keeps.
// Layer 1 not: it looks at positions 5-10.
const std::vector<testing::Chunk>& two_layers() {
  static const std::vector<testing::Chunk> chunks = {
      context_looking_at({0, 1, 16, 17, 18, 19}), context_looking_at({5, 6, 7, 8, 9, 10})};
  return chunks;
}

std::vector<int32_t> all_positions(int64_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

}  // namespace

TEST_CASE("simlayerkv: the lazy layer becomes sink + recent, the other keeps everything",
          "[simlayerkv]") {
  const KvShape shape{2, 1, kDim};
  for (const char* spec : {"simlayerkv:budget=6,sink=2", "simlayerkv:ratio=0.3,sink=2"}) {
    INFO(spec);
    KvCache cache = make_cache(spec, shape);
    testing::feed_context_per_layer(cache, kHeads, two_layers());
    CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 16, 17, 18, 19});
    CHECK(testing::kept(cache, 1, 0) == all_positions(kContext));
    CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{6, kContext});
    CHECK(cache.stats().tokens_evicted == kContext - 6);
    // Decided once: later tokens are appended in both layers.
    std::mt19937 rng(5);
    testing::decode_step(cache, kHeads, testing::random_chunk(1, shape, kHeads, rng));
    CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{7, kContext + 1});
  }
}

TEST_CASE("simlayerkv: threshold 0 makes every layer lazy, 1 none", "[simlayerkv]") {
  const KvShape shape{2, 1, kDim};
  KvCache all_lazy = make_cache("simlayerkv:budget=6,sink=2,threshold=0", shape);
  testing::feed_context_per_layer(all_lazy, kHeads, two_layers());
  CHECK(all_lazy.stats().tokens_per_layer == std::vector<int64_t>{6, 6});
  CHECK(testing::kept(all_lazy, 1, 0) == std::vector<int32_t>{0, 1, 16, 17, 18, 19});

  KvCache none = make_cache("simlayerkv:budget=6,sink=2,threshold=1", shape);
  testing::feed_context_per_layer(none, kHeads, two_layers());
  CHECK(none.stats().tokens_per_layer == std::vector<int64_t>{kContext, kContext});
  CHECK(none.stats().tokens_evicted == 0);
}

TEST_CASE("simlayerkv: the test sums over the window it would keep", "[simlayerkv]") {
  // With sink=1 the lazy set is position 0 and 15-19: layer 0's query still puts 5/6 of
  // its attention there (0 and 16-19 of 0, 1, 16-19): lazy at 0.8, not at the default 0.85.
  const KvShape shape{2, 1, kDim};
  KvCache low = make_cache("simlayerkv:budget=6,sink=1,threshold=0.8", shape);
  testing::feed_context_per_layer(low, kHeads, two_layers());
  CHECK(testing::kept(low, 0, 0) == std::vector<int32_t>{0, 15, 16, 17, 18, 19});
  CHECK(testing::kept(low, 1, 0) == all_positions(kContext));
  KvCache high = make_cache("simlayerkv:budget=6,sink=1", shape);
  testing::feed_context_per_layer(high, kHeads, two_layers());
  CHECK(high.stats().tokens_per_layer == std::vector<int64_t>{kContext, kContext});
}

TEST_CASE("simlayerkv: a context within the budget is kept whole", "[simlayerkv]") {
  const KvShape shape{2, 1, kDim};
  KvCache cache = make_cache("simlayerkv:budget=20,sink=2,threshold=0", shape);
  testing::feed_context_per_layer(cache, kHeads, two_layers());
  CHECK(cache.stats().tokens_evicted == 0);
}

TEST_CASE("simlayerkv: parameter refusals", "[simlayerkv]") {
  const KvShape shape{2, 1, kDim};
  CHECK_THROWS_AS(resolve_method_spec("simlayerkv:budget=4,sink=4"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("simlayerkv:threshold=1.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("simlayerkv:threshold=-0.1"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("simlayerkv:n_last=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("simlayerkv:budget=8,ratio=0.5"), InputError);
  CHECK_NOTHROW(make_cache("simlayerkv:ratio=0.5", shape));
}
