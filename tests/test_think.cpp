// think (methods/think.*): the channels kept are those with the largest query-key
// interaction over the context's last queries (the GQA group pooled), attention equals the
// dense kernel over keys whose pruned channels are zero, bytes count the kept channels only,
// later tokens, evictions in front and after, clones, and the spec's refusals.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "methods/think.h"
#include "tests/attention_problem.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

const ThinkLayerKv& think_layer(const KvCache& cache, int32_t layer) {
  return dynamic_cast<const ThinkLayerKv&>(cache.layer(layer));
}

// The chunk with each key's channels outside `kept` (per layer, per KV head) set to 0.
testing::Chunk zero_pruned(const testing::Chunk& c, const KvShape& shape,
                           const std::vector<int32_t>& kept_mask) {  // [n_kv_heads, head_dim]
  testing::Chunk z = c;
  const int32_t d = shape.head_dim;
  for (int64_t t = 0; t < c.n; ++t) {
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int32_t e = 0; e < d; ++e) {
        if (!kept_mask[h * d + e]) z.k[(t * shape.n_kv_heads + h) * d + e] = 0.f;
      }
    }
  }
  return z;
}

std::vector<int32_t> kept_mask_of(const ThinkLayerKv& layer, const KvShape& shape) {
  std::vector<int32_t> mask(shape.n_kv_heads * shape.head_dim, 0);
  for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
    for (const int32_t c : layer.kept_channels(h)) mask[h * shape.head_dim + c] = 1;
  }
  return mask;
}

}  // namespace

TEST_CASE("think keeps the key channels with the largest query-key interaction", "[unit][think]") {
  // 2 KV heads of 8 channels, 4 query heads (groups of 2); half the channels pruned.
  const KvShape shape{1, 2, 8};
  const int32_t n_heads = 4, d = 8, n = 20, window = 4;
  const float a[2][8] = {{10, 1, 1, 1, 1, 1, 1, 1},  // head 0: channel 0's keys largest
                         {1, 1, 1, 1, 1, 2, 1, 1}};
  const float b[4][8] = {{0, 3, 1, 2, 0.5f, 0.1f, 1.5f, 0.1f},  // window queries, head 0's group
                         {0, 3, 1, 2, 0.5f, 0.1f, 1.5f, 0.1f},
                         {0, 0, 4, 0, 0, 1, 0, 0},  // head 1's group: each query head its own
                         {0, 0, 0, 0, 3, 0, 1, 0}};
  testing::Chunk c;
  c.n = n;
  c.k.resize(n * 2 * d);
  c.v.assign(c.k.size(), 0.5f);
  c.q.assign(n * n_heads * d, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t e = 0; e < d; ++e) c.k[(t * 2 + h) * d + e] = a[h][e] * (t % 2 ? 1.f : -1.f);
    }
    for (int32_t qh = 0; qh < n_heads; ++qh) {
      for (int32_t e = 0; e < d; ++e) {
        // Before the window every query points along channel 7 only: it must not count.
        c.q[(t * n_heads + qh) * d + e] = t >= n - window ? b[qh][e] : (e == 7 ? 100.f : 0.f);
      }
    }
  }
  KvCache cache = make_cache("think:channels=0.5,window=4", shape);
  // Two forwards: the window spans them (the last one holds 3 of its 4 rows).
  testing::feed(cache, n_heads, testing::slice(c, 0, n - 3, shape, n_heads));
  testing::feed(cache, n_heads, testing::slice(c, n - 3, 3, shape, n_heads));
  CHECK_FALSE(think_layer(cache, 0).pruned());
  cache.end_context();
  const ThinkLayerKv& layer = think_layer(cache, 0);
  REQUIRE(layer.pruned());
  REQUIRE(layer.n_kept() == 4);
  // Head 0: q^2 k^2 = 0, 9, 1, 4, .25, .01, 2.25, .01: channel 0 (largest keys, no query)
  // and 7 (queries before the window only) go.
  CHECK(layer.kept_channels(0) == std::vector<int32_t>{1, 2, 3, 6});
  // Head 1: the group's mean q^2 (16/2, 9/2, 1/2 x k^2 4, 1/2) on channels 2, 4, 5, 6.
  CHECK(layer.kept_channels(1) == std::vector<int32_t>{2, 4, 5, 6});
  // The view holds the kept channels, the rest zero.
  const DenseKv kv = layer.view();
  REQUIRE(kv.n_tokens == n);
  for (int64_t t = 0; t < n; ++t) {
    const float sign = t % 2 ? 1.f : -1.f;
    CHECK(kv.k[(0 * kv.capacity + t) * d + 0] == 0.f);
    CHECK(kv.k[(0 * kv.capacity + t) * d + 1] == sign * 1.f);
    CHECK(kv.k[(1 * kv.capacity + t) * d + 5] == sign * 2.f);
    CHECK(kv.k[(1 * kv.capacity + t) * d + 0] == 0.f);
    CHECK(kv.positions[t] == t);
  }
}

