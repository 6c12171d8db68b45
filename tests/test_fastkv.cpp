// FastKV (methods/fastkv.cpp): the tokens selected at the TSP layer, the later layers holding
// only them (LlamaModel::forward_propagating), identities with the plain forward, refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/model/llama_model.h"
#include "harness/model_cache.h"
#include "harness/shared_prefill.h"
#include "tests/cache_feed.h"
#include "tests/gguf_writer.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kDim = 8;
constexpr int64_t kTokens = 40, kWindow = 8;

// A context of kTokens tokens, one KV head and one query head: zero keys except that window
// row r attends to prefix token 4r + 1 most (about 0.4 of its weight).
testing::Chunk pointed_context() {
  testing::Chunk c;
  c.n = kTokens;
  c.k.assign(kTokens * kDim, 0.f);
  c.v.assign(kTokens * kDim, 1.f);
  c.q.assign(kTokens * kDim, 0.f);
  for (int64_t r = 0; r < kWindow; ++r) {
    c.k[(4 * r + 1) * kDim + r] = 3.f;
    c.q[(kTokens - kWindow + r) * kDim + r] = 3.f;
  }
  return c;
}

// Stores and attends `c` in `layer` only, as the early layers of a propagating prefill do.
void feed_layer(KvCache& cache, int32_t layer, const testing::Chunk& c) {
  std::vector<int32_t> positions(c.n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> out(c.q.size());
  cache.append(layer, c.k.data(), c.v.data(), positions.data(), c.n);
  cache.attend(layer, AttentionQuery{c.q.data(), positions.data(), out.data(),
                                     static_cast<int32_t>(c.n), 1,
                                     1.f / std::sqrt(static_cast<float>(kDim))});
}

constexpr int kLayers = 4;
constexpr int64_t kContext = 300;

LlamaModel& tiny_model() {
  static std::unique_ptr<LlamaModel> model = [] {
    testing::TinyLlamaSpec spec;
    spec.n_layer = kLayers;
    spec.context_length = 1024;
    const std::string path = testing::temp_path("tiny_fastkv.gguf");
    testing::write_tiny_llama_gguf(path, spec);
    auto m = LlamaModel::load(path);
    m->prefill_chunk = 128;  // three chunks of context
    return m;
  }();
  return *model;
}

std::vector<int32_t> tokens(int64_t n) {
  std::vector<int32_t> out;
  uint32_t x = 777;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(3 + static_cast<int32_t>((x >> 8) % 256));
  }
  return out;
}

// The context through the policy's propagation, as the session feeds it, then ended.
std::vector<float> propagate_context(KvCache& cache, const std::vector<int32_t>& context) {
  const TokenPolicy* policy = cache.policy();
  std::vector<float> logits = tiny_model().forward_propagating(
      context, policy->propagation_layer(),
      [&](int32_t layer) { return policy->propagated_rows(layer, cache.layer(layer).view()); },
      cache);
  cache.end_context();
  return logits;
}

// The context through the plain forward, reserved as the session does, then ended.
std::vector<float> plain_context(KvCache& cache, const std::vector<int32_t>& context) {
  cache.reserve_more(static_cast<int64_t>(context.size()));
  std::vector<float> logits = tiny_model().forward(context, cache);
  cache.end_context();
  return logits;
}

std::vector<int32_t> positions_of(const std::vector<int64_t>& rows) {
  return std::vector<int32_t>(rows.begin(), rows.end());
}

}  // namespace

TEST_CASE("fastkv propagates the tokens the window attends to, summed over heads",
          "[unit][fastkv]") {
  const KvShape shape{2, 1, kDim};
  // Budget 16 < 40 tokens; tsp_rate 0.4: floor(40 * 0.4) = 16 propagate, window included.
  KvCache cache =
      make_cache("fastkv:budget=16,window=8,kernel=1,tsp_layer=0,tsp_rate=0.4", shape);
  REQUIRE(cache.policy()->propagation_layer() == 0);
  feed_layer(cache, 0, pointed_context());
  std::vector<int64_t> expected;
  for (int64_t r = 0; r < kWindow; ++r) expected.push_back(4 * r + 1);  // each row's target
  for (int64_t i = kTokens - kWindow; i < kTokens; ++i) expected.push_back(i);
  CHECK(cache.policy()->propagated_rows(0, cache.layer(0).view()) == expected);

  // A budget of at least the context: nothing is compressed, everything propagates.
  KvCache roomy =
      make_cache("fastkv:budget=64,window=8,kernel=1,tsp_layer=0,tsp_rate=0.4", shape);
  feed_layer(roomy, 0, pointed_context());
  CHECK(roomy.policy()->propagated_rows(0, roomy.layer(0).view()).size() == kTokens);
}

