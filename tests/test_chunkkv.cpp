// ChunkKV (methods/chunkkv.cpp): whole chunks of consecutive tokens are kept or dropped,
// ranked by a token scorer averaged over the chunk.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

// Twelve tokens; keys along axis 0 of the given lengths, the rest 0; the last three tokens
// query along axis 0 (logit 2 x key length), so a longer key draws more attention.
testing::Chunk twelve_tokens(const std::vector<std::pair<int, float>>& keys) {
  testing::Chunk c;
  c.n = 12;
  c.k.assign(12 * kDim, 0.f);
  c.v.assign(12 * kDim, 1.f);
  c.q.assign(12 * kHeads * kDim, 0.f);
  for (const auto& [t, length] : keys) c.k[t * kDim] = length;
  for (int t = 9; t < 12; ++t) {
    for (int h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * kDim] = 4.f;
  }
  return c;
}

// Feeds each layer its own chunk (the same positions), then ends the context.
void feed_layers(KvCache& cache, const std::vector<testing::Chunk>& per_layer) {
  testing::feed_context_per_layer(cache, kHeads, per_layer);
}

// Chunks of 3 before the window {9, 10, 11}: {0-2} holds the most attended token 1
// (e^4 over e^0 twice), {3-5} one strong token 4 (e^3.6), {6-8} two moderate ones 7 and 8
// (e^3 each): by chunk mean {0-2} > {6-8} > {3-5}, though token 4 outranks 7 and 8 alone.
const std::vector<std::pair<int, float>> kKeys = {{1, 2.f}, {4, 1.8f}, {7, 1.5f}, {8, 1.5f}};

}  // namespace

TEST_CASE("chunkkv keeps the chunks with the highest mean window attention, whole", "[unit]") {
  const KvShape shape{1, 1, kDim};
  KvCache cache = make_cache("chunkkv:budget=9,window=3,kernel=1,chunk=3", shape);
  feed_layers(cache, {twelve_tokens(kKeys)});
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 2, 6, 7, 8, 9, 10, 11});
  CHECK(cache.stats().tokens_evicted == 3);

  // snapkv at the same budget keeps the top tokens instead, token 4 among them.
  KvCache snap = make_cache("snapkv:budget=9,window=3,kernel=1", shape);
  feed_layers(snap, {twelve_tokens(kKeys)});
  const std::vector<int32_t> snap_kept = testing::kept(snap, 0, 0);
  CHECK(std::find(snap_kept.begin(), snap_kept.end(), 4) != snap_kept.end());
}

TEST_CASE("chunkkv holds the budget: a chunk that does not fit is skipped", "[unit]") {
  const KvShape shape{1, 1, kDim};
  // Budget 8 = window 3 + 5: one chunk of 3 fits, the next does not.
  KvCache cache = make_cache("chunkkv:budget=8,window=3,kernel=1,chunk=3", shape);
  feed_layers(cache, {twelve_tokens(kKeys)});
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 2, 9, 10, 11});
  // Chunks of 4 over the prefix 0..8: {0-3}, {4-7} and the short {8}, which ranks first
  // (token 8 the most attended); budget 3 + 5 takes it and then {0-3}.
  KvCache short_last = make_cache("chunkkv:budget=8,window=3,kernel=1,chunk=4", shape);
  feed_layers(short_last, {twelve_tokens({{8, 2.5f}, {1, 2.f}})});
  CHECK(testing::kept(short_last, 0, 0) == std::vector<int32_t>{0, 1, 2, 3, 8, 9, 10, 11});
}

TEST_CASE("chunkkv scorer=knorm keeps the chunks of lowest mean key norm", "[unit]") {
  const KvShape shape{1, 1, kDim};
  // Norms 2 in chunk {0-2}, 1.8 at 4, 1.5 at 7 and 8: means 0.67, 0.6, 1.0, 0 for the
  // chunks {0-2}, {3-5}, {6-8}, {9-11}. Budget 6 keeps the two lowest: {9-11}, {3-5}.
  KvCache cache = make_cache("chunkkv:budget=6,chunk=3,scorer=knorm", shape);
  feed_layers(cache, {twelve_tokens(kKeys)});
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{3, 4, 5, 9, 10, 11});
}

TEST_CASE("chunkkv reuse=2: the second layer keeps the first layer's chunks", "[unit]") {
  const KvShape shape{2, 1, kDim};
  // Layer 1 on its own would keep {3-5}: its token 4 is the strongest.
  const std::vector<testing::Chunk> layers = {twelve_tokens(kKeys),
                                              twelve_tokens({{4, 3.f}})};
  const std::string spec = "chunkkv:budget=6,window=3,kernel=1,chunk=3";
  KvCache own = make_cache(spec, shape);
  feed_layers(own, layers);
  CHECK(testing::kept(own, 0, 0) == std::vector<int32_t>{0, 1, 2, 9, 10, 11});
  CHECK(testing::kept(own, 1, 0) == std::vector<int32_t>{3, 4, 5, 9, 10, 11});
  KvCache reused = make_cache(spec + ",reuse=2", shape);
  feed_layers(reused, layers);
  CHECK(testing::kept(reused, 0, 0) == std::vector<int32_t>{0, 1, 2, 9, 10, 11});
  CHECK(testing::kept(reused, 1, 0) == std::vector<int32_t>{0, 1, 2, 9, 10, 11});
}
