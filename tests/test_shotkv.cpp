// ShotKV (methods/shotkv.cpp): the context's segments are kept or dropped whole, by their
// mean window attention; tokens past the context are capped at `decode_budget`.
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

// Ten tokens, the window is token 9, whose query (2, 0, 0, 0) at scale 1/2 gives logits
// k_t[0]: token 4 gets 3 (e^3 = 20), tokens 6, 7, 8 get 1.5 (4.5 each), the rest 0 (1).
// Segments [0, 3), [3, 6), [6, 9): means 1, (20 + 2) / 3 = 7.3, 4.5.
testing::Chunk ten_tokens() {
  testing::Chunk c;
  c.n = 10;
  c.k.assign(10 * kDim, 0.f);
  c.v.assign(10 * kDim, 1.f);
  c.q.assign(10 * kHeads * kDim, 0.f);
  c.k[4 * kDim] = 3.f;
  for (int t = 6; t < 9; ++t) c.k[t * kDim] = 1.5f;
  for (int h = 0; h < kHeads; ++h) c.q[(9 * kHeads + h) * kDim] = 2.f;
  return c;
}

// The ten tokens' texts: "x" but `ends` at tokens 2, 5 and 8, "x" elsewhere.
std::vector<std::string> texts(const std::string& end_2, const std::string& end_5,
                               const std::string& end_8) {
  std::vector<std::string> t(10, "x");
  t[2] = end_2;
  t[5] = end_5;
  t[8] = end_8;
  return t;
}

// Kept positions; `token_texts` empty: none told.
std::vector<int32_t> kept_of(const std::string& spec, const std::vector<std::string>& token_texts) {
  KvCache cache = make_cache(spec, KvShape{1, 1, kDim});
  testing::feed(cache, kHeads, ten_tokens());
  if (!token_texts.empty()) cache.show_context_text(token_texts);
  cache.end_context();
  return testing::kept(cache, 0, 0);
}

}  // namespace

TEST_CASE("shotkv keeps whole segments by their mean attention", "[unit]") {
  const std::vector<std::string> shots = texts(".\n", "x\n\n", "\n");
  // Room for three: the middle segment whole, not SnapKV's three best tokens 4, 6, 7.
  CHECK(kept_of("shotkv:budget=4,window=1", shots) == std::vector<int32_t>{3, 4, 5, 9});
  CHECK(kept_of("snapkv:budget=4,window=1,kernel=1", shots) == std::vector<int32_t>{4, 6, 7, 9});
  // Room for four: the second segment does not fit after the first; nothing is cut.
  CHECK(kept_of("shotkv:budget=5,window=1", shots) == std::vector<int32_t>{3, 4, 5, 9});
  // Room for six: both.
  CHECK(kept_of("shotkv:budget=7,window=1", shots) == std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9});
  // Two segments: [3, 9) (mean (20 + 2 + 13.5) / 6 = 5.9) beats [0, 3) (1) and fits in six.
  CHECK(kept_of("shotkv:budget=7,window=1", texts("\n", "x", "x")) ==
        std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9});
  // The window cuts the last segment: its prefix part competes alone.
  CHECK(kept_of("shotkv:budget=4,window=2", shots) == std::vector<int32_t>{6, 7, 8, 9});
  // No segments told: every token its own, SnapKV's choice without pooling.
  CHECK(kept_of("shotkv:budget=4,window=1", {}) == std::vector<int32_t>{4, 6, 7, 9});
}

TEST_CASE("shotkv splits one-line items with split=item", "[unit]") {
  // One line of items ending in commas: one segment of nine for split=line, which does not
  // fit, so only the window stays; three items for split=item.
  const std::vector<std::string> items = texts("\",", "\", ", ";");
  CHECK(kept_of("shotkv:budget=4,window=1", items) == std::vector<int32_t>{9});
  CHECK(kept_of("shotkv:budget=4,window=1,split=item", items) == std::vector<int32_t>{3, 4, 5, 9});
}

TEST_CASE("shotkv caps the tokens after the context, keeping the context and the newest",
          "[unit]") {
  const KvShape shape{2, 2, kDim};
  KvCache cache = make_cache("shotkv:budget=100,decode_budget=3", shape);
  std::mt19937 rng(3);
  testing::feed(cache, kHeads * 2, testing::random_chunk(12, shape, kHeads * 2, rng));
  cache.end_context();
  for (int step = 0; step < 6; ++step) {
    testing::decode_step(cache, kHeads * 2, testing::random_chunk(1, shape, kHeads * 2, rng));
  }
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t head = 0; head < 2; ++head) {
      const std::vector<int32_t> kept = testing::kept(cache, layer, head);
      REQUIRE(kept.size() == 15);
      for (int32_t p = 0; p < 12; ++p) CHECK(kept[p] == p);
      CHECK(kept.back() == 17);
    }
  }
  // decode_budget=0: all kept.
  KvCache all = make_cache("shotkv:budget=100,decode_budget=0", shape);
  testing::feed(all, kHeads * 2, testing::random_chunk(12, shape, kHeads * 2, rng));
  all.end_context();
  for (int step = 0; step < 6; ++step) {
    testing::decode_step(all, kHeads * 2, testing::random_chunk(1, shape, kHeads * 2, rng));
  }
  CHECK(all.stats().tokens_per_layer[0] == 18);
}

TEST_CASE("shotkv refuses bad parameters", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("shotkv:budget=8,window=16"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("shotkv:decode_budget=-1"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("shotkv:window=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("shotkv:split=comma"), InputError);
}
