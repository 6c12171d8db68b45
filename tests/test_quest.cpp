// Quest (methods/quest.cpp): which pages a decode step reads, that a budget covering the
// context is exact, and the bytes it reports reading.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "kernels/cpu/attention.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 4;

// Feeds the same context and decode steps to every cache; returns each cache's last
// attention outputs of every layer for the final step.
std::vector<std::vector<float>> run_same(std::vector<KvCache*> caches, const KvShape& shape,
                                         int64_t context, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  const testing::Chunk c = testing::random_chunk(context, shape, kHeads, rng);
  for (KvCache* cache : caches) {
    testing::feed(*cache, kHeads, c);
    cache->end_context();
  }
  std::vector<std::vector<float>> outputs(caches.size());
  for (int s = 0; s < steps; ++s) {
    const testing::Chunk step = testing::random_chunk(1, shape, kHeads, rng);
    for (size_t i = 0; i < caches.size(); ++i) {
      KvCache& cache = *caches[i];
      const int32_t position = cache.next_position();
      cache.mark_decode_step();
      outputs[i].assign(shape.n_layers * kHeads * shape.head_dim, 0.f);
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        cache.append(l, step.k.data(), step.v.data(), &position, 1);
        cache.attend(
            l, AttentionQuery{step.q.data(), &position,
                              outputs[i].data() + l * kHeads * shape.head_dim, 1, kHeads, 0.25f});
      }
      cache.advance(1);
    }
  }
  return outputs;
}

}  // namespace

TEST_CASE("quest with a budget covering the context is the full cache, bit for bit", "[unit]") {
  const KvShape shape{4, 2, 16};
  KvCache full = make_full_cache(shape);
  KvCache quest = make_cache("quest:budget=4096", shape);
  const auto out = run_same({&full, &quest}, shape, 300, 5, 1);
  CHECK(out[0] == out[1]);
  CHECK(quest.stats().bytes_read_last_forward == full.stats().bytes_read_last_forward);
}

TEST_CASE("quest reads the budget's pages past the dense layers, the rest whole", "[unit]") {
  const KvShape shape{4, 2, 16};
  KvCache full = make_full_cache(shape);
  KvCache quest = make_cache("quest:budget=64,page=16", shape);
  const auto out = run_same({&full, &quest}, shape, 300, 3, 2);
  const int64_t n = 303, token_bytes = 2 * 16 * 4 + 4;
  const int64_t pages = (n + 15) / 16;
  // Layers 0-1 read everything; layers 2-3 read 4 pages (the newest holds 303 - 19 * 16 = 15
  // tokens) and the page bounds of all pages.
  const int64_t dense = 2 * 2 * n * token_bytes;
  const int64_t sparse = 2 * 2 * ((3 * 16 + 15) * token_bytes + pages * 2 * 16 * 4);
  const int64_t full_read = 4 * 2 * n * token_bytes;
  CHECK(full.stats().bytes_read_last_forward == full_read);
  CHECK(quest.stats().bytes_read_last_forward == dense + sparse);
  // The dense layers are the full cache's; the sparse ones differ, but not wildly.
  const size_t per_layer = kHeads * 16;
  for (size_t i = 0; i < 2 * per_layer; ++i) REQUIRE(out[1][i] == out[0][i]);
  double diff = 0;
  for (size_t i = 2 * per_layer; i < out[0].size(); ++i) diff += std::abs(out[1][i] - out[0][i]);
  CHECK(diff > 0);
  // Memory: all KV stays, plus the page bounds.
  CHECK(quest.stats().bytes_resident > full.stats().bytes_resident);
  CHECK(quest.stats().tokens_per_layer == full.stats().tokens_per_layer);
}

