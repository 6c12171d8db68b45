// FastKV on the real model: the layers after the TSP layer hold only the propagated tokens,
// every layer at most the budget, the stores sized for what they hold, and the prefill runs
// fewer rows through the later layers than snapkv's at the same ratio.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "cache/registry.h"
#include "datasets/sample.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "model_path.h"

using namespace kvbench;

TEST_CASE("fastkv on the real model: later layers hold the propagated tokens", "[model]") {
  const auto model = LlamaModel::load(testing::model_path_or_skip());
  const auto samples = load_samples_jsonl(std::string(KVBENCH_FIXTURES) +
                                          "/../../datasets/examples/kv_retrieval.jsonl");
  REQUIRE(samples.size() == 1);
  const std::vector<int32_t> context = model->tokenizer().encode(samples[0].context);
  const int64_t n = static_cast<int64_t>(context.size());
  REQUIRE(n > 300);
  const KvShape shape = model->kv_shape();
  const int64_t row_bytes = 2 * shape.head_dim * sizeof(float) + sizeof(int32_t);

  KvCache fast = new_cache(*model, resolve_method_spec("fastkv:ratio=0.5"));
  KvCache snap = new_cache(*model, resolve_method_spec("snapkv:ratio=0.5"));
  const TokenPolicy* policy = fast.policy();
  const int32_t tsp = policy->propagation_layer();
  CHECK(tsp == shape.n_layers * 15 / 32);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  model->forward_propagating(context, tsp, [&](int32_t layer) {
    return policy->propagated_rows(layer, fast.layer(layer).view());
  }, fast);
  fast.end_context();
  const auto t1 = Clock::now();
  snap.reserve_more(n);
  model->forward(context, snap);
  snap.end_context();
  const auto t2 = Clock::now();
  using Ms = std::chrono::duration<double, std::milli>;
  const double fast_ms = Ms(t1 - t0).count(), snap_ms = Ms(t2 - t1).count();
  WARN("prefill of " << n << " tokens: fastkv " << fast_ms << " ms, snapkv " << snap_ms << " ms");

  const int64_t budget = (n + 1) / 2, propagated = static_cast<int64_t>(n * 0.2);
  const CacheStats f = fast.stats(), s = snap.stats();
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    INFO("layer " << l);
    CHECK(f.tokens_per_layer[l] == (l <= tsp ? budget : propagated));
    CHECK(s.tokens_per_layer[l] == budget);
    CHECK(fast.layer(l).bytes_resident() ==
          f.tokens_per_layer[l] * shape.n_kv_heads * row_bytes);
  }
  CHECK(fast.bytes_resident() < snap.bytes_resident());
  const std::vector<float> logits = model->decode(context.back(), fast);
  CHECK(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
}
