// Composed specs equal the methods applied in order, through the same seams and no special
// case: snapkv then kivi (evict, then pack what is kept); quest over kivi (pick pages, then
// read them packed).
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "cache/registry.h"
#include "kernels/cpu/kivi_attention.h"
#include "methods/kivi.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 4;

// Appends a layer's stored tokens to a fresh store in position order, as the projection
// would have produced them. Every KV head must hold the same positions (checked).
void copy_into(const DenseKv& kv, LayerKv& store) {
  const int64_t n = kv.n_tokens, d = kv.head_dim;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return kv.positions[a] < kv.positions[b]; });
  std::vector<float> k(n * kv.n_kv_heads * d), v(k.size());
  std::vector<int32_t> positions(n);
  for (int64_t t = 0; t < n; ++t) {
    positions[t] = kv.positions[order[t]];
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      REQUIRE(kv.positions[h * kv.capacity + order[t]] == positions[t]);
      const int64_t from = (h * kv.capacity + order[t]) * d;
      std::copy_n(kv.k + from, d, k.data() + (t * kv.n_kv_heads + h) * d);
      std::copy_n(kv.v + from, d, v.data() + (t * kv.n_kv_heads + h) * d);
    }
  }
  store.append(k.data(), v.data(), positions.data(), n);
}

}  // namespace

TEST_CASE("snapkv+kivi equals snapkv, then kivi over what it kept in position order", "[unit]") {
  // One KV head, so every head keeps the same positions and the kept set can be re-fed.
  const KvShape shape{2, 1, 32};
  for (const int bits : {2, 4}) {
    INFO("bits " << bits);
    std::mt19937 rng(bits);
    const testing::Chunk context = testing::random_chunk(600, shape, kHeads, rng);
    const std::string kivi = "kivi:bits=" + std::to_string(bits);
    KvCache composed = make_cache("snapkv:budget=300,window=16+" + kivi, shape);
    KvCache snapkv = make_cache("snapkv:budget=300,window=16", shape);
    for (KvCache* cache : {&composed, &snapkv}) {
      testing::feed(*cache, kHeads, context);
      cache->end_context();
    }
    // In order: what snapkv kept, fed to a KIVI store and packed.
    const KvCache sequential = [&] {
      KvCache c = make_cache(kivi, shape);
      std::vector<int32_t> positions;
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        auto& store = const_cast<LayerKv&>(c.layer(l));
        copy_into(snapkv.layer(l).view(), store);
        store.settle();
      }
      return c;
    }();
    // 300 tokens kept: 160 packed, the rest in the fp32 residual.
    CHECK(composed.stats().bytes_resident < 0.7 * snapkv.stats().bytes_resident);
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      const auto& a = dynamic_cast<const KiviLayerKv&>(composed.layer(l));
      const auto& b = dynamic_cast<const KiviLayerKv&>(sequential.layer(l));
      REQUIRE(a.n_tokens() == 300);
      REQUIRE(a.n_blocks() == b.n_blocks());
      REQUIRE(a.n_blocks() == (300 - 128) / 32);
      const DenseKv va = a.view(), vb = b.view();
      for (int64_t i = 0; i < 300 * 32; ++i) {
        REQUIRE(va.k[i] == vb.k[i]);
        REQUIRE(va.v[i] == vb.v[i]);
      }
      for (int64_t t = 0; t < 300; ++t) REQUIRE(va.positions[t] == vb.positions[t]);
    }
  }
}

TEST_CASE("quest+kivi reads quest's pages from the packed store", "[unit]") {
  // Layers 0-1 dense (Quest's default), layer 2 reads pages.
  const KvShape shape{3, 2, 32};
  std::mt19937 rng(5);
  KvCache composed = make_cache("quest:budget=64+kivi:bits=4", shape);
  KvCache quest = make_cache("quest:budget=64", shape);
  const testing::Chunk context = testing::random_chunk(700, shape, kHeads, rng);
  for (KvCache* cache : {&composed, &quest}) {
    testing::feed(*cache, kHeads, context);
    cache->end_context();
  }
  const testing::Chunk step = testing::random_chunk(1, shape, kHeads, rng);
  const int32_t position = 700;
  composed.mark_decode_step();
  quest.mark_decode_step();
  std::vector<float> out(kHeads * 32), alone(out.size()), expected(out.size());
  for (int32_t l = 0; l < 3; ++l) {
    composed.append(l, step.k.data(), step.v.data(), &position, 1);
    composed.attend(l, AttentionQuery{step.q.data(), &position, out.data(), 1, kHeads, 0.2f});
    quest.append(l, step.k.data(), step.v.data(), &position, 1);
    quest.attend(l, AttentionQuery{step.q.data(), &position, alone.data(), 1, kHeads, 0.2f});
  }
  composed.advance(1);
  quest.advance(1);
  // Quest alone read a page selection over the same keys (bounds from the fp32 keys): find
  // it by the bytes it read, then check the composed store read exactly those pages packed.
  const auto& store = dynamic_cast<const KiviLayerKv&>(composed.layer(2));
  REQUIRE(store.n_blocks() > 0);
  const int64_t n = 701, n_pages = (n + 15) / 16;
  const MethodInfo& info = *find_method("quest");
  const ResolvedSpec spec = resolve_method_spec("quest:budget=64");
  std::unique_ptr<ReadPolicy> reader = info.make_reader(spec.components[0].second, shape);
  for (int32_t l = 0; l < 3; ++l) {
    reader->appended(l, context.k.data(), 0, 700);
    reader->appended(l, step.k.data(), 700, 1);
  }
  int64_t scoring_bytes = 0;
  const AttentionQuery query{step.q.data(), &position, expected.data(), 1, kHeads, 0.2f};
  const PageSelection* pages = reader->select(2, query, n, &scoring_bytes);
  REQUIRE(pages != nullptr);
  CHECK(pages->n_selected == 4);
  CHECK(scoring_bytes == 2 * 2 * n_pages * 32 * 4);
  attention_kivi_reference(query, store.layout(), pages);
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(expected[i]).margin(1e-4));
  // Packed reads cost fewer bytes than quest's fp32 reads of the same pages.
  CHECK(composed.stats().bytes_read_last_forward < quest.stats().bytes_read_last_forward);
}
