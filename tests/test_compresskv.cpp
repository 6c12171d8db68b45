// CompressKV (methods/compresskv.cpp): each layer's tokens are chosen by the `first_k` query
// heads whose window attention the budget holds best, and shared by all KV heads.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kKvHeads = 2;
constexpr int32_t kHeads = 4;  // two query heads per KV head
constexpr int32_t kDim = 4;

// Six tokens, the window is token 5 (keys zero elsewhere), scale 1/2. The window's query heads:
// - head 0 (KV head 0) q = (2, 0, 0, 0) over KV head 0's token 2 key (4, 0, 0, 0): logit 4,
//   attention 0.92 on token 2;
// - head 1 (KV head 0) q = 0: uniform, 1/6 each;
// - heads 2, 3 (KV head 1) q = (0, 2, 0, 0) over KV head 1's token 1 key (0, 2.5, 0, 0):
//   0.71 on token 1, 0.06 on each other token.
// With one prefix token kept, head 0 holds the most (0.92), then heads 2, 3 (0.71), head 1
// (0.17). Averaged over all four, token 1 (0.40) beats token 2 (0.30).
testing::Chunk six_tokens() {
  testing::Chunk c;
  c.n = 6;
  c.k.assign(6 * kKvHeads * kDim, 0.f);
  c.v.assign(6 * kKvHeads * kDim, 1.f);
  c.q.assign(6 * kHeads * kDim, 0.f);
  c.k[(2 * kKvHeads + 0) * kDim + 0] = 4.f;
  c.k[(1 * kKvHeads + 1) * kDim + 1] = 2.5f;
  c.q[(5 * kHeads + 0) * kDim + 0] = 2.f;
  c.q[(5 * kHeads + 2) * kDim + 1] = 2.f;
  c.q[(5 * kHeads + 3) * kDim + 1] = 2.f;
  return c;
}

// The kept positions of both KV heads, which must agree.
std::vector<int32_t> kept_of(const std::string& spec) {
  KvCache cache = make_cache(spec, KvShape{1, kKvHeads, kDim});
  testing::feed(cache, kHeads, six_tokens());
  cache.end_context();
  const std::vector<int32_t> kept = testing::kept(cache, 0, 0);
  CHECK(testing::kept(cache, 0, 1) == kept);
  return kept;
}

}  // namespace

TEST_CASE("compresskv lets the most concentrated heads choose one set for every KV head",
          "[unit]") {
  // Head 0 alone: token 2, in both KV heads.
  CHECK(kept_of("compresskv:budget=2,window=1,kernel=1,first_k=1") == std::vector<int32_t>{2, 5});
  // Heads 0 and 2: (0.92 + 0.06) / 2 for token 2 against (0.02 + 0.71) / 2 for token 1.
  CHECK(kept_of("compresskv:budget=2,window=1,kernel=1,first_k=2") == std::vector<int32_t>{2, 5});
  // All four heads (head 1's uniform attention counts): token 1.
  CHECK(kept_of("compresskv:budget=2,window=1,kernel=1,first_k=4") == std::vector<int32_t>{1, 5});
  // More heads than the model has: all of them.
  CHECK(kept_of("compresskv:budget=2,window=1,kernel=1,first_k=9") == std::vector<int32_t>{1, 5});
  // SnapKV instead keeps each KV head's own choice.
  KvCache snap = make_cache("snapkv:budget=2,window=1,kernel=1", KvShape{1, kKvHeads, kDim});
  testing::feed(snap, kHeads, six_tokens());
  snap.end_context();
  CHECK(testing::kept(snap, 0, 0) == std::vector<int32_t>{2, 5});
  CHECK(testing::kept(snap, 0, 1) == std::vector<int32_t>{1, 5});
}

TEST_CASE("compresskv keeps its window, holds the budget and compresses once", "[unit]") {
  const KvShape shape{2, 2, kDim};
  KvCache cache = make_cache("compresskv:budget=10", shape);  // the authors' window 8
  std::mt19937 rng(7);
  testing::feed(cache, kHeads, testing::random_chunk(40, shape, kHeads, rng));
  cache.end_context();
  for (int32_t layer = 0; layer < 2; ++layer) {
    const std::vector<int32_t> kept = testing::kept(cache, layer, 0);
    REQUIRE(kept.size() == 10);
    CHECK(testing::kept(cache, layer, 1) == kept);
    CHECK(std::vector<int32_t>(kept.end() - 8, kept.end()) ==
          std::vector<int32_t>{32, 33, 34, 35, 36, 37, 38, 39});
  }
  testing::feed(cache, kHeads, testing::random_chunk(3, shape, kHeads, rng));
  CHECK(cache.stats().tokens_per_layer[0] == 13);
}

TEST_CASE("compresskv refuses bad parameters", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("compresskv:first_k=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("compresskv:kernel=4"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("compresskv:budget=4"), InputError);  // below window 8
}
