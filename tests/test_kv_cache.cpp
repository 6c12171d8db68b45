// The dense full cache: layout per KV head, growth, real byte accounting, and attention
// through the store equal to the reference kernel on the same data.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/attention.h"
#include "random_floats.h"

using namespace kvbench;

using testing::random_floats;

TEST_CASE("dense cache stores each token per KV head and keeps it across growth", "[unit]") {
  const int32_t n_kv_heads = 3, head_dim = 8;
  DenseLayerKv store(n_kv_heads, head_dim);
  std::vector<std::vector<float>> ks, vs;
  int32_t position = 0;
  // Appends of 1, 5 and 70 tokens force reallocations past the initial capacity.
  for (int64_t n_new : {1, 5, 70}) {
    auto k = random_floats(n_new * n_kv_heads * head_dim, position + 1);
    auto v = random_floats(n_new * n_kv_heads * head_dim, position + 1000);
    std::vector<int32_t> positions(n_new);
    for (auto& p : positions) p = position++;
    store.append(k.data(), v.data(), positions.data(), n_new);
    ks.push_back(k);
    vs.push_back(v);
  }
  REQUIRE(store.n_tokens() == 76);
  const DenseKv kv = store.view();
  int64_t t = 0;
  for (size_t chunk = 0; chunk < ks.size(); ++chunk) {
    const int64_t n_new = ks[chunk].size() / (n_kv_heads * head_dim);
    for (int64_t i = 0; i < n_new; ++i, ++t) {
      for (int32_t h = 0; h < n_kv_heads; ++h) {
        CHECK(kv.positions[h * kv.capacity + t] == t);
        for (int32_t d = 0; d < head_dim; ++d) {
          const float expected_k = ks[chunk][(i * n_kv_heads + h) * head_dim + d];
          const float expected_v = vs[chunk][(i * n_kv_heads + h) * head_dim + d];
          REQUIRE(kv.k[(h * kv.capacity + t) * head_dim + d] == expected_k);
          REQUIRE(kv.v[(h * kv.capacity + t) * head_dim + d] == expected_v);
        }
      }
    }
  }
}

TEST_CASE("dense cache reports the bytes its storage holds", "[unit]") {
  const int32_t n_kv_heads = 3, head_dim = 64;
  KvCache cache = make_full_cache(KvShape{4, n_kv_heads, head_dim});
  CHECK(cache.bytes_resident() == 0);
  cache.reserve(100);
  // K and V in fp32 per KV head (GQA not expanded), plus one int32 position per slot.
  const int64_t per_layer = 2 * n_kv_heads * 100 * head_dim * 4 + n_kv_heads * 100 * 4;
  CHECK(cache.bytes_resident() == 4 * per_layer);
  const CacheStats stats = cache.stats();
  REQUIRE(stats.bytes_per_layer.size() == 4);
  CHECK(stats.bytes_per_layer[2] == per_layer);
  CHECK(stats.tokens_per_layer[0] == 0);
  CHECK(stats.bytes_peak == 4 * per_layer);
}

