// LazyEviction: tokens that were important once tend to become important again after a
// while ("token importance recurrence"), so each token's recurrence is tracked and eviction
// is lagged. Every forward is one observation step: per KV head, a token is "important" at
// a step when the latest query's attention to it (the GQA group's mean) exceeds
// alpha / n_tokens (above a uniform share at alpha 1). Per token: the step it was last
// important and its Maximum Recurrence Interval (MRI), the longest gap seen between two
// important steps (a new token counts as important the step before it arrives). Eviction
// happens once every `window` steps after the context (and once at its end), never in
// between: each KV head then keeps the newest `window` tokens (not yet observed a full
// window) and, of the rest, those with the largest MRI - (steps since last important), so
// a token idle for longer than its MRI is evicted first. Ties (e.g. tokens never important)
// go to the latest step's attention, then to the older slot.
//
// Authors' settings (arXiv 2506.15969; the code link, Halo-949/LazyEviction, has no
// snapshot here): the paper's rule as read above; its thresholds and window size are not
// known here, so alpha 1 (above 1/n) and window 32 are kvbench's choices.
// Between evictions the cache exceeds its budget by up to window - 1 tokens per decode
// step's token (a lagged evictor by design); right after each eviction it holds the budget.
#include <algorithm>
#include <cfloat>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

class LazyEvictionPolicy : public TokenPolicy {
 public:
  LazyEvictionPolicy(const Budget& budget, int64_t window, double alpha, const KvShape& shape)
      : limits_(budget, shape.n_layers),
        window_(window),
        alpha_(alpha),
        n_kv_heads_(shape.n_kv_heads),
        layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<LazyEvictionPolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    const std::vector<float> per_head = last_row_scores_cpu(query, kv);
    observe_scores(layer, per_head.data(), query.n_heads, kv.n_tokens);
  }

  // On a GPU: the last query row's attention per head, computed there.
  ScoredRows scored_rows() const override { return ScoredRows::Last; }
  void observe_scores(int32_t layer, const float* per_head, int32_t n_heads,
                      int64_t n) override {
    LayerState& s = layers_[layer];
    ++s.step;
    grow(s, n);
    const int32_t group = std::max(1, n_heads / n_kv_heads_);
    const float threshold = static_cast<float>(alpha_ / static_cast<double>(n));
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      for (int64_t t = 0; t < n; ++t) {
        float a = 0;
        for (int32_t h = g * group; h < (g + 1) * group; ++h) a += per_head[h * n + t];
        a /= static_cast<float>(group);
        const int64_t i = g * n + t;
        s.attention[i] = a;
        if (a > threshold) {
          s.mri[i] = std::max(s.mri[i], s.step - s.last_important[i]);
          s.last_important[i] = s.step;
        }
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0) return false;
    LayerState& s = layers_[layer];
    // Lagged: after the context, only every `window`-th forward may evict.
    if (phase == CachePhase::AfterContext) {
      if (++s.since_eviction < window_) return false;
    }
    s.since_eviction = 0;
    if (n <= limit) return false;
    grow(s, n);  // slots no query has seen yet (none in a model forward)
    std::vector<float> ranked(static_cast<size_t>(n_kv_heads_ * n));
    for (int64_t i = 0; i < n_kv_heads_ * n; ++i) {
      const int32_t idle = s.step - s.last_important[i];
      ranked[i] = static_cast<float>(s.mri[i] - idle) + 0.5f * s.attention[i];
    }
    const int64_t n_recent = std::min(window_, limit);
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      const std::vector<int32_t> order = slots_by_position(kv, g, 0, n_recent);
      for (int64_t i = n - n_recent; i < n; ++i) ranked[g * n + order[i]] = FLT_MAX;
    }
    plan_top_k_per_head(ranked.data(), n_kv_heads_, n, limit, plan);
    return true;
  }

  void retained(int32_t layer, const RetainPlan& plan) override {
    LayerState& s = layers_[layer];
    retain_rows(s.last_important, n_kv_heads_, s.n_tokens, plan, n_kv_heads_);
    retain_rows(s.mri, n_kv_heads_, s.n_tokens, plan, n_kv_heads_);
    retain_rows(s.attention, n_kv_heads_, s.n_tokens, plan, n_kv_heads_);
    s.n_tokens = plan.n_keep;
  }

  int64_t bytes_resident(int32_t layer) const override {
    const LayerState& s = layers_[layer];
    return vector_bytes(s.last_important) + vector_bytes(s.mri) + vector_bytes(s.attention);
  }

 private:
  struct LayerState {
    int32_t step = 0;                     // observation steps (forwards) so far
    int64_t since_eviction = 0;           // forwards after the context since the last check
    int64_t n_tokens = 0;                 // slots the per-token state covers
    std::vector<int32_t> last_important;  // [n_kv_heads, n_tokens]: step last important
    std::vector<int32_t> mri;             // [n_kv_heads, n_tokens]: max recurrence interval
    std::vector<float> attention;         // [n_kv_heads, n_tokens]: the latest step's
  };

  // Slots appended since the last call (at the end of every head): important "the step
  // before" the current one, no interval yet.
  void grow(LayerState& s, int64_t n) const {
    if (n <= s.n_tokens) return;
    grow_rows(s.last_important, s.n_tokens, n, s.step - 1);
    grow_rows(s.mri, s.n_tokens, n, 0);
    grow_rows(s.attention, s.n_tokens, n, 0.f);
    s.n_tokens = n;
  }

  template <typename T>
  void grow_rows(std::vector<T>& rows, int64_t old, int64_t n, T fill) const {
    rows.resize(static_cast<size_t>(n_kv_heads_ * n));
    for (int64_t r = n_kv_heads_ - 1; r >= 0; --r) {
      std::copy_backward(rows.begin() + r * old, rows.begin() + (r + 1) * old,
                         rows.begin() + r * n + old);
      std::fill(rows.begin() + r * n + old, rows.begin() + (r + 1) * n, fill);
    }
  }

  LayerLimits limits_;
  int64_t window_;
  double alpha_;
  int32_t n_kv_heads_;
  std::vector<LayerState> layers_;
};

}  // namespace