TEST_CASE("think attends as the dense kernel over keys with the pruned channels zeroed",
          "[unit][think]") {
  const KvShape shape{2, 2, 32};
  const int32_t n_heads = 6;
  std::mt19937 rng(11);
  const testing::Chunk context = testing::random_chunk(200, shape, n_heads, rng);
  KvCache think = make_cache("think", shape);  // channels 0.4: int(12.8) = 12 pruned, 20 kept
  testing::feed(think, n_heads, context);
  think.end_context();
  REQUIRE(think_layer(think, 0).n_kept() == 20);
  // Every layer saw the same keys and queries, so chose the same channels.
  const std::vector<int32_t> mask = kept_mask_of(think_layer(think, 0), shape);
  REQUIRE(kept_mask_of(think_layer(think, 1), shape) == mask);
  KvCache zeroed = make_full_cache(shape), whole = make_full_cache(shape);
  testing::feed(zeroed, n_heads, zero_pruned(context, shape, mask));
  testing::feed(whole, n_heads, context);
  zeroed.end_context();
  whole.end_context();
  double moved = 0;
  for (int step = 0; step < 4; ++step) {
    // Three decode steps and a chunk of 5: later keys are stored pruned too.
    const testing::Chunk next = testing::random_chunk(step < 3 ? 1 : 5, shape, n_heads, rng);
    const std::vector<float> got =
        step < 3 ? testing::decode_step(think, n_heads, next) : testing::feed(think, n_heads, next);
    const testing::Chunk next_zeroed = zero_pruned(next, shape, mask);
    const std::vector<float> want = step < 3 ? testing::decode_step(zeroed, n_heads, next_zeroed)
                                             : testing::feed(zeroed, n_heads, next_zeroed);
    REQUIRE(got == want);  // bit for bit
    const std::vector<float> unpruned =
        step < 3 ? testing::decode_step(whole, n_heads, next) : testing::feed(whole, n_heads, next);
    moved = std::max<double>(moved, testing::max_abs_diff(got, unpruned));
  }
  CHECK(moved > 1e-3);  // pruning 12 of 32 random channels changes the output
  // And the two-pass reference over the store's view agrees within rounding.
  const testing::Chunk last = testing::random_chunk(3, shape, n_heads, rng);
  const std::vector<float> got = testing::feed(think, n_heads, last);
  std::vector<float> want(3 * n_heads * 32);
  std::vector<int32_t> positions = {208, 209, 210};
  attention_dense_reference(AttentionQuery{last.q.data(), positions.data(), want.data(), 3, n_heads,
                                           1.f / std::sqrt(32.f)},
                            think.layer(1).view());
  const std::vector<float> got_last(got.end() - static_cast<int64_t>(want.size()), got.end());
  CHECK(testing::max_abs_diff(got_last, want) < 1e-5);
}