TEST_CASE("quest reads the pages with the highest bound, and the newest page", "[unit]") {
  // One KV head, one layer past the dense ones: a page whose keys point along the query
  // must be read; others, pointing away, must not.
  const KvShape shape{1, 1, 16};
  KvCache quest = make_cache("quest:budget=32,page=16,dense_layers=0,min_pages=1", shape);
  KvCache full = make_full_cache(shape);
  testing::Chunk c;
  c.n = 160;  // 10 pages
  c.k.assign(160 * 16, -1.f);
  c.v.assign(160 * 16, 0.f);
  c.q.assign(160 * kHeads * 16, 0.f);
  for (int t = 64; t < 80; ++t) {  // page 4: keys along +1, values 1
    for (int d = 0; d < 16; ++d) c.k[t * 16 + d] = 1.f;
    c.v[t * 16] = 1.f;
  }
  for (KvCache* cache : {&quest, &full}) {
    testing::feed(*cache, kHeads, c);
    cache->end_context();
  }
  std::vector<float> q(kHeads * 16, 1.f), out(q.size()), expected(q.size());
  std::vector<float> k(16, -1.f), v(16, 0.f);
  const int32_t position = 160;
  quest.mark_decode_step();
  quest.append(0, k.data(), v.data(), &position, 1);
  quest.attend(0, AttentionQuery{q.data(), &position, out.data(), 1, kHeads, 0.25f});
  // Reading pages 4 and 10 (the newest, one token) only: the reference over those slots.
  const std::vector<int32_t> pages = {4, 10};
  full.append(0, k.data(), v.data(), &position, 1);
  attention_pages_reference(AttentionQuery{q.data(), &position, expected.data(), 1, kHeads, 0.25f},
                            full.layer(0).view(), PageSelection{pages.data(), 2, 16});
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(expected[i]).margin(1e-5));
  CHECK(out[0] > 0.99f);
}

TEST_CASE("quest reads at least min_pages pages, 3 by default as Quest's controller", "[unit]") {
  const KvShape shape{3, 2, 16};
  const int64_t n = 301, token_bytes = 2 * 16 * 4 + 4, n_pages = (n + 15) / 16;
  const int64_t dense = 2 * 2 * n * token_bytes, bounds = 2 * n_pages * 2 * 16 * 4;
  // 301 tokens: the newest page holds 301 - 18 * 16 = 13 of them.
  for (const auto& [spec, pages] : std::vector<std::pair<std::string, int64_t>>{
           {"quest:budget=16", 3}, {"quest:budget=16,min_pages=1", 1},
           {"quest:budget=80", 5}, {"quest:budget=80,min_pages=7", 7}}) {
    INFO(spec);
    KvCache quest = make_cache(spec, shape);
    run_same({&quest}, shape, 300, 1, 3);
    CHECK(quest.stats().bytes_read_last_forward ==
          dense + 2 * ((pages - 1) * 16 + 13) * token_bytes + bounds);
  }
}

TEST_CASE("quest reads every page in prefill, one-token chunks and queries included", "[unit]") {
  // A 1025-token context fed as 512 + 512 + 1 (the model's chunks), then a one-token turn
  // query: all prefill, so all the full cache's. Only a decode step selects pages.
  const KvShape shape{4, 2, 16};
  std::mt19937 rng(9);
  const testing::Chunk all = testing::random_chunk(1027, shape, kHeads, rng);
  KvCache full = make_full_cache(shape);
  KvCache quest = make_cache("quest:budget=256", shape);
  std::vector<std::vector<float>> out(2);
  for (const auto& [from, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 512}, {512, 512}, {1024, 1}}) {
    const testing::Chunk c = testing::slice(all, from, n, shape, kHeads);
    out[0] = testing::feed(full, kHeads, c);
    out[1] = testing::feed(quest, kHeads, c);
    REQUIRE(out[0] == out[1]);
  }
  full.end_context();
  quest.end_context();
  const testing::Chunk query = testing::slice(all, 1025, 1, shape, kHeads);
  REQUIRE(testing::feed(full, kHeads, query) == testing::feed(quest, kHeads, query));
  CHECK(quest.stats().bytes_read_last_forward == full.stats().bytes_read_last_forward);
  const testing::Chunk step = testing::slice(all, 1026, 1, shape, kHeads);
  CHECK(testing::decode_step(full, kHeads, step) != testing::decode_step(quest, kHeads, step));
  CHECK(quest.stats().bytes_read_last_forward < full.stats().bytes_read_last_forward);
}
