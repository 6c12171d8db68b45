// Heads of their own on the real model: adakv+snapkv keeps as many tokens as snapkv at the
// same ratio, split unevenly over each layer's KV heads, and its stores hold exactly those
// tokens: fewer bytes than a rectangle padded to each layer's longest head (what a store of
// equal heads would need for the same choice), none more than snapkv's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "cache/registry.h"
#include "datasets/sample.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "model_path.h"

using namespace kvbench;

TEST_CASE("adakv+snapkv on the real model: uneven heads, the same tokens, bytes of what is held",
          "[model]") {
  const auto model = LlamaModel::load(testing::model_path_or_skip());
  const auto samples = load_samples_jsonl(std::string(KVBENCH_FIXTURES) +
                                          "/../../datasets/examples/kv_retrieval.jsonl");
  REQUIRE(samples.size() == 1);
  const std::vector<int32_t> context = model->tokenizer().encode(samples[0].context);
  REQUIRE(context.size() > 300);
  const KvShape shape = model->kv_shape();
  const int64_t row_bytes = 2 * shape.head_dim * sizeof(float) + sizeof(int32_t);

  KvCache ada = new_cache(*model, resolve_method_spec("adakv+snapkv:ratio=0.25"));
  KvCache even = new_cache(*model, resolve_method_spec("snapkv:ratio=0.25"));
  for (KvCache* cache : {&ada, &even}) {
    model->forward(context, *cache);
    cache->end_context();
  }
  const CacheStats a = ada.stats(), e = even.stats();
  int64_t ada_tokens = 0, even_tokens = 0, padded = 0, ada_store = 0, even_store = 0;
  int uneven_layers = 0;
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    const auto first = a.tokens_per_head.begin() + l * shape.n_kv_heads;
    const auto [least, most] = std::minmax_element(first, first + shape.n_kv_heads);
    uneven_layers += *least != *most;
    padded += *most * shape.n_kv_heads * row_bytes;
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      ada_tokens += a.tokens_per_head[l * shape.n_kv_heads + h];
      even_tokens += e.tokens_per_head[l * shape.n_kv_heads + h];
    }
    ada_store += ada.layer(l).bytes_resident();
    even_store += even.layer(l).bytes_resident();
  }
  INFO("uneven layers " << uneven_layers << " of " << shape.n_layers);
  CHECK(uneven_layers > shape.n_layers / 2);
  // AdaKV's rounded-down floor may leave a token or so per head of the budget unused.
  CHECK(ada_tokens <= even_tokens);
  CHECK(ada_tokens >= even_tokens - shape.n_layers * shape.n_kv_heads);
  CHECK(ada_store == ada_tokens * row_bytes);
  CHECK(ada_store <= even_store);
  CHECK(ada_store < padded);
  // And it decodes on: the next token's logits are finite.
  const std::vector<float> logits = model->decode(context.back(), ada);
  CHECK(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("adakv+snapkv+kivi on the real model: the heads adakv+snapkv keeps, each packed on its "
          "own",
          "[model]") {
  const auto model = LlamaModel::load(testing::model_path_or_skip());
  const auto samples = load_samples_jsonl(std::string(KVBENCH_FIXTURES) +
                                          "/../../datasets/examples/kv_retrieval.jsonl");
  const std::vector<int32_t> context = model->tokenizer().encode(samples[0].context);
  KvCache fp32 = new_cache(*model, resolve_method_spec("adakv+snapkv:ratio=0.5"));
  const std::string kivi = "+kivi:bits=4,residual=32";
  KvCache packed = new_cache(*model, resolve_method_spec("adakv+snapkv:ratio=0.5" + kivi));
  KvCache even = new_cache(*model, resolve_method_spec("snapkv:ratio=0.5" + kivi));
  for (KvCache* cache : {&fp32, &packed, &even}) {
    model->forward(context, *cache);
    cache->end_context();
  }
  // The plan is made on the fp32 context before anything is packed: the same heads.
  const CacheStats a = fp32.stats(), p = packed.stats(), e = even.stats();
  CHECK(p.tokens_per_head == a.tokens_per_head);
  INFO("fp32 " << a.bytes_resident << ", kivi " << p.bytes_resident << ", snapkv+kivi "
               << e.bytes_resident);
  CHECK(p.bytes_resident * 2 < a.bytes_resident);
  // About snapkv+kivi's bytes at the same tokens: each head's last partial block and fp32
  // tail are its own, so a little more, never a rectangle of the longest head.
  CHECK(p.bytes_resident < e.bytes_resident * 5 / 4);
  const std::vector<float> logits = model->decode(context.back(), packed);
  CHECK(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
}
