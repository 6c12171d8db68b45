// A full policy, where value_attention.cpp is the scorer form: VATP as its authors pair it
// with H2O (Guo et al., "Attention Score is not All You Need for Token Importance Indicator
// in KV Cache Reduction: Value Also Matters", EMNLP 2024, arXiv 2406.12335). A token's
// importance is the attention it has received, summed over every query so far (H2O's heavy
// hitters), times the L1 norm of its value; each KV head keeps its `recent` share of the
// budget as the newest tokens and the most important others, and evicts again after every
// forward, so a decode step that adds a token drops one. Under an allocation method
// (adakv+vatp_h2o:ratio=0.25) the layer's budget is split over its KV heads at the end of the
// context, and each head keeps its own count from then on.
//
// What a full policy does that a scorer cannot: state across forwards (the received
// attention, moved along when the store reorders slots), plans after the context, and
// per-head counts that differ. docs/methods.md, "A full policy", walks through it.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <vector>

#include "cache/allocation.h"
#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/plugin_api.h"
#include "kernels/cpu/scores.h"

namespace example {
namespace {

using kvbench::CachePhase;
using kvbench::DenseKv;
using kvbench::RetainPlan;

class VatpH2oPolicy : public kvbench::TokenPolicy {
 public:
  VatpH2oPolicy(const kvbench::MethodParams& params, const kvbench::KvShape& shape,
                std::shared_ptr<const kvbench::HeadAllocation> allocation)
      : limits_(kvbench::budget_from(params), shape.n_layers),
        recent_(params.get_float("recent")),
        allocation_(std::move(allocation)),
        n_kv_heads_(shape.n_kv_heads),
        layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<VatpH2oPolicy>(*this);
  }

  // Every query row's attention. On the CPU the store hands it from the attention pass itself
  // (observe_scores); a layer split into heads of their own counts cannot, and the cache
  // calls observe instead, where the same sums come from the scores kernel.
  ScoredRows scored_rows() const override { return ScoredRows::All; }
  void observe_scores(int32_t layer, const float* scores, int32_t n_heads,
                      int64_t n_tokens) override {
    add(layer, scores, n_heads, n_tokens);
  }
  void observe(int32_t layer, const kvbench::AttentionQuery& query, const DenseKv& kv) override {
    std::vector<float> scores(static_cast<size_t>(query.n_heads) * kv.n_tokens, 0.f);
    kvbench::attention_scores_cpu(query, kv, scores.data());  // padding rows get none
    add(layer, scores.data(), query.n_heads, kv.n_tokens);
  }
  // The plan reads values, so it needs them (on a GPU too), and per-head layers gathered.
  bool plans_on_kv() const override { return true; }
  bool reads_ragged_heads() const override { return true; }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t limit = limits_.resolve(layer, phase, kv.n_tokens);
    if (limit < 0) return false;
    Layer& state = layers_[layer];
    // Each head's budget: the layer's, or its own once an allocation split it.
    std::vector<int64_t> budget(static_cast<size_t>(kv.n_kv_heads), limit);
    if (!state.head_budget.empty()) budget = state.head_budget;
    bool over = false;
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) over = over || kv.tokens(h) > budget[h];
    if (!over) return false;

