// Knorm: keep, per KV head, the tokens whose key has the lowest L2 norm (low-norm keys draw
// high attention); attention-free. Keys are the stored post-RoPE keys, as in
// alessiodevoto/l2compress (l2_compress) and kvpress KnormPress (score = -||k||). The first
// `skip` layers are left whole (l2compress README and KVCache-Factory skip_layers [0, 1]).
// Applied once to the shared context at ContextEnd; later tokens are appended uncompressed.
// l2compress re-orders the kept cache by norm; here kept tokens stay in position order and
// keep their positions.
#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

class KnormPolicy : public TokenPolicy {
 public:
  KnormPolicy(const Budget& budget, int64_t skip, int32_t n_layers)
      : limits_(budget, n_layers), skip_(skip) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<KnormPolicy>(*this);
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd || layer < skip_) return false;
    const int64_t limit = limits_.resolve(layer, phase, kv.n_tokens);
    if (limit < 0 || kv.n_tokens <= limit) return false;
    std::vector<float> scores(static_cast<size_t>(kv.n_kv_heads) * kv.n_tokens);
    key_norms_cpu(kv, scores.data());
    for (float& s : scores) s = -s;  // the top scores are the lowest norms
    plan_top_k_per_head(scores.data(), kv.n_kv_heads, kv.n_tokens, limit, plan);
    return true;
  }

 private:
  LayerLimits limits_;
  int64_t skip_;
};

}  // namespace

MethodInfo knorm_method() {
  MethodInfo info;
  info.name = "knorm";
  info.kind = MethodKind::Eviction;
  info.stage = "2: after prefill";
  info.summary = "keeps the keys with the lowest L2 norm, per KV head (attention-free)";
  info.paper =
      "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (Devoto et al., "
      "EMNLP 2024), arXiv 2406.11430";
  info.choices = {
      "kept tokens stay in position order (l2compress re-orders the cache by norm)",
      "the cut falls between near-equal norms in some heads (on a 915-token prompt of Qwen "
      "one exact tie and 7 of 48 heads within 3e-5 relative), so kvbench and kvpress can keep "
      "a different token there: the two forwards accumulate in another order",
  };
  const ParamInfo skip =
      int_param("skip", 2, 0, kMaxTokens,
                "the first `skip` layers keep every token (l2compress skip_layers [0, 1])");
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(skip);
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new KnormPolicy(budget_from(params), params.get_int("skip"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
