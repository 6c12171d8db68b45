// CAOTE: evict by the error the eviction makes on the attention output. With a_j the
// attention token j receives and o = sum_i a_i v_i the output, dropping j alone (and
// renormalising the rest) moves the output by a_j / (1 - a_j) * ||o - v_j||: that is j's
// score, and each KV head keeps its top tokens. CAOTE is a meta-score over a base method's
// attention; the base here is SnapKV's: a_j is the softmax attention the last `window`
// context queries give j, averaged over the window's rows and the GQA group (a
// distribution over the context), o its output per KV head, and the window is kept.
// Applied once to the shared context at ContextEnd; later tokens are appended whole.
//
// Authors' settings (CAOTE, arXiv 2504.14051; no public code, METHODS-FACTS "CAOTE"):
// - score c_j = a_j / (1 - a_j) * ||o - v_j||_2, evict the lowest; the paper pairs it with
//   H2O, TOVA and SnapKV and evicts one token at a time under block-wise prefill.
// Here: the base is SnapKV's window (32, the harness's snapkv default) without pooling
// (pooling would blur a_j, which the output formula needs as weights); one top-k over the
// individual scores at ContextEnd instead of a greedy one-at-a-time eviction.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "cache/registry.h"
#include "cache/windowed_policy.h"

namespace kvbench {
namespace {

class CaotePolicy : public WindowedPolicy {
 public:
  CaotePolicy(const Budget& budget, int64_t window, int32_t n_layers)
      : WindowedPolicy(budget, window, n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<CaotePolicy>(*this);
  }

 protected:
  bool select(int32_t /*layer*/, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    const int64_t window = std::min(this->window(), limit);
    std::vector<float> scores = held.kv_head_scores(kv);  // summed over the window's rows
    const double rows = static_cast<double>(std::max<int64_t>(held.n_rows(), 1));
    const int32_t d = kv.head_dim;
    std::vector<double> out(static_cast<size_t>(d));
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      float* a = scores.data() + h * n;
      const float* v = kv.v + h * kv.capacity * d;
      std::fill(out.begin(), out.end(), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        for (int32_t c = 0; c < d; ++c) out[c] += a[t] / rows * v[t * d + c];
      }
      for (int64_t t = 0; t < n - window; ++t) {
        const double weight = a[t] / rows;
        double dist = 0;
        for (int32_t c = 0; c < d; ++c) dist += (out[c] - v[t * d + c]) * (out[c] - v[t * d + c]);
        // weight -> 1 (all attention on one token): its eviction error is unbounded.
        a[t] =
            weight >= 1.0 ? FLT_MAX : static_cast<float>(weight / (1.0 - weight) * std::sqrt(dist));
      }
      std::fill(a + n - window, a + n, FLT_MAX);
    }
    plan_top_k_per_head(scores.data(), kv.n_kv_heads, n, limit, plan);
    return true;
  }
};

}  // namespace

// Registered as `caote` (methods/method_list.cpp).
MethodInfo caote_method() {
  MethodInfo info;
  info.name = "caote";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "per KV head, the prefix tokens whose eviction would move the attention output most: "
      "a/(1-a) * ||o - v|| over the last `window` context queries' attention, plus the window";
  info.paper =
      "CAOTE: KV Caching through Attention Output Error based Token Eviction (Qualcomm AI "
      "Research, "
      "2025), arXiv 2504.14051";
  info.choices = {
      "the attention is SnapKV's (the last `window` (32) context queries, rows and GQA group "
      "averaged), one of the bases the paper pairs CAOTE with; no pooling",
      "one top-k over each token's own error at the end of the context; the paper evicts "
      "greedily, one token at a time, under block-wise prefill (no public code)",
  };
  const ParamInfo window = int_param(
      "window", 32, 1, kMaxTokens,
      "observation window: the last context queries whose attention is scored; always kept");
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(window);
  info.check = [](const MethodParams& params) {
    check_budget(params);
    check_window_in_budget(params);
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new CaotePolicy(budget_from(params), params.get_int("window"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