    // Importance per slot: received attention times ||v||_1; the newest `recent` share of
    // the head's budget above any score; padding (past a head's own count) below any.
    const int64_t n = kv.n_tokens;
    state.grow(kv.n_kv_heads, n);
    std::vector<float> ranked(static_cast<size_t>(kv.n_kv_heads) * n, -FLT_MAX);
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int64_t held = kv.tokens(h);
      for (int64_t t = 0; t < held; ++t) {
        const float* v = kv.value(h, t);  // rows `capacity` apart: kv.value says where
        float l1 = 0.f;
        for (int32_t c = 0; c < kv.head_dim; ++c) l1 += std::fabs(v[c]);
        ranked[h * n + t] = state.received[h * state.stride + t] * l1;
      }
      const int64_t n_recent = std::min<int64_t>(
          held, static_cast<int64_t>(std::floor(recent_ * static_cast<double>(budget[h]))));
      const std::vector<int32_t> order = kvbench::slots_by_position(kv, h, 0, n_recent);
      for (int64_t i = held - n_recent; i < held; ++i) ranked[h * n + order[i]] = FLT_MAX;
    }

    if (allocation_ && state.head_budget.empty()) {
      // The first plan (the end of the context): the allocation splits the layer's budget,
      // n_kv_heads x limit tokens, by these scores; each head keeps its count from now on.
      state.head_budget = allocation_->head_counts(ranked.data(), n, kv.n_kv_heads, n, limit);
      kvbench::plan_top_k_ragged(ranked.data(), kv.n_kv_heads, n, state.head_budget, plan);
    } else if (!state.head_budget.empty()) {
      std::vector<int64_t> keep(static_cast<size_t>(kv.n_kv_heads));
      for (int32_t h = 0; h < kv.n_kv_heads; ++h) keep[h] = std::min(kv.tokens(h), budget[h]);
      kvbench::plan_top_k_ragged(ranked.data(), kv.n_kv_heads, n, keep, plan);
    } else {
      kvbench::plan_top_k_per_head(ranked.data(), kv.n_kv_heads, n, limit, plan);
    }
    return true;
  }

  // The store moved KV head h's kept slots: new slot j holds old slot
  // plan.slots[plan.head_offset(h) + j] (never below j), so the sums follow in place.
  void retained(int32_t layer, const RetainPlan& plan) override {
    Layer& state = layers_[layer];
    for (int32_t h = 0; h < n_kv_heads_ && state.stride > 0; ++h) {
      float* row = state.received.data() + h * state.stride;
      const int32_t* from = plan.slots.data() + plan.head_offset(h);
      const int64_t kept = plan.kept(h);
      for (int64_t j = 0; j < kept; ++j) row[j] = row[from[j]];
      std::fill(row + kept, row + state.stride, 0.f);  // the next tokens start at nothing
    }
  }

  int64_t bytes_resident(int32_t layer) const override {
    return static_cast<int64_t>(layers_[layer].received.size() * sizeof(float));
  }

 private:
  // Attention each slot has received, summed over every query row and the KV head's query
  // heads: received[h * stride + t] for slot t of KV head h.
  struct Layer {
    std::vector<float> received;
    int64_t stride = 0;
    std::vector<int64_t> head_budget;  // per KV head, once an allocation split the layer

    void grow(int32_t n_kv_heads, int64_t n_tokens) {
      if (n_tokens <= stride) return;
      const int64_t wider = std::max(n_tokens, 2 * stride);
      std::vector<float> next(static_cast<size_t>(n_kv_heads) * wider, 0.f);
      for (int32_t h = 0; h < n_kv_heads && stride > 0; ++h) {
        std::copy_n(received.begin() + h * stride, stride, next.begin() + h * wider);
      }
      received.swap(next);
      stride = wider;
    }
  };

  // scores: [n_heads, n_tokens] query heads; each KV head sums its group's.
  void add(int32_t layer, const float* scores, int32_t n_heads, int64_t n_tokens) {
    Layer& state = layers_[layer];
    state.grow(n_kv_heads_, n_tokens);
    const int32_t group = n_heads / n_kv_heads_;
    for (int32_t q = 0; q < n_heads; ++q) {
      float* row = state.received.data() + (q / group) * state.stride;
      for (int64_t t = 0; t < n_tokens; ++t) row[t] += scores[q * n_tokens + t];
    }
  }
  kvbench::LayerLimits limits_;
  double recent_;
  std::shared_ptr<const kvbench::HeadAllocation> allocation_;
  int32_t n_kv_heads_;
  std::vector<Layer> layers_;
};

}  // namespace

kvbench::MethodInfo vatp_h2o() {
  kvbench::MethodInfo m;
  m.name = "vatp_h2o";
  m.kind = kvbench::MethodKind::Eviction;
  m.stage = "2: at the end of the shared context, then after every forward (a plugin)";
  m.summary = "per KV head, the most recent tokens plus those with the most attention "
              "received (summed over every query, as H2O) times the value's L1 norm (VATP)";
  m.paper = "Attention Score is not All You Need for Token Importance Indicator in KV Cache "
            "Reduction: Value Also Matters (Guo et al., EMNLP 2024), arXiv 2406.12335";
  m.choices = {"GQA: each KV head sums its query heads' attention; the recent share is "
               "H2O's `recent` parameter of kvbench"};
  m.params = kvbench::budget_params(kvbench::kDefaultBudget);
  m.params.push_back(kvbench::float_param(
      "recent", "0.5", 0, 1, "share of each head's budget for its newest tokens"));
  m.check = kvbench::check_budget;
  m.make_policy = [](const kvbench::MethodParams& params, const kvbench::KvShape& shape) {
    return std::unique_ptr<kvbench::TokenPolicy>(new VatpH2oPolicy(params, shape, nullptr));
  };
  m.make_allocated_policy = [](const kvbench::MethodParams& params,
                               const kvbench::KvShape& shape,
                               std::shared_ptr<const kvbench::HeadAllocation> allocation) {
    return std::unique_ptr<kvbench::TokenPolicy>(
        new VatpH2oPolicy(params, shape, std::move(allocation)));
  };
  return m;
}

}  // namespace example
