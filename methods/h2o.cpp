// H2O (Heavy-Hitter Oracle): every slot accumulates the softmax attention it receives from
// every query, at every forward (context chunks, later queries, decode steps). Once the
// context is in and after every later forward, a layer over budget keeps, per KV head, its
// most recent tokens plus the heaviest hitters among the rest; one decode step evicts one.
//
// Where sources differ (docs/methods.md, "Where sources differ"):
// - scores are SUMS over queries, as the original (FMInference/H2O _update_hh_score), which
//   favours early tokens; kvpress's ObservedAttentionPress takes a mean and only prefills.
// - scores are kept per query head (the original is MHA); the GQA group's scores are summed
//   per KV head when planning, since the cache stays per KV head.
// - budget: the original sets heavy and recent as ratios of the prompt (0.1 + 0.1) or as
//   token counts (1024 + 1024); here `budget` (or `ratio`) is the total and `recent` the
//   share of it for the recent window: floor(recent * budget) recent tokens, as the
//   original's int(ratio * len), the rest heavy hitters.
// - the context is not compressed chunk by chunk: scores accumulate over the chunks (the
//   original's full prompt attention matrix, summed by columns) and eviction starts at
//   ContextEnd, as in the original where eviction follows the prompt.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "methods/received_attention.h"

namespace kvbench {
namespace {

class H2oPolicy : public TokenPolicy {
 public:
  H2oPolicy(const Budget& budget, double recent, const KvShape& shape)
      : limits_(budget, shape.n_layers),
        recent_(recent),
        n_kv_heads_(shape.n_kv_heads),
        layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override { return std::make_unique<H2oPolicy>(*this); }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    layers_[layer].observe(query, kv);
  }

  // On a GPU: every query row's attention, summed there (attention_scores_cuda).
  ScoredRows scored_rows() const override { return ScoredRows::All; }
  void observe_scores(int32_t layer, const float* scores, int32_t n_heads,
                      int64_t n_tokens) override {
    layers_[layer].add(scores, n_heads, n_tokens);
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    ReceivedAttention& received = layers_[layer];
    received.grow(n);
    // Per KV head, the group's summed scores; the recent slots (highest positions) ranked
    // above any score so top-k keeps them.
    const int64_t n_recent =
        std::min(limit, static_cast<int64_t>(std::floor(recent_ * limit + 1e-9)));
    std::vector<float> ranked = received.per_kv_head(n_kv_heads_);
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      const std::vector<int32_t> order = slots_by_position(kv, g, 0, n_recent);
      for (int64_t i = n - n_recent; i < n; ++i) ranked[g * n + order[i]] = FLT_MAX;
    }
    plan_top_k_per_head(ranked.data(), n_kv_heads_, n, limit, plan);
    return true;
  }

  void retained(int32_t layer, const RetainPlan& plan) override {
    layers_[layer].retained(plan, n_kv_heads_);
  }

  int64_t bytes_resident(int32_t layer) const override { return layers_[layer].bytes(); }

 private:
  LayerLimits limits_;
  double recent_;
  int32_t n_kv_heads_;
  std::vector<ReceivedAttention> layers_;  // per layer
};

}  // namespace

// Registered as `h2o` (methods/method_list.cpp).
MethodInfo h2o_method() {
  MethodInfo info;
  info.name = "h2o";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: at the end of the shared context, then after every forward (one token per "
      "decode step)";
  info.summary =
      "per KV head, the most recent tokens plus the heavy hitters: the largest attention "
      "received, summed over every query so far";
  info.paper =
      "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models "
      "(Zhang et al., NeurIPS 2023), arXiv 2306.14048";
  info.choices = {
      "scores are sums over every query so far, as the original; kvpress's "
      "ObservedAttentionPress takes a mean over the prefill only",
      "GQA: scores are kept per query head and summed over the group per KV head",
  };
  info.params = budget_params(kDefaultBudget);
  const ParamInfo recent =
      float_param("recent", "0.5", 0, 1,
                  "share of the budget for the most recent tokens; the rest are heavy hitters");
  info.params.push_back(recent);
  info.check = check_budget;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new H2oPolicy(budget_from(params), params.get_float("recent"), shape));
  };
  return info;
}

}  // namespace kvbench