// Registered as `lazy_eviction` (methods/method_list.cpp).
MethodInfo lazy_eviction_method() {
  MethodInfo info;
  info.name = "lazy_eviction";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: at the end of the shared context, then once every `window` forwards (lagged: up "
      "to window - 1 decode tokens over the budget in between)";
  info.summary =
      "per KV head, the newest `window` tokens + the tokens whose Maximum Recurrence Interval "
      "of high attention most exceeds their time since last high attention";
  info.paper =
      "LazyEviction: Lagged KV Eviction with Attention Pattern Observation for Efficient Long "
      "Reasoning (Zhang et al., 2025), arXiv 2506.15969";
  info.choices = {
      "the paper's rule (the authors' code has no snapshot here): one observation step per "
      "forward, scored by its last query row; a multi-token forward (the context, a "
      "question) is one step",
      "'high attention': the GQA group's mean attention above alpha / n_tokens (alpha 1: "
      "above a uniform share); window 32; both kvbench's choices",
      "priority kept = MRI - steps since last high attention (new tokens count as high the "
      "step before they arrive); ties to the latest attention; the newest `window` tokens "
      "always stay",
      "budget is held right after each eviction (end of context, every window-th forward); "
      "in between the cache grows by the forwards' tokens",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("window", 32, 1, kMaxTokens,
                                  "observation window: forwards between evictions; the "
                                  "newest `window` tokens are kept"));
  info.params.push_back(float_param("alpha", "1", 0, 1e6,
                                    "a token is important at a step when its attention "
                                    "exceeds alpha / n_tokens"));
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new LazyEvictionPolicy(
        budget_from(params), params.get_int("window"), params.get_float("alpha"), shape));
  };
  return info;
}

}  // namespace kvbench
