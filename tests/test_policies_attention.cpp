// The attention-scored eviction policies (SnapKV, PyramidKV, H2O) driven through a real
// KvCache of dense stores with hand-built keys and queries, so the right kept set is known:
// token t's key is kSharp * e_t in every KV head, and a query kSharp * e_s puts all but
// ~1e-12 of its attention on token s. By default each query attends to its own token.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/kept_positions.h"

using namespace kvbench;
using kvbench::testing::kept;

namespace {

constexpr int32_t kKvHeads = 2;
constexpr int32_t kHeads = 4;  // GQA groups: query heads {0, 1} -> KV head 0, {2, 3} -> 1
constexpr int32_t kHeadDim = 64;
constexpr float kSharp = 16.f;  // logit 16 * 16 / sqrt(64) = 32 on the aimed token, 0 elsewhere

// The token each (position, query head) attends to; absent: its own token.
using Targets = std::map<std::pair<int32_t, int32_t>, int32_t>;

void aim(Targets& targets, int32_t first, int32_t last, std::vector<int32_t> heads, int32_t token) {
  for (int32_t p = first; p <= last; ++p) {
    for (int32_t h : heads) targets[{p, h}] = token;
  }
}

KvShape shape_of(int32_t n_layers) { return KvShape{n_layers, kKvHeads, kHeadDim}; }

// One forward over tokens [first, first + n), the same data in every layer.
void forward(KvCache& cache, int32_t first, int32_t n, const Targets& targets = {}) {
  REQUIRE(first + n <= kHeadDim);  // one key direction per token
  std::vector<float> k(static_cast<size_t>(n) * kKvHeads * kHeadDim, 0.f);
  std::vector<float> v(k.size(), 0.f);
  std::vector<float> q(static_cast<size_t>(n) * kHeads * kHeadDim, 0.f);
  std::vector<float> out(q.size());
  std::vector<int32_t> positions(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = first + i;
    positions[i] = t;
    for (int32_t g = 0; g < kKvHeads; ++g) {
      k[(i * kKvHeads + g) * kHeadDim + t] = kSharp;
      v[(i * kKvHeads + g) * kHeadDim + g] = static_cast<float>(t);
    }
    for (int32_t h = 0; h < kHeads; ++h) {
      const auto it = targets.find({t, h});
      const int32_t target = it == targets.end() ? t : it->second;
      if (target > t) FAIL("query " << t << " aimed at a later token " << target);
      q[(i * kHeads + h) * kHeadDim + target] = kSharp;
    }
  }
  for (int32_t l = 0; l < cache.shape().n_layers; ++l) {
    cache.append(l, k.data(), v.data(), positions.data(), n);
    AttentionQuery query{};
    query.q = q.data();
    query.q_positions = positions.data();
    query.out = out.data();
    query.n_queries = n;
    query.n_heads = kHeads;
    query.scale = 1.f / std::sqrt(static_cast<float>(kHeadDim));
    cache.attend(l, query);
  }
  cache.advance(n);
}

// The context [0, n_context) in chunks of `chunk` (the last one may be shorter).
void prefill(KvCache& cache, int32_t n_context, int32_t chunk, const Targets& targets = {}) {
  for (int32_t first = 0; first < n_context; first += chunk) {
    forward(cache, first, std::min(chunk, n_context - first), targets);
  }
}

std::vector<int32_t> range(int32_t first, int32_t last) {
  std::vector<int32_t> out;
  for (int32_t t = first; t <= last; ++t) out.push_back(t);
  return out;
}

std::vector<int32_t> join(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// SnapKV scene: 35 context tokens in chunks 16, 16, 3; window 4 = positions 31..34 (the
// ring spans the last two chunks). KV head 0's window votes 9 (x3), 2, 17; a decoy, 25,
// is attended by many earlier queries only. KV head 1's window votes 4 (x2), 12, 28.
Targets snap_targets() {
  Targets t;
  aim(t, 26, 30, {0, 1}, 25);
  aim(t, 31, 31, {0}, 2);
  aim(t, 32, 32, {1}, 9);
  aim(t, 33, 33, {0}, 17);
  aim(t, 34, 34, {0, 1}, 9);
  aim(t, 31, 31, {2, 3}, 4);
  aim(t, 32, 32, {2}, 12);
  aim(t, 33, 33, {3}, 28);
  return t;
}

KvCache snap_cache(const std::string& spec, int32_t n_layers = 1) {
  KvCache cache = make_cache(spec, shape_of(n_layers));
  prefill(cache, 35, 16, snap_targets());
  return cache;
}

}  // namespace

TEST_CASE("snapkv keeps what the window queries attend to, per KV head, plus the window",
          "[unit]") {
  KvCache cache = snap_cache("snapkv:budget=7,window=4,kernel=1");
  REQUIRE(cache.layer(0).n_tokens() == 35);
  CHECK(cache.policy()->bytes_resident(0) > 0);  // the window's queries
  const int64_t bytes_before = cache.bytes_resident();
  cache.end_context();
  CHECK(kept(cache, 0, 0) == std::vector<int32_t>{2, 9, 17, 31, 32, 33, 34});
  CHECK(kept(cache, 0, 1) == std::vector<int32_t>{4, 12, 28, 31, 32, 33, 34});
  CHECK(cache.policy()->bytes_resident(0) == 0);
  CHECK(cache.bytes_resident() < bytes_before);
  CHECK(cache.stats().tokens_evicted == 35 - 7);
  // Prefill-only: what follows the context is appended uncompressed.
  forward(cache, 35, 1);
  forward(cache, 36, 3);
  CHECK(kept(cache, 0, 0) == std::vector<int32_t>{2, 9, 17, 31, 32, 33, 34, 35, 36, 37, 38});
}

TEST_CASE("snapkv averages the GQA group's query heads per KV head", "[unit]") {
  // Window 30..34. Token 10: two rows from each query head (mean 2); token 5: three rows
  // from query head 1 alone (mean 1.5, though its best single head is higher).
  Targets t;
  aim(t, 30, 31, {0, 1}, 10);
  aim(t, 32, 34, {1}, 5);
  KvCache cache = make_cache("snapkv:budget=6,window=5,kernel=1", shape_of(1));
  prefill(cache, 35, 16, t);
  cache.end_context();
  CHECK(kept(cache, 0, 0) == join({10}, range(30, 34)));
}

TEST_CASE("snapkv pooling carries a hit's neighbours along", "[unit]") {
  SECTION("avg pool 5: the strongest hit's five neighbours") {
    KvCache cache = snap_cache("snapkv:budget=9,window=4,kernel=5,pool=avg");
    cache.end_context();
    CHECK(kept(cache, 0, 0) == join(range(7, 11), range(31, 34)));
    CHECK(kept(cache, 0, 1) == join(range(2, 6), range(31, 34)));
  }
  SECTION("max pool 3") {
    KvCache cache = snap_cache("snapkv:budget=7,window=4,kernel=3,pool=max");
    cache.end_context();
    CHECK(kept(cache, 0, 0) == join(range(8, 10), range(31, 34)));
    CHECK(kept(cache, 0, 1) == join(range(3, 5), range(31, 34)));
  }
}

TEST_CASE("snapkv budgets: whole context kept when it fits, ratios, window shrink", "[unit]") {
  SECTION("budget >= tokens: nothing dropped, buffer still freed") {
    KvCache cache = snap_cache("snapkv:budget=35,window=4");
    cache.end_context();
    CHECK(kept(cache, 0, 0) == range(0, 34));
    CHECK(cache.stats().tokens_evicted == 0);
    CHECK(cache.policy()->bytes_resident(0) == 0);
  }
  SECTION("ratio resolves from the context length") {
    KvCache cache = snap_cache("snapkv:ratio=0.2,window=4,kernel=1");  // ceil(7.0) = 7
    cache.end_context();
    CHECK(kept(cache, 0, 0) == std::vector<int32_t>{2, 9, 17, 31, 32, 33, 34});
    CHECK(kept(cache, 0, 1) == std::vector<int32_t>{4, 12, 28, 31, 32, 33, 34});
  }
  SECTION("a ratio below the window shrinks the window to the budget") {
    KvCache cache = snap_cache("snapkv:ratio=0.05,window=4", 2);  // ceil(1.75) = 2
    cache.end_context();
    for (int32_t l = 0; l < 2; ++l) {
      CHECK(kept(cache, l, 0) == std::vector<int32_t>{33, 34});
      CHECK(kept(cache, l, 1) == std::vector<int32_t>{33, 34});
    }
  }
  SECTION("checks: budget below the window, even kernel") {
    CHECK_THROWS_AS(resolve_method_spec("snapkv:budget=16,window=32"), InputError);
    CHECK_THROWS_AS(resolve_method_spec("snapkv:kernel=4"), InputError);
    CHECK_THROWS_AS(resolve_method_spec("snapkv:budget=64,ratio=0.5"), InputError);
    CHECK_THROWS_AS(resolve_method_spec("pyramidkv:budget=8,window=32"), InputError);
    CHECK_NOTHROW(resolve_method_spec("snapkv:ratio=0.01,window=32"));
  }
}

TEST_CASE("snapkv clones are independent", "[unit]") {
  KvCache original = snap_cache("snapkv:budget=7,window=4,kernel=1");
  KvCache branch = original.clone();
  branch.end_context();
  CHECK(branch.layer(0).n_tokens() == 7);
  CHECK(original.layer(0).n_tokens() == 35);
  CHECK(original.policy()->bytes_resident(0) > 0);
  forward(branch, 35, 2);
  original.end_context();
  CHECK(kept(original, 0, 0) == std::vector<int32_t>{2, 9, 17, 31, 32, 33, 34});
  CHECK(kept(original, 0, 1) == std::vector<int32_t>{4, 12, 28, 31, 32, 33, 34});
  CHECK(branch.layer(0).n_tokens() == 9);
}

TEST_CASE("pyramidkv layer budgets follow KVCache-Factory's formula", "[unit]") {
  // L = 4, window 4. budget 24: A = 20, min = A / 20 = 1, max = 2A - min = 39.
  struct Case {
    const char* spec;
    int32_t n_context;
    std::vector<int64_t> tokens;  // per layer, window included
  };
  const std::vector<Case> cases = {
      // no clamp (max 39 < T - w = 60): step (39 - 1) / 3 = 12 -> 39, 27, 15, 3
      {"pyramidkv:budget=24,window=4", 64, {43, 31, 19, 7}},
      // clamp (39 >= T - w = 38): max 38, min 2A - 38 = 2, step 12 -> 38, 26, 14, 2
      {"pyramidkv:budget=24,window=4", 42, {42, 30, 18, 6}},
      // B <= T < 2A: uniform A = 20
      {"pyramidkv:budget=24,window=4", 30, {24, 24, 24, 24}},
      // T < B: nothing
      {"pyramidkv:budget=24,window=4", 20, {20, 20, 20, 20}},
      // beta 5: min 4, max 36, step 32 / 3 = 10 -> 36, 26, 16, 6
      {"pyramidkv:budget=24,window=4,beta=5", 64, {40, 30, 20, 10}},
      // ratio 0.5 of 64 = 32: A = 28, min 1, max 55, step 54 / 3 = 18 -> 55, 37, 19, 1
      {"pyramidkv:ratio=0.5,window=4", 64, {59, 41, 23, 5}},
      // ratio below the window: the window shrinks to 2, A = 0
      {"pyramidkv:ratio=0.03,window=4", 64, {2, 2, 2, 2}},
  };
  for (const Case& c : cases) {
    INFO(c.spec << " T=" << c.n_context);
    KvCache cache = make_cache(c.spec, shape_of(4));
    prefill(cache, c.n_context, 16);
    cache.end_context();
    CHECK(cache.stats().tokens_per_layer == c.tokens);
  }
}

TEST_CASE("pyramidkv selects each layer as snapkv would with that layer's budget", "[unit]") {
  Targets t;  // window 60..63 votes with distinct weights in each KV head
  aim(t, 60, 63, {0}, 7);
  aim(t, 60, 62, {1}, 30);
  aim(t, 61, 62, {0}, 44);
  aim(t, 62, 63, {2, 3}, 12);
  aim(t, 60, 60, {2}, 50);
  KvCache pyramid = make_cache("pyramidkv:budget=24,window=4,kernel=3,pool=max", shape_of(4));
  prefill(pyramid, 64, 16, t);
  pyramid.end_context();
  const std::vector<int64_t> budgets = {43, 31, 19, 7};
  CHECK(pyramid.stats().tokens_per_layer == budgets);
  for (int32_t l = 0; l < 4; ++l) {
    KvCache snap = make_cache(
        "snapkv:window=4,kernel=3,pool=max,budget=" + std::to_string(budgets[l]), shape_of(4));
    prefill(snap, 64, 16, t);
    snap.end_context();
    for (int32_t g = 0; g < kKvHeads; ++g) CHECK(kept(pyramid, l, g) == kept(snap, l, g));
  }
  // The deepest layer's 3 prefix tokens: the strongest vote (30: 1.5 against 1 for 7 and
  // 44) and its neighbours under max-pool 3.
  CHECK(kept(pyramid, 3, 0) == std::vector<int32_t>{29, 30, 31, 60, 61, 62, 63});
}

namespace {

// H2O scene: 32 context tokens in two chunks of 16. Accumulated group sums (2 per token
// from its own queries unless they are aimed elsewhere):
//   KV head 0: token 2 = 18 (attended only in chunk 1), 20 = 14, 5 = 6, others <= 2;
//   KV head 1: token 1 = 12 (attended in chunk 2), 7 = 10, 14 = 8, others <= 2.
Targets h2o_targets() {
  Targets t;
  aim(t, 3, 10, {0, 1}, 2);
  aim(t, 21, 26, {0, 1}, 20);
  aim(t, 27, 28, {0, 1}, 5);
  aim(t, 12, 15, {2, 3}, 7);
  aim(t, 16, 20, {2, 3}, 1);
  aim(t, 22, 24, {2, 3}, 14);
  return t;
}

KvCache h2o_cache(const std::string& spec, int32_t n_layers = 2) {
  KvCache cache = make_cache(spec, shape_of(n_layers));
  prefill(cache, 32, 16, h2o_targets());
  return cache;
}

}  // namespace

TEST_CASE("h2o keeps heavy hitters accumulated across forwards plus the recent window", "[unit]") {
  KvCache cache = h2o_cache("h2o:budget=6");
  CHECK(cache.layer(0).n_tokens() == 32);  // no eviction inside the context
  const int64_t policy_bytes = cache.policy()->bytes_resident(0);
  const int64_t bytes_before = cache.bytes_resident();
  CHECK(policy_bytes >= 32 * kHeads * 4);
  cache.end_context();
  for (int32_t l = 0; l < 2; ++l) {
    CHECK(kept(cache, l, 0) == std::vector<int32_t>{2, 5, 20, 29, 30, 31});
    CHECK(kept(cache, l, 1) == std::vector<int32_t>{1, 7, 14, 29, 30, 31});
  }
  CHECK(cache.policy()->bytes_resident(0) < policy_bytes);
  CHECK(cache.bytes_resident() < bytes_before);

  // Decode 32, 33, 34 with KV head 0's queries all on token 31: its score follows its slot
  // through two compactions and reaches 8 > 6, so it outlives heavy hitter 5.
  Targets decode;
  aim(decode, 32, 34, {0, 1}, 31);
  const std::vector<std::vector<int32_t>> head0 = {
      {2, 5, 20, 30, 31, 32}, {2, 5, 20, 31, 32, 33}, {2, 20, 31, 32, 33, 34}};
  const std::vector<std::vector<int32_t>> head1 = {
      {1, 7, 14, 30, 31, 32}, {1, 7, 14, 31, 32, 33}, {1, 7, 14, 32, 33, 34}};
  int64_t evicted = cache.stats().tokens_evicted;
  for (int32_t step = 0; step < 3; ++step) {
    forward(cache, 32 + step, 1, decode);
    const CacheStats stats = cache.stats();
    CHECK(stats.tokens_evicted == evicted + 2);  // one token per layer
    evicted = stats.tokens_evicted;
    for (int32_t l = 0; l < 2; ++l) {
      CHECK(kept(cache, l, 0) == head0[step]);
      CHECK(kept(cache, l, 1) == head1[step]);
    }
  }
  // A longer forward after the context is cut back to the budget at once.
  forward(cache, 35, 4);
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{6, 6});
  CHECK(kept(cache, 0, 0) == std::vector<int32_t>{2, 20, 31, 36, 37, 38});
}

