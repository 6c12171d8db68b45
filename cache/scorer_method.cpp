#include "cache/scorer_method.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <utility>

#include "cache/allocation.h"
#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/windowed_policy.h"
#include "common/input_error.h"

namespace kvbench {
namespace {

class ScorerPolicy : public WindowedPolicy {
 public:
  ScorerPolicy(std::shared_ptr<const ScorerMethod> method, const MethodParams& params,
               const KvShape& shape, std::shared_ptr<const HeadAllocation> allocation)
      : WindowedPolicy(budget_from(params), params.get_int("window"), shape.n_layers),
        method_(std::move(method)),
        params_(params),
        allocation_(std::move(allocation)),
        sinks_(params.get_int("sink")),
        n_layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ScorerPolicy>(*this);
  }

  // With a window, as SnapKV: nothing more to observe or plan once the layer is compressed.
  // Without one, as the built-in knorm: plan() still sees each later phase (and declines).
  bool done(int32_t layer) const override { return window() > 0 && closed(layer); }

 protected:
  bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    ScorerInput input;
    input.layer = layer;
    input.n_layers = n_layers_;
    input.kv = &kv;
    input.params = &params_;
    input.window_queries = held.query();
    std::vector<float> attention;
    if (method_->window_attention) {
      attention = held.kv_head_scores(kv);
      input.window_attention = attention.data();
    }
    std::vector<float> scores(static_cast<size_t>(kv.n_kv_heads) * n, 0.f);
    if (!method_->score(input, scores.data())) return false;

    // NaN ranks last; the sinks and the window rank above any score.
    for (float& s : scores) {
      if (std::isnan(s)) s = -FLT_MAX;
    }
    const int64_t window = std::min(this->window(), limit);
    const int64_t sinks = std::min(sinks_, limit - window);
    if (window + sinks > 0) {
      for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
        const std::vector<int32_t> order = slots_by_position(kv, h, sinks, window);
        float* row = scores.data() + h * n;
        for (int64_t i = 0; i < sinks; ++i) row[order[i]] = FLT_MAX;
        for (int64_t i = n - window; i < n; ++i) row[order[i]] = FLT_MAX;
      }
    }
    if (!allocation_) {
      plan_top_k_per_head(scores.data(), kv.n_kv_heads, n, limit, plan);
    } else {
      const std::vector<int64_t> counts =
          allocation_->head_counts(scores.data(), n, kv.n_kv_heads, n, limit);
      plan_top_k_ragged(scores.data(), kv.n_kv_heads, n, counts, plan);
    }
    return true;
  }

 private:
  std::shared_ptr<const ScorerMethod> method_;
  MethodParams params_;
  std::shared_ptr<const HeadAllocation> allocation_;
  int64_t sinks_;
  int32_t n_layers_;
};

}  // namespace

MethodInfo scorer_method(ScorerMethod method) {
  if (!method.score) throw InputError("method '" + method.name + "' has no score function");
  MethodInfo info;
  info.name = method.name;
  info.kind = MethodKind::Eviction;
  info.stage = "2: at the end of the shared context (scored per KV head)";
  info.summary = method.summary;
  info.paper = method.paper;
  info.choices = method.choices;
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("window", method.window, 0, kMaxTokens,
                                  "the last context queries handed to the scorer; their own "
                                  "tokens are always kept"));
  info.params.push_back(int_param("sink", 0, 0, kMaxTokens,
                                  "the first tokens of the context (attention sinks), always "
                                  "kept; 0 by default, as kvpress's ScorerPress"));
  for (const ParamInfo& p : method.params) info.params.push_back(p);
  // The budget checked as the built-ins check it (budget and ratio not both, the window
  // inside the budget), then the method's own parameters.
  info.check = [check = method.check](const MethodParams& params) {
    check_budget(params);
    check_window_in_budget(params);
    if (check) check(params);
  };
  auto shared = std::make_shared<const ScorerMethod>(std::move(method));
  info.make_policy = [shared](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new ScorerPolicy(shared, params, shape, nullptr));
  };
  info.make_allocated_policy = [shared](const MethodParams& params, const KvShape& shape,
                                        std::shared_ptr<const HeadAllocation> allocation) {
    return std::unique_ptr<TokenPolicy>(
        new ScorerPolicy(shared, params, shape, std::move(allocation)));
  };
  return info;
}

}  // namespace kvbench