TEST_CASE("think holds only the kept key channels", "[unit][think]") {
  const KvShape shape{3, 2, 64};
  const int32_t n_heads = 4, n = 300;
  std::mt19937 rng(12);
  const testing::Chunk context = testing::random_chunk(n, shape, n_heads, rng);
  KvCache think = make_cache("think:channels=0.5,window=16", shape);
  KvCache full = make_full_cache(shape);
  think.reserve(n);
  full.reserve(n);
  testing::feed(think, n_heads, context);
  testing::feed(full, n_heads, context);
  // Before the end: the fp32 rows and the window's queries.
  const int64_t window_bytes = 16LL * n_heads * 64 * sizeof(float);
  CHECK(think.bytes_resident() == full.bytes_resident() + 3 * window_bytes);
  think.end_context();
  const int64_t kept = 32, heads = 2, d = 64;
  const int64_t per_layer = heads * n * (kept + d) * sizeof(float) + heads * n * sizeof(int32_t) +
                            heads * kept * sizeof(int32_t);
  for (int32_t l = 0; l < 3; ++l) CHECK(think.layer(l).bytes_resident() == per_layer);
  CHECK(think.bytes_resident() == 3 * per_layer);
  CHECK(think.stats().bytes_resident == 3 * per_layer);
  // A quarter of the fp32 cache saved, less the channel lists.
  CHECK(full.bytes_resident() - think.bytes_resident() ==
        3 * (heads * n * (d - kept) * 4 - heads * kept * 4));
  // Attention reads the kept channels only.
  testing::decode_step(think, n_heads, testing::random_chunk(1, shape, n_heads, rng));
  CHECK(think.stats().bytes_read_last_forward == 3 * heads * (n + 1) * ((kept + d) * 4 + 4));
}

TEST_CASE("think after an eviction method, and under one that evicts while decoding",
          "[unit][think]") {
  const KvShape shape{2, 2, 32};
  const int32_t n_heads = 4;
  std::mt19937 rng(13);
  const testing::Chunk context = testing::random_chunk(200, shape, n_heads, rng);
  SECTION("snapkv in front: the channels are chosen on the keys it kept") {
    KvCache cache = make_cache("snapkv:budget=64,window=8+think:channels=0.25", shape);
    KvCache snap = make_cache("snapkv:budget=64,window=8", shape);
    testing::feed(cache, n_heads, context);
    testing::feed(snap, n_heads, context);
    cache.end_context();
    snap.end_context();
    const ThinkLayerKv& layer = think_layer(cache, 0);
    REQUIRE(layer.pruned());
    CHECK(layer.n_tokens() == 64);
    CHECK(layer.bytes_resident() == 2 * 64 * (24 + 32) * 4 + 2 * 64 * 4 + 2 * 24 * 4);
    // The same tokens as SnapKV alone, each key's kept channels as SnapKV holds them.
    const DenseKv a = snap.layer(0).view(), b = layer.view();
    const std::vector<int32_t> mask = kept_mask_of(layer, shape);
    for (int32_t h = 0; h < 2; ++h) {
      for (int64_t t = 0; t < 64; ++t) {
        REQUIRE(a.positions[h * a.capacity + t] == b.positions[h * b.capacity + t]);
        for (int32_t e = 0; e < 32; ++e) {
          const float want = mask[h * 32 + e] ? a.k[(h * a.capacity + t) * 32 + e] : 0.f;
          REQUIRE(b.k[(h * b.capacity + t) * 32 + e] == want);
          REQUIRE(b.v[(h * b.capacity + t) * 32 + e] == a.v[(h * a.capacity + t) * 32 + e]);
        }
      }
    }
  }
  SECTION("h2o evicting every step moves pruned rows; attention follows them") {
    KvCache cache = make_cache("h2o:budget=40+think", shape);
    testing::feed(cache, n_heads, context);
    cache.end_context();
    const std::vector<int32_t> mask = kept_mask_of(think_layer(cache, 1), shape);
    for (int step = 0; step < 6; ++step) {
      // What layer 1 holds before the step, per head, and the new token's pruned key.
      const DenseKv before = cache.layer(1).view();
      const int64_t n = before.n_tokens + 1;
      std::vector<float> k(2 * n * 32), v(k.size());
      std::vector<int32_t> positions(2 * n);
      const testing::Chunk next = testing::random_chunk(1, shape, n_heads, rng);
      const testing::Chunk next_zeroed = zero_pruned(next, shape, mask);
      for (int32_t h = 0; h < 2; ++h) {
        std::copy_n(before.k + h * before.capacity * 32, (n - 1) * 32, &k[h * n * 32]);
        std::copy_n(before.v + h * before.capacity * 32, (n - 1) * 32, &v[h * n * 32]);
        std::copy_n(before.positions + h * before.capacity, n - 1, &positions[h * n]);
        std::copy_n(&next_zeroed.k[h * 32], 32, &k[(h * n + n - 1) * 32]);
        std::copy_n(&next.v[h * 32], 32, &v[(h * n + n - 1) * 32]);
        positions[h * n + n - 1] = cache.next_position();
      }
      const int32_t q_position = cache.next_position();
      std::vector<float> want(n_heads * 32);
      attention_dense_cpu(AttentionQuery{next.q.data(), &q_position, want.data(), 1, n_heads,
                                         1.f / std::sqrt(32.f)},
                          DenseKv{k.data(), v.data(), positions.data(), 2, 32, n, n});
      const std::vector<float> got = testing::decode_step(cache, n_heads, next);
      REQUIRE(std::vector<float>(got.begin() + n_heads * 32, got.end()) == want);
      CHECK(cache.layer(1).n_tokens() == 40);
    }
  }
}