TEST_CASE("h2o budgets: fits, ratio, recent share", "[unit]") {
  SECTION("budget >= tokens: nothing dropped until the budget is reached") {
    KvCache cache = h2o_cache("h2o:budget=33");
    cache.end_context();
    CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{32, 32});
    forward(cache, 32, 1);
    CHECK(cache.stats().tokens_evicted == 0);
    forward(cache, 33, 1);
    CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{33, 33});
  }
  SECTION("ratio resolves at the end of the context and holds while decoding") {
    KvCache cache = h2o_cache("h2o:ratio=0.25");  // 8: 4 recent + 4 heavy
    cache.end_context();
    CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{8, 8});
    const std::vector<int32_t> head0 = kept(cache, 0, 0);
    for (int32_t t : {2, 5, 20, 28, 29, 30, 31}) {
      CHECK(std::count(head0.begin(), head0.end(), t) == 1);
    }
    for (int32_t p = 32; p < 36; ++p) {
      forward(cache, p, 1);
      CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{8, 8});
    }
  }
  SECTION("recent=1 is a recent window, recent=0 all heavy hitters") {
    KvCache window = h2o_cache("h2o:budget=6,recent=1");
    window.end_context();
    CHECK(kept(window, 0, 0) == range(26, 31));
    KvCache heavy = h2o_cache("h2o:budget=3,recent=0");
    heavy.end_context();
    CHECK(kept(heavy, 0, 0) == std::vector<int32_t>{2, 5, 20});
    CHECK(kept(heavy, 0, 1) == std::vector<int32_t>{1, 7, 14});
  }
}

TEST_CASE("h2o clones are independent", "[unit]") {
  KvCache original = h2o_cache("h2o:budget=6", 1);
  original.end_context();
  KvCache branch = original.clone();
  Targets decode;
  aim(decode, 32, 34, {0, 1}, 31);
  for (int32_t p = 32; p < 35; ++p) forward(branch, p, 1, decode);
  for (int32_t p = 32; p < 35; ++p) forward(original, p, 1);  // each query on itself
  CHECK(kept(branch, 0, 0) == std::vector<int32_t>{2, 20, 31, 32, 33, 34});
  CHECK(kept(original, 0, 0) == std::vector<int32_t>{2, 5, 20, 32, 33, 34});
}
