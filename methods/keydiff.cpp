// KeyDiff: keep, per KV head, the keys least similar to the head's anchor, the mean of its
// L2-normalised keys (distinctive keys draw attention); attention-free, so it suits
// FlashAttention-style kernels. The paper processes the prompt block-wise under a fixed
// cache size, evicting after each block: context_block() asks for the context in blocks of
// `block` tokens and each block is followed by an eviction, so the cache never holds more
// than budget + block tokens (kvpress BlockPress(block_size=128) around KeyDiffPress,
// score = -cos(k, anchor); the official code is not public). The anchor is taken over what
// is stored at each eviction: the kept tokens plus the new block. Not applied after the
// context. Kept tokens keep their positions.
#include <string>

#include "harness/input_error.h"
#include "kernels/cpu/scores.h"
#include "methods/budget.h"
#include "methods/plan_helpers.h"
#include "methods/registry.h"

namespace kvbench {
namespace {

class KeyDiffPolicy : public TokenPolicy {
 public:
  KeyDiffPolicy(const Budget& budget, int64_t block, int32_t n_layers)
      : limits_(budget, n_layers), block_(block) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<KeyDiffPolicy>(*this);
  }

  // Blocks only help a token budget: a ratio is known at ContextEnd, after the last block.
  int64_t context_block() const override { return limits_.budget().is_ratio() ? 0 : block_; }

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
  int64_t block_;
};

}  // namespace

MethodInfo keydiff_method() {
  MethodInfo info;
  info.name = "keydiff";
  info.kind = MethodKind::Eviction;
  info.stage = "2: block-wise during prefill (token budgets) and after prefill";
  info.summary =
      "keeps the keys least similar (cosine) to the mean normalised key, per KV head, "
      "evicting after every context block";
  info.paper =
      "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in "
      "Resource-Constrained Environments (Park et al., 2025), arXiv 2504.15364";
  info.choices = {
      "the authors' code is not public: kvpress's BlockPress(block_size=128) around "
      "KeyDiffPress",
      "block is at most 512, as each 512-token prefill forward is followed by an "
      "eviction",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("block", 128, 1, kNoMax,
                                  "context tokens fed per block, each followed by an eviction "
                                  "(token budgets; kvpress BlockPress 128)"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    // Each model forward of the context is followed by an eviction, so a larger block
    // would silently act as kPrefillChunk.
    if (params.get_int("block") > kPrefillChunk) {
      throw InputError("keydiff block=" + params.get("block") + ": the context is prefilled in "
                       "forwards of at most " + std::to_string(kPrefillChunk) +
                       " tokens, each followed by an eviction, so block must be at most " +
                       std::to_string(kPrefillChunk));
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new KeyDiffPolicy(budget_from(params), params.get_int("block"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
