// GraphKV (methods/graphkv.cpp): SnapKV's scores decayed over a key-cosine graph, so a
// near-duplicate of a kept token loses its place to a less attended, different one.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

// Seven tokens; the window is token 6, whose query (2, 0, 0, 0) at scale 1/2 gives logits
// k_t[0]: token 1 (2), token 2 (1.95, the same direction: cosine 1 with token 1) and token 3
// (1.8, but along (1.8, 3): cosine 0.51 with token 1); the others' keys are zero (logit 0,
// cosine 0). Attention ~ e^2 : e^1.95 : e^1.8 : 1 = 7.4 : 7.0 : 6.0 : 1.
testing::Chunk seven_tokens() {
  testing::Chunk c;
  c.n = 7;
  c.k.assign(7 * kDim, 0.f);
  c.v.assign(7 * kDim, 1.f);
  c.q.assign(7 * kHeads * kDim, 0.f);
  c.k[1 * kDim] = 2.f;
  c.k[2 * kDim] = 1.95f;
  c.k[3 * kDim] = 1.8f;
  c.k[3 * kDim + 1] = 3.f;
  for (int h = 0; h < kHeads; ++h) c.q[(6 * kHeads + h) * kDim] = 2.f;
  return c;
}

std::vector<int32_t> kept_of(const std::string& spec) {
  KvCache cache = make_cache(spec, KvShape{1, 1, kDim});
  testing::feed(cache, kHeads, seven_tokens());
  cache.end_context();
  return testing::kept(cache, 0, 0);
}

}  // namespace

TEST_CASE("graphkv drops a kept token's near-duplicate for a different token", "[unit]") {
  // Round 1 keeps token 1 and halves its most similar unselected token, token 2 (7.0 ->
  // 3.5); round 2 then prefers token 3 (6.0).
  CHECK(kept_of("graphkv:budget=3,window=1,kernel=1,rounds=2,neighbours=1,decay=0.5") ==
        std::vector<int32_t>{1, 3, 6});
  // SnapKV on the same attention keeps the two most attended.
  CHECK(kept_of("snapkv:budget=3,window=1,kernel=1") == std::vector<int32_t>{1, 2, 6});
  // One round, no neighbours or no decay: SnapKV's choice.
  CHECK(kept_of("graphkv:budget=3,window=1,kernel=1,rounds=1") == std::vector<int32_t>{1, 2, 6});
  CHECK(kept_of("graphkv:budget=3,window=1,kernel=1,neighbours=0") ==
        std::vector<int32_t>{1, 2, 6});
  CHECK(kept_of("graphkv:budget=3,window=1,kernel=1,decay=1") == std::vector<int32_t>{1, 2, 6});
  // A mild decay (7.0 * 0.9 = 6.3 > 6.0) leaves token 2 ahead.
  CHECK(kept_of("graphkv:budget=3,window=1,kernel=1,neighbours=1,decay=0.9") ==
        std::vector<int32_t>{1, 2, 6});
}

TEST_CASE("graphkv keeps its window, holds the budget per head and compresses once", "[unit]") {
  const KvShape shape{2, 2, kDim};
  KvCache cache = make_cache("graphkv:budget=9,window=4,rounds=3", shape);
  std::mt19937 rng(11);
  testing::feed(cache, kHeads * 2, testing::random_chunk(40, shape, kHeads * 2, rng));
  cache.end_context();
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t head = 0; head < 2; ++head) {
      const std::vector<int32_t> kept = testing::kept(cache, layer, head);
      REQUIRE(kept.size() == 9);
      CHECK(std::vector<int32_t>(kept.end() - 4, kept.end()) ==
            std::vector<int32_t>{36, 37, 38, 39});
    }
  }
  testing::feed(cache, kHeads * 2, testing::random_chunk(3, shape, kHeads * 2, rng));
  CHECK(cache.stats().tokens_per_layer[0] == 12);
}

TEST_CASE("graphkv refuses bad parameters", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("graphkv:rounds=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("graphkv:decay=1.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("graphkv:neighbours=-1"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("graphkv:kernel=4"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("graphkv:budget=8,window=16"), InputError);
}