TEST_CASE("fastkv's default TSP layer is the authors' depth scaled to the model",
          "[unit][fastkv]") {
  CHECK(make_cache("fastkv", KvShape{32, 1, kDim}).policy()->propagation_layer() == 15);
  CHECK(make_cache("fastkv", KvShape{24, 1, kDim}).policy()->propagation_layer() == 11);
  CHECK(make_cache("fastkv:tsp_layer=3", KvShape{24, 1, kDim}).policy()->propagation_layer() ==
        3);
  CHECK_THROWS_AS(make_cache("fastkv:tsp_layer=24", KvShape{24, 1, kDim}), InputError);
}

TEST_CASE("forward_propagating with every row selected is the plain forward, bit for bit",
          "[unit][fastkv]") {
  const std::vector<int32_t> all = tokens(kContext + 3);
  const std::vector<int32_t> context(all.begin(), all.begin() + kContext);
  std::vector<int64_t> rows(kContext);
  std::iota(rows.begin(), rows.end(), 0);
  for (const int32_t layer : {0, 1, kLayers - 1}) {
    INFO("tsp layer " << layer);
    KvCache plain = make_full_cache(tiny_model().kv_shape());
    KvCache propagated = make_full_cache(tiny_model().kv_shape());
    REQUIRE(tiny_model().forward(context, plain) ==
            tiny_model().forward_propagating(
                context, layer, [&](int32_t) { return rows; }, propagated));
    CHECK(propagated.next_position() == kContext);
    for (int i = 0; i < 3; ++i) {
      REQUIRE(tiny_model().decode(all[kContext + i], plain) ==
              tiny_model().decode(all[kContext + i], propagated));
    }
  }
}

TEST_CASE("forward_propagating: the later layers hold only the selected tokens",
          "[unit][fastkv]") {
  const std::vector<int32_t> context = tokens(kContext);
  std::vector<int64_t> selected;
  for (int64_t i = 0; i < kContext; i += 3) selected.push_back(i);
  if (selected.back() != kContext - 1) selected.push_back(kContext - 1);
  std::vector<int32_t> everything(kContext);
  std::iota(everything.begin(), everything.end(), 0);

  KvCache cache = make_full_cache(tiny_model().kv_shape());
  int32_t asked = -1;
  const std::vector<float> logits = tiny_model().forward_propagating(
      context, 1,
      [&](int32_t layer) {
        asked = layer;
        return selected;
      },
      cache);
  CHECK(asked == 1);
  for (int32_t l = 0; l < kLayers; ++l) {
    INFO("layer " << l);
    for (int32_t h = 0; h < cache.shape().n_kv_heads; ++h) {
      CHECK(testing::kept(cache, l, h) == (l <= 1 ? everything : positions_of(selected)));
    }
  }
  CHECK(cache.next_position() == kContext);
  // The dropped tokens are dropped from the later layers' compute: the logits differ from
  // the full prefill's.
  KvCache full = make_full_cache(tiny_model().kv_shape());
  CHECK(tiny_model().forward(context, full) != logits);

  // Selected after the last layer, the last token's logits are the full prefill's.
  KvCache last = make_full_cache(tiny_model().kv_shape());
  KvCache full_again = make_full_cache(tiny_model().kv_shape());
  CHECK(tiny_model().forward_propagating(context, kLayers - 1,
                                         [&](int32_t) { return selected; }, last) ==
        tiny_model().forward(context, full_again));

  KvCache bad = make_full_cache(tiny_model().kv_shape());
  CHECK_THROWS_AS(tiny_model().forward_propagating(
                      context, 1, [](int32_t) { return std::vector<int64_t>{0, 5}; }, bad),
                  std::invalid_argument);  // the last token must go on
  CHECK_THROWS_AS(tiny_model().forward_propagating(
                      context, kLayers, [&](int32_t) { return selected; }, bad),
                  InputError);
}