TEST_CASE("think: a clone decodes without touching the original", "[unit][think]") {
  const KvShape shape{2, 2, 32};
  const int32_t n_heads = 4;
  std::mt19937 rng(14);
  const testing::Chunk context = testing::random_chunk(120, shape, n_heads, rng);
  KvCache a = make_cache("think:channels=0.5", shape), b = make_cache("think:channels=0.5", shape);
  testing::feed(a, n_heads, context);
  testing::feed(b, n_heads, context);
  a.end_context();
  b.end_context();
  KvCache branch = a.clone();
  for (int i = 0; i < 5; ++i) {
    testing::decode_step(branch, n_heads, testing::random_chunk(1, shape, n_heads, rng));
  }
  const testing::Chunk next = testing::random_chunk(1, shape, n_heads, rng);
  CHECK(testing::decode_step(a, n_heads, next) == testing::decode_step(b, n_heads, next));
  CHECK(a.bytes_resident() == b.bytes_resident());
  CHECK(branch.layer(0).n_tokens() == 125);
  CHECK(a.layer(0).n_tokens() == 121);
}

TEST_CASE("think's spec: channels below 1, no budget, storage last", "[unit][think]") {
  CHECK_NOTHROW(resolve_method_spec("think"));
  CHECK_NOTHROW(resolve_method_spec("think:channels=0"));
  CHECK_NOTHROW(resolve_method_spec("snapkv:ratio=0.5+think"));
  CHECK_NOTHROW(resolve_method_spec("h2o:budget=64+think:channels=0.5,window=8"));
  CHECK_THROWS_WITH(resolve_method_spec("think:channels=1"), Catch::Contains("below 1"));
  CHECK_THROWS_AS(resolve_method_spec("think:channels=-0.1"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("think:window=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("think:ratio=0.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("think:budget=64"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("think+snapkv"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("think+kivi"), InputError);
  const ResolvedSpec spec = resolve_method_spec("think");
  CHECK(spec.canonical == "think:channels=0.4,window=32");
}
