// SAGE-KV (Self-Attention Guided Eviction): once, after the full prefill, each KV head keeps
// the first `sink` tokens, the top-k of the middle tokens by the attention the LAST prompt
// token's query gives them, and a recent window of the newest context tokens (the last
// token among them). No scoring after that: during decode every new token enters the
// recent window and the window's oldest token leaves (FIFO), so the cache stays at the
// budget; the sinks and the top-k stay for good.
//
// Authors' settings (arXiv 2503.08879, SambaNova; no public code, the paper's rule):
// - the selection is "at the token and head level": per KV head here; the GQA group's query
//   heads' attention (softmax over the whole context) is averaged per KV head, as SnapKV's
//   kvbench port and kvpress do. The paper does not say how it aggregates a GQA group.
// - sink and recent sizes are not given in the paper's text we have; sink 4 (StreamingLLM's)
//   and recent 64 are chosen here. Both are part of the budget: k = budget - sink - recent.
// - no pooling of the scores (the paper selects raw top-k).
// Here: a budget at or above the context keeps it whole; then the tokens older than the
// recent window stay and the window grows to whatever the budget leaves (FIFO as before).
#include <algorithm>
#include <cfloat>
#include <climits>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

class SageKvPolicy : public TokenPolicy {
 public:
  SageKvPolicy(const Budget& budget, int64_t sink, int64_t recent, const KvShape& shape)
      : limits_(budget, shape.n_layers),
        sink_(sink),
        recent_(recent),
        n_kv_heads_(shape.n_kv_heads),
        scores_(shape.n_layers),
        window_start_(shape.n_layers, kUnselected) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<SageKvPolicy>(*this);
  }

  // Until the selection: the attention of the latest forward's last query row, kept per
  // KV head. The context's last chunk leaves the last prompt token's attention here.
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (window_start_[layer] != kUnselected) return;
    const std::vector<float> per_head = last_row_scores_cpu(query, kv);
    observe_scores(layer, per_head.data(), query.n_heads, kv.n_tokens);
  }

  ScoredRows scored_rows() const override { return ScoredRows::Last; }
  void observe_scores(int32_t layer, const float* per_head, int32_t n_heads,
                      int64_t n_tokens) override {
    if (window_start_[layer] != kUnselected) return;
    std::vector<float>& s = scores_[layer];
    s.assign(static_cast<size_t>(n_kv_heads_ * n_tokens), 0.f);
    const int32_t group = std::max(1, n_heads / n_kv_heads_);
    for (int32_t h = 0; h < n_heads; ++h) {
      float* out = s.data() + (h / group) * n_tokens;
      const float* in = per_head + static_cast<int64_t>(h) * n_tokens;
      for (int64_t t = 0; t < n_tokens; ++t) out[t] += in[t] / static_cast<float>(group);
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t limit = limits_.resolve(layer, phase, kv.n_tokens);
    if (limit < 0) return false;
    if (window_start_[layer] == kUnselected) return select(layer, kv, limit, plan);
    if (kv.n_tokens <= limit) return false;
    // FIFO: tokens older than the window's start were selected for good; of the rest (the
    // recent window and everything after), the newest fill what the budget leaves.
    plan.n_keep = limit;
    plan.slots.resize(static_cast<size_t>(n_kv_heads_ * limit));
    std::vector<int32_t> fifo;
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      const int32_t* pos = kv.positions + static_cast<int64_t>(g) * kv.capacity;
      int32_t* keep = plan.slots.data() + g * limit;
      int64_t n_kept = 0;
      fifo.clear();
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (pos[t] < window_start_[layer]) {
          keep[n_kept++] = static_cast<int32_t>(t);
        } else {
          fifo.push_back(static_cast<int32_t>(t));
        }
      }
      const int64_t room = limit - n_kept;  // >= 1: the selection left the window in it
      std::nth_element(fifo.begin(), fifo.end() - room, fifo.end(),
                       [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
      std::copy(fifo.end() - room, fifo.end(), keep + n_kept);
      std::sort(keep, keep + limit);
    }
    return true;
  }

  int64_t bytes_resident(int32_t layer) const override { return vector_bytes(scores_[layer]); }

 private:
  static constexpr int32_t kUnselected = INT32_MIN;

  // The one-time selection at the end of the context (a context never evicted before
  // ContextEnd holds its slots in position order): sinks, top-k of the middle, window.
  bool select(int32_t layer, const DenseKv& kv, int64_t limit, RetainPlan& plan) {
    const int64_t n = kv.n_tokens;
    std::vector<float> scores = std::move(scores_[layer]);
    scores_[layer] = std::vector<float>();
    // The newest token always stays, so sinks take at most limit - 1 and the window >= 1.
    const int64_t n_sink = std::min(sink_, std::max<int64_t>(0, limit - 1));
    const int64_t n_recent = std::max<int64_t>(1, std::min(recent_, limit - n_sink));
    const int64_t window_first = std::max<int64_t>(0, n - n_recent);
    window_start_[layer] = kv.positions[window_first];
    if (n <= limit) return false;
    if (static_cast<int64_t>(scores.size()) != n_kv_heads_ * n) {
      // No query looked at the context (cannot happen in a model forward): rank by position.
      scores.assign(static_cast<size_t>(n_kv_heads_ * n), 0.f);
      for (int32_t g = 0; g < n_kv_heads_; ++g) {
        for (int64_t t = 0; t < n; ++t) scores[g * n + t] = static_cast<float>(t) / n;
      }
    }
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      float* row = scores.data() + g * n;
      std::fill(row, row + n_sink, FLT_MAX);
      std::fill(row + window_first, row + n, FLT_MAX);
    }
    plan_top_k_per_head(scores.data(), n_kv_heads_, n, limit, plan);
    return true;
  }

  LayerLimits limits_;
  int64_t sink_, recent_;
  int32_t n_kv_heads_;
  std::vector<std::vector<float>> scores_;  // per layer until selected: [n_kv_heads, n_tokens]
  std::vector<int32_t> window_start_;       // per layer: first position of the FIFO window
};

}  // namespace

// Registered as `sage_kv` (methods/method_list.cpp).
MethodInfo sage_kv_method() {
  MethodInfo info;
  info.name = "sage_kv";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: one selection at the end of the shared context; afterwards each new token enters "
      "a FIFO recent window (the oldest window token leaves), no more scoring";
  info.summary =
      "per KV head, the sinks, the top-k middle tokens by the last prompt token's attention "
      "and a recent window that slides FIFO during decode";
  info.paper =
      "LLMs Know What to Drop: Self-Attention Guided KV Cache Eviction for Efficient "
      "Long-Context Inference (Wang et al., 2025), arXiv 2503.08879";
  info.choices = {
      "no public code: the paper's rule",
      "GQA: the group's query heads' attention (softmax over the context) is averaged per "
      "KV head, each KV head selects its own top-k; the paper does not say",
      "sink 4 (StreamingLLM's) and recent 64 are kvbench's choice; the paper gives no sizes. "
      "Both count in the budget (k = budget - sink - recent); scores are not pooled",
      "ratio is a fraction of the context, resolved at its end and held through decode",
  };
  const ParamInfo sink =
      int_param("sink", 4, 0, kMaxTokens, "the first `sink` tokens are always kept");
  const ParamInfo recent =
      int_param("recent", 64, 1, kMaxTokens,
                "recent window: the newest context tokens, then a FIFO of the newest tokens");
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(sink);
  info.params.push_back(recent);
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new SageKvPolicy(
        budget_from(params), params.get_int("sink"), params.get_int("recent"), shape));
  };
  return info;
}

}  // namespace kvbench
