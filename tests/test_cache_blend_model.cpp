// CacheBlend on the real model: docs_kv documents prefilled one by one, then blended after
// a chat header. The first answer token's distribution is compared (KL) with a full
// prefill of the same tokens: recomputing 15% must come closer than naive reuse.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "datasets/generator.h"
#include "harness/cache_blend.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "model_path.h"

using namespace kvbench;

namespace {

// KL(p || q) of the softmax distributions of two logit vectors, in nats.
double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto log_softmax = [](const std::vector<float>& logits) {
    double max = logits[0];
    for (float x : logits) max = std::max<double>(max, x);
    double sum = 0;
    for (float x : logits) sum += std::exp(x - max);
    std::vector<double> out(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - max - std::log(sum);
    return out;
  };
  const auto lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

}  // namespace

TEST_CASE("cache blend, real model: 15% recompute is closer to a full prefill than naive reuse",
          "[model]") {
  const auto model = LlamaModel::load(testing::model_path_or_skip());
  const Tokenizer& tok = model->tokenizer();
  GeneratorOptions options;
  options.task = "docs_kv";
  options.context_tokens = 1000;
  options.turns = 1;
  options.samples = 3;
  options.seed = 11;
  const auto samples = generate_samples(options, tok);

  const std::vector<int32_t> header = tok.encode("<|im_start|>user\n");
  double kl_naive_total = 0, kl_blend_total = 0;
  for (const Sample& sample : samples) {
    REQUIRE(sample.documents.size() == 8);
    // Each document is a chunk with its trailing blank line, so the full prefill reads
    // exactly the blended tokens: the difference is CacheBlend's alone.
    std::vector<CachedChunk> chunks;
    std::vector<const CachedChunk*> pointers;
    std::vector<int32_t> full_tokens = header;
    for (const std::string& doc : sample.documents) {
      chunks.push_back(prefill_chunk(*model, tok.encode(doc + "\n\n", false)));
      const std::vector<int32_t>& doc_tokens = chunks.back().tokens;
      full_tokens.insert(full_tokens.end(), doc_tokens.begin(), doc_tokens.end());
    }
    for (const CachedChunk& c : chunks) pointers.push_back(&c);
    const std::vector<int32_t> query =
        tok.encode(sample.turns[0].input + "<|im_end|>\n<|im_start|>assistant\n");

    KvCache full = make_full_cache(model->kv_shape());
    model->forward(full_tokens, full);
    const std::vector<float> reference = model->forward(query, full);

    auto first_token_kl = [&](double ratio, BlendStats& stats) {
      KvCache cache = make_full_cache(model->kv_shape());
      model->forward(header, cache);
      stats = blend_chunks(*model, pointers, ratio, cache);
      return kl_divergence(reference, model->forward(query, cache));
    };
    // (Ratio 1 equals the full prefill: test_cache_blend checks it on the tiny model.)
    BlendStats naive_stats, blend_stats;
    const double kl_naive = first_token_kl(0.0, naive_stats);
    const double kl_blend = first_token_kl(0.15, blend_stats);
    std::printf("%s: %lld tokens in %zu documents; first-token KL vs full prefill: naive %.4f, "
                "blend 15%% (%lld recomputed) %.4f\n",
                sample.id.c_str(), static_cast<long long>(blend_stats.tokens),
                sample.documents.size(), kl_naive, static_cast<long long>(blend_stats.recomputed),
                kl_blend);
    CHECK(naive_stats.recomputed == 0);
    CHECK(blend_stats.recomputed == LlamaModel::recompute_count(0.15, blend_stats.tokens));
    kl_naive_total += kl_naive;
    kl_blend_total += kl_blend;
  }
  std::printf("mean first-token KL: naive %.4f, blend 15%% %.4f\n", kl_naive_total / samples.size(),
              kl_blend_total / samples.size());
  CHECK(kl_blend_total < kl_naive_total);
}
