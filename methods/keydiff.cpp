// KeyDiff: keep, per KV head, the keys least similar to the head's anchor, the mean of its
// L2-normalised keys (distinctive keys draw attention); attention-free, so it suits
// FlashAttention-style kernels (score = -cos(k, anchor), kvpress KeyDiffPress; the official
// code is not public). The paper processes the prompt block-wise under a fixed cache size,
// evicting after each block: prefill=stream,chunk=128 does that, really streamed, so the
// cache never holds more than budget + chunk tokens, and the anchor is taken over what is
// stored at each eviction (the kept tokens plus the new block). kvpress's BlockPress is not
// this: it scores blocks over a fully prefilled KV (list methods' choices). The default prefill is dense, compressing once at the end of the
// context, as kvpress's KeyDiffPress alone. Not applied after the context. Kept tokens
// keep their positions.
#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/prefill_mode.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

class KeyDiffPolicy : public TokenPolicy {
 public:
  KeyDiffPolicy(const Budget& budget, int64_t chunk, int32_t n_layers)
      : limits_(budget, n_layers), chunk_(chunk) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<KeyDiffPolicy>(*this);
  }

  // prefill=stream (a token budget): the context comes in chunks, each followed by a plan.
  int64_t context_block() const override { return chunk_; }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::AfterContext) return false;
    const int64_t limit = limits_.resolve(layer, phase, kv.n_tokens);
    if (limit < 0 || kv.n_tokens <= limit) return false;
    std::vector<float> scores(static_cast<size_t>(kv.n_kv_heads) * kv.n_tokens);
    key_anchor_cosine_cpu(kv, scores.data());
    for (float& s : scores) s = -s;  // the top scores are the least anchor-like keys
    plan_top_k_per_head(scores.data(), kv.n_kv_heads, kv.n_tokens, limit, plan);
    return true;
  }

 private:
  LayerLimits limits_;
  int64_t chunk_;  // 0: dense prefill
};

}  // namespace

MethodInfo keydiff_method() {
  MethodInfo info;
  info.name = "keydiff";
  info.kind = MethodKind::Eviction;
  info.stage = "2: after prefill (or every streamed chunk, the paper's block-wise prefill)";
  info.summary =
      "keeps the keys least similar (cosine) to the mean normalised key, per KV head";
  info.paper =
      "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in "
      "Resource-Constrained Environments (Park et al., 2025), arXiv 2504.15364";
  info.choices = {
      "the authors' code is not public: kvpress's KeyDiffPress. prefill=stream,chunk=128 is "
      "the paper's block-wise prefill, really streamed: the cache never holds more than "
      "budget + 128 tokens. It is NOT kvpress's BlockPress, which scores blocks over a fully "
      "prefilled KV starting from the first n_kept tokens, so it will not reproduce kvpress's "
      "KeyDiff+BlockPress numbers",
      "prefill=dense by default, as kvpress's KeyDiffPress alone and the other methods",
  };
  info.params = budget_params(kDefaultBudget);
  for (const ParamInfo& p : prefill_params()) info.params.push_back(p);
  info.check = [](const MethodParams& params) {
    check_budget(params);
    check_prefill(params);
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new KeyDiffPolicy(budget_from(params), stream_chunk(params), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