TEST_CASE("attention through the dense cache equals the reference kernel", "[unit]") {
  const int32_t n_kv_heads = 2, n_heads = 6, head_dim = 16;
  const int64_t n_tokens = 37;
  DenseLayerKv store(n_kv_heads, head_dim);
  auto k = random_floats(n_tokens * n_kv_heads * head_dim, 7);
  auto v = random_floats(n_tokens * n_kv_heads * head_dim, 8);
  std::vector<int32_t> positions(n_tokens);
  for (int64_t i = 0; i < n_tokens; ++i) positions[i] = static_cast<int32_t>(10 + 2 * i);
  store.append(k.data(), v.data(), positions.data(), n_tokens);

  const int32_t n_queries = 5;
  auto q = random_floats(n_queries * n_heads * head_dim, 9);
  std::vector<int32_t> q_positions = {10, 11, 40, 60, 200};
  std::vector<float> out(q.size()), expected(q.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const int64_t bytes = store.attend(
      AttentionQuery{q.data(), q_positions.data(), out.data(), n_queries, n_heads, scale}, nullptr);
  CHECK(bytes == n_kv_heads * n_tokens * (2 * head_dim * 4 + 4));  // every slot's K, V, position
  attention_dense_reference(
      AttentionQuery{q.data(), q_positions.data(), expected.data(), n_queries, n_heads, scale},
      store.view());
  for (size_t i = 0; i < out.size(); ++i) {
    // 1e-5: fp32 tiled online softmax against the reference on 37 keys.
    REQUIRE(out[i] == Approx(expected[i]).margin(1e-5));
  }
}

TEST_CASE("dense store: a compression frees at once, decode-step evictions reuse slots",
          "[unit]") {
  const int32_t n_kv_heads = 2, head_dim = 4;
  DenseLayerKv store(n_kv_heads, head_dim);
  auto append = [&](int64_t n, int32_t first_position) {
    auto k = random_floats(n * n_kv_heads * head_dim, first_position);
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = first_position + static_cast<int32_t>(i);
    store.append(k.data(), k.data(), positions.data(), n);
  };
  // Keep the `n` most recent tokens of every head.
  auto keep_last = [&](int64_t n) {
    RetainPlan plan;
    plan.n_keep = n;
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      std::vector<int32_t> order = slots_by_position(store.view(), h, 0, n);
      std::vector<int32_t> keep(order.end() - n, order.end());
      std::sort(keep.begin(), keep.end());
      plan.slots.insert(plan.slots.end(), keep.begin(), keep.end());
    }
    store.retain(plan);
  };
  auto positions_of = [&](int32_t h) {
    const DenseKv kv = store.view();
    return std::vector<int32_t>(kv.positions + h * kv.capacity,
                                kv.positions + h * kv.capacity + kv.n_tokens);
  };
  store.reserve(1000);
  append(1000, 0);
  const int64_t per_token = store.bytes_resident() / 1000;
  keep_last(250);  // compression: exactly what is kept
  CHECK(store.capacity() == 250);
  CHECK(store.bytes_resident() == 250 * per_token);
  CHECK(store.view().positions[0] == 750);
  CHECK(store.view().positions[store.capacity() + 249] == 999);  // head 1

  // A decode-step eviction moves one token into the hole, not all those after it.
  append(1, 1000);
  const std::vector<int32_t> before = positions_of(0);
  keep_last(250);  // drops position 750, in slot 0
  std::vector<int32_t> expected(before.begin(), before.begin() + 250);
  expected[0] = 1000;  // the new token, moved from slot 250 into slot 0
  CHECK(positions_of(0) == expected);
  CHECK(positions_of(1) == expected);

  // Decode: one in, one out. Growth after an eviction is by the slack, then steady.
  append(1, 1001);
  CHECK(store.capacity() == 251 + kEvictionSlack);
  keep_last(250);
  const float* steady = store.view().k;  // the buffer decode steps must not reallocate
  CHECK(store.capacity() == 251 + kEvictionSlack);
  for (int32_t step = 2; step < 100; ++step) {
    append(1, 1000 + step);
    keep_last(250);
    REQUIRE(store.view().k == steady);
  }
  std::vector<int32_t> kept = positions_of(0);
  std::sort(kept.begin(), kept.end());
  CHECK(kept.front() == 850);
  CHECK(kept.back() == 1099);
  CHECK(std::adjacent_find(kept.begin(), kept.end()) == kept.end());
}

TEST_CASE("kv cache: reserve_more grows each layer from its own count", "[unit]") {
  // Layers that keep different numbers of tokens (Knorm skips its first layers) must not
  // all be grown to the largest: bytes resident are what each layer holds plus the room.
  const KvShape shape{3, 2, 8};
  KvCache cache = make_cache(resolve_method_spec("knorm:budget=8,skip=1"), shape);
  const int64_t n = 40;
  std::vector<float> kv(static_cast<size_t>(n * shape.n_kv_heads * shape.head_dim));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = 0.01f * static_cast<float>(i % 97);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = i;
  for (int32_t l = 0; l < shape.n_layers; ++l) cache.append(l, kv.data(), kv.data(), positions.data(), n);
  cache.advance(static_cast<int32_t>(n));
  cache.end_context();
  REQUIRE(cache.layer(0).n_tokens() == n);
  REQUIRE(cache.layer(1).n_tokens() == 8);
  const int64_t per_token = 2 * shape.n_kv_heads * shape.head_dim * 4 + shape.n_kv_heads * 4;
  cache.reserve_more(4);
  CHECK(cache.layer(1).bytes_resident() == (8 + 4) * per_token);  // not 40 + 4
  CHECK(cache.layer(2).bytes_resident() == (8 + 4) * per_token);
  CHECK(cache.layer(0).bytes_resident() >= (n + 4) * per_token);  // whole, as it grew
}

namespace {

// Records the order of context_ending and plan calls, and what each saw.
class EndRecorder : public TokenPolicy {
 public:
  std::vector<std::string> calls;
  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<EndRecorder>(*this);
  }
  bool reads_context_end() const override { return true; }
  void context_ending(int32_t layer, const DenseKv& kv) override {
    calls.push_back("end " + std::to_string(layer) + " " + std::to_string(kv.n_tokens));
  }
  bool plan(int32_t layer, const DenseKv&, CachePhase phase, RetainPlan&) override {
    if (phase == CachePhase::ContextEnd) calls.push_back("plan " + std::to_string(layer));
    return false;
  }
  bool done(int32_t layer) const override { return layer == 1; }
};

}  // namespace

TEST_CASE("kv cache: context_ending sees every layer not done before any ContextEnd plan",
          "[unit]") {
  const KvShape shape{3, 1, 4};
  auto recorder = std::make_unique<EndRecorder>();
  EndRecorder* seen = recorder.get();
  KvCache cache(shape, make_dense_layers(shape), std::move(recorder));
  const std::vector<float> kv(static_cast<size_t>(5 * shape.head_dim), 0.5f);
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4};
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    cache.append(l, kv.data(), kv.data(), positions.data(), 5);
  }
  cache.advance(5);
  cache.end_context();
  // Layer 1 is done: neither hook nor plan reaches it.
  CHECK(seen->calls == std::vector<std::string>{"end 0 5", "end 2 5", "plan 0", "plan 2"});
}