TEST_CASE("fastkv keeps the budget per layer over the tokens each layer holds",
          "[unit][fastkv]") {
  const std::vector<int32_t> context = tokens(kContext);
  KvCache cache = make_cache("fastkv:ratio=0.5,tsp_layer=1", tiny_model().kv_shape());
  propagate_context(cache, context);
  // floor(300 * 0.2) = 60 tokens go past layer 1; every layer keeps at most 150.
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{150, 150, 60, 60});
  // The later layers' stores are sized for their 60 tokens, not for the context.
  CHECK(cache.layer(2).bytes_resident() * 150 == cache.layer(0).bytes_resident() * 60);
  const std::vector<int32_t> later = testing::kept(cache, 2, 0);
  CHECK(testing::kept(cache, 3, 1) == later);  // every later layer and head: the same tokens
  for (int32_t p = kContext - 8; p < kContext; ++p) {
    CHECK(std::count(later.begin(), later.end(), p) == 1);  // the window propagates
  }

  // Against SnapKV's window and pooling at the same ratio without propagation: fewer bytes.
  KvCache plain = make_cache("fastkv:ratio=0.5,tsp_layer=1", tiny_model().kv_shape());
  plain_context(plain, context);
  CHECK(plain.stats().tokens_per_layer == std::vector<int64_t>{150, 150, 150, 150});
  CHECK(cache.bytes_resident() < plain.bytes_resident());

  // And they grow as compressed layers do, by the eviction slack (64), not geometrically.
  const int64_t before = cache.layer(2).bytes_resident();
  tiny_model().decode(context.back(), cache);
  CHECK(cache.layer(2).bytes_resident() * 60 == before * (60 + 1 + 64));
}

TEST_CASE("fastkv with every token propagating is its plain prefill, bit for bit",
          "[unit][fastkv]") {
  const std::vector<int32_t> all = tokens(kContext + 3);
  const std::vector<int32_t> context(all.begin(), all.begin() + kContext);
  // tsp_rate 1: all propagate; budget 64 < context: every layer compresses the same way.
  KvCache a = make_cache("fastkv:budget=64,tsp_layer=1,tsp_rate=1", tiny_model().kv_shape());
  KvCache b = make_cache("fastkv:budget=64,tsp_layer=1,tsp_rate=1", tiny_model().kv_shape());
  REQUIRE(propagate_context(a, context) == plain_context(b, context));
  CHECK(a.stats().tokens_per_layer == std::vector<int64_t>{64, 64, 64, 64});
  for (int32_t l = 0; l < kLayers; ++l) CHECK(testing::kept(a, l, 0) == testing::kept(b, l, 0));
  for (int i = 0; i < 3; ++i) {
    REQUIRE(tiny_model().decode(all[kContext + i], a) ==
            tiny_model().decode(all[kContext + i], b));
  }

  // A budget of at least the context: the full cache's logits, bit for bit.
  KvCache roomy = make_cache("fastkv:budget=2000,tsp_layer=1", tiny_model().kv_shape());
  KvCache full = make_full_cache(tiny_model().kv_shape());
  REQUIRE(propagate_context(roomy, context) == plain_context(full, context));
  for (int i = 0; i < 3; ++i) {
    REQUIRE(tiny_model().decode(all[kContext + i], roomy) ==
            tiny_model().decode(all[kContext + i], full));
  }
  CHECK(roomy.bytes_resident() == full.bytes_resident());
}

TEST_CASE("fastkv refuses bad parameters, the GPU and the shared prefill", "[unit][fastkv]") {
  CHECK_THROWS_AS(resolve_method_spec("fastkv:kernel=4"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("fastkv:tsp_rate=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("fastkv:tsp_rate=1.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("fastkv:tsp_layer=-2"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("fastkv:budget=4"), InputError);  // below the window
  CHECK_THROWS_AS(resolve_method_spec("fastkv:budget=64,ratio=0.5"), InputError);
  CHECK_NOTHROW(resolve_method_spec("fastkv:ratio=0.1,tsp_rate=0.2,tsp_layer=15"));
  CHECK_THROWS_AS(check_runs_on(resolve_method_spec("fastkv"), ModelDevice::Cuda), InputError);
  CHECK_NOTHROW(check_runs_on(resolve_method_spec("snapkv"), ModelDevice::Cuda));
  CHECK_FALSE(SharedPrefill::can_share(resolve_method_spec("fastkv"), tiny_model()));
  CHECK(SharedPrefill::can_share(resolve_method_spec("snapkv"), tiny_model()));
}
