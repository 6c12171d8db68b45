// TOVA (Token Omission Via Attention): a fixed-size cache per layer; whenever it is over
// budget, drop the tokens the latest query attends to least. Score = softmax attention of
// the last query row of the latest forward, averaged over all query heads: one score per
// token per layer, one kept set for every KV head (schwartz-lab-NLP/TOVA TOVACache.reduce).
// No sink or recent window is forced, as in the original (kvpress's TOVAPress forces the
// last token to stay; the original does not). Kept tokens keep their positions.
#include <algorithm>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

class TovaPolicy : public TokenPolicy {
 public:
  TovaPolicy(const Budget& budget, const KvShape& shape)
      : limits_(budget, shape.n_layers), scores_(shape.n_layers), n_kv_heads_(shape.n_kv_heads) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<TovaPolicy>(*this);
  }

  // Scores every stored slot by what the chunk's last query gives it, averaged over the
  // query heads; kept until plan.
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (under_budget(kv.n_tokens)) {
      scores_[layer].clear();  // under a token budget plan evicts nothing: skip the work
      return;
    }
    const std::vector<float> per_head = last_row_scores_cpu(query, kv);
    observe_scores(layer, per_head.data(), query.n_heads, kv.n_tokens);
  }

  // On a GPU: the last query row's attention per head, computed there.
  ScoredRows scored_rows() const override { return ScoredRows::Last; }
  void observe_scores(int32_t layer, const float* per_head, int32_t n_heads,
                      int64_t n_tokens) override {
    std::vector<float>& scores = scores_[layer];
    if (under_budget(n_tokens)) {
      scores.clear();
      return;
    }
    scores.assign(static_cast<size_t>(n_tokens), 0.f);
    for (int32_t h = 0; h < n_heads; ++h) {
      const float* row = per_head + static_cast<int64_t>(h) * n_tokens;
      for (int64_t t = 0; t < n_tokens; ++t) scores[t] += row[t];
    }
    for (float& s : scores) s /= static_cast<float>(n_heads);
  }

  // At ContextEnd (the last prompt token's query) and after every later forward: one
  // token per decode step once the cache is full. Context chunks are left whole.
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t limit = limits_.resolve(layer, phase, kv.n_tokens);
    if (limit < 0 || kv.n_tokens <= limit) return false;
    std::vector<float>& scores = scores_[layer];
    if (static_cast<int64_t>(scores.size()) != kv.n_tokens) {
      // No query has looked at these slots (nothing attended since they were stored):
      // keep the most recent ones.
      scores.resize(static_cast<size_t>(kv.n_tokens));
      for (int64_t t = 0; t < kv.n_tokens; ++t) scores[t] = static_cast<float>(kv.positions[t]);
    }
    plan_top_k_same(scores.data(), kv.n_tokens, limit, kv.n_kv_heads, plan);
    return true;
  }

  void retained(int32_t layer, const RetainPlan& plan) override {
    std::vector<float>& scores = scores_[layer];
    retain_rows(scores, 1, static_cast<int64_t>(scores.size()), plan, n_kv_heads_);
  }

  int64_t bytes_resident(int32_t layer) const override { return vector_bytes(scores_[layer]); }

 private:
  bool under_budget(int64_t n_tokens) const {
    const Budget& budget = limits_.budget();
    return !budget.is_ratio() && n_tokens <= budget.tokens;
  }

  LayerLimits limits_;
  std::vector<std::vector<float>> scores_;  // per layer: [n_tokens] head-mean attention
  int32_t n_kv_heads_;
};

}  // namespace

MethodInfo tova_method() {
  MethodInfo info;
  info.name = "tova";
  info.kind = MethodKind::Eviction;
  info.stage = "2: after prefill and every decode step";
  info.summary =
      "keeps the tokens the latest query attends to most (mean over heads), one set per layer";
  info.paper = "Transformers are Multi-State RNNs (Oren et al., 2024), arXiv 2401.06104";
  info.choices = {
      "no sink or recent token is forced, as the original (kvpress's TOVAPress keeps "
      "the last token)",
  };
  info.params = budget_params(kDefaultBudget);
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new TovaPolicy(budget_from(params), shape));
  };
  return info;
}

}  // namespace kvbench
