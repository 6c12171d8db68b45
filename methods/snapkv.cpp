// SnapKV: at the end of the prompt, the last `window` queries vote for the prefix tokens
// they attend to; each KV head keeps its top tokens (after 1-D pooling, so neighbours of a
// hit come along) plus the window itself. Prefill-only: later tokens are appended whole.
//
// Where sources differ (docs/methods.md, "Where sources differ"):
// - window / pooling: the paper's LongBench configs use window 32, max-pool 7; its code
//   defaults to avg-pool 5; kvpress uses window 64, avg-pool 5; SCBench runs window 32,
//   avg-pool 5. The defaults here are SCBench's; all three are parameters.
// - window rows are summed, as the original (FasterDecoding/SnapKV SnapKVCluster); kvpress
//   takes the mean, which ranks the same.
// - GQA: the original repeats K/V per query head and compresses per query head; here the
//   cache stays per KV head and the group's query-head scores are averaged first, as
//   kvpress does (FasterDecoding/SnapKV issue 22) and KVCache-Factory's kv_head
//   granularity does before pooling.
// - the budget counts the window (the original's max_capacity_prompt); a ratio budget
//   below the window shrinks the window to the budget.
#include "methods/snapkv.h"

#include <algorithm>
#include <cfloat>
#include <string>

#include "common/input_error.h"

namespace kvbench {

SnapKvPolicy::SnapKvPolicy(const SnapKvConfig& config, int32_t n_layers, PrefixKeep prefix_keep,
                           std::shared_ptr<const HeadAllocation> allocation)
    : WindowedPolicy(config.budget, config.window, n_layers),
      config_(config),
      prefix_keep_(std::move(prefix_keep)),
      allocation_(std::move(allocation)) {}

std::unique_ptr<TokenPolicy> SnapKvPolicy::clone() const {
  return std::make_unique<SnapKvPolicy>(*this);
}

bool SnapKvPolicy::select(int32_t layer, const DenseKv& kv, const QueryWindow& held,
                          int64_t limit, RetainPlan& plan) {
  const int64_t n = kv.n_tokens;
  const int64_t window = std::min(config_.window, limit);
  const int64_t n_prefix = n - window;
  const int64_t keep_prefix = std::clamp<int64_t>(
      prefix_keep_ ? prefix_keep_(layer, n, limit, window) : limit - window, 0, n_prefix);
  if (keep_prefix == n_prefix) return false;

  // Per KV head, the mean over its query heads of the attention each prefix slot receives
  // from the window, pooled.
  std::vector<float> ranked =
      snapkv_ranking(held.kv_head_scores(kv), kv.n_kv_heads, n, window, config_);
  if (!allocation_) {
    rerank(layer, kv, window, held.n_rows(), std::vector<int64_t>(kv.n_kv_heads, keep_prefix),
           ranked);
    plan_top_k_per_head(ranked.data(), kv.n_kv_heads, n, keep_prefix + window, plan);
    return true;
  }
  std::vector<int64_t> keep =
      allocation_->head_counts(ranked.data(), n, kv.n_kv_heads, n_prefix, keep_prefix);
  rerank(layer, kv, window, held.n_rows(), keep, ranked);
  for (int64_t& k : keep) k += window;
  plan_top_k_ragged(ranked.data(), kv.n_kv_heads, n, keep, plan);
  return true;
}

std::vector<float> snapkv_ranking(const std::vector<float>& window_scores, int32_t n_kv_heads,
                                  int64_t n_tokens, int64_t window, const SnapKvConfig& config) {
  const int64_t n = n_tokens, n_prefix = n_tokens - window;
  // Pooled prefix scores, then the window ranked above any score so top-k keeps it.
  std::vector<float> ranked(static_cast<size_t>(n_kv_heads * n));
  for (int32_t g = 0; g < n_kv_heads; ++g) {
    pool1d_cpu(window_scores.data() + g * n, ranked.data() + g * n, 1, n_prefix, config.kernel,
               config.pool);
    std::fill(ranked.begin() + g * n + n_prefix, ranked.begin() + (g + 1) * n, FLT_MAX);
  }
  return ranked;
}

std::vector<ParamInfo> snapkv_params() {
  std::vector<ParamInfo> params = budget_params(kDefaultBudget);
  const ParamInfo window =
      int_param("window", 32, 1, kMaxTokens,
                "observation window: the last context queries that score the prefix; always kept");
  const ParamInfo kernel =
      int_param("kernel", 5, 1, 1001, "pooling width along tokens, odd (1: no pooling)");
  const ParamInfo pool =
      choice_param("pool", "avg", {"avg", "max"}, "pooling of the window's scores along tokens");
  params.push_back(window);
  params.push_back(kernel);
  params.push_back(pool);
  return params;
}

void check_snapkv_params(const MethodParams& params) {
  check_budget(params);
  check_window_in_budget(params);
  const int64_t kernel = params.get_int("kernel");
  if (kernel % 2 == 0) {
    throw InputError("kernel=" + std::to_string(kernel) +
                     " must be odd (the pooling window is centred on each token)");
  }
}

SnapKvConfig snapkv_config_from(const MethodParams& params) {
  SnapKvConfig config;
  config.budget = budget_from(params);
  config.window = params.get_int("window");
  config.kernel = static_cast<int32_t>(params.get_int("kernel"));
  config.pool = params.get("pool") == "max" ? PoolKind::Max : PoolKind::Avg;
  return config;
}

// Registered as `snapkv` (methods/method_list.cpp).
MethodInfo snapkv_method() {
  MethodInfo info;
  info.name = "snapkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "per KV head, the prefix tokens the last `window` context queries attend to most "
      "(pooled along tokens), plus the window";
  info.paper =
      "SnapKV: LLM Knows What You are Looking for Before Generation (Li et al., NeurIPS "
      "2024), arXiv 2404.14469";
  info.choices = {
      "GQA: the group's query-head scores are averaged per KV head before pooling, as "
      "kvpress does; the authors' code and SCBench select per query head over repeated "
      "KV, at n_heads / n_kv_heads times the memory",
      "defaults are SCBench's (window 32, avg-pool 5); the paper's LongBench runs "
      "max-pool 7, kvpress window 64",
  };
  info.params = snapkv_params();
  info.check = check_snapkv_params;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new SnapKvPolicy(snapkv_config_from(params), shape.n_layers));
  };
  info.make_allocated_policy = [](const MethodParams& params, const KvShape& shape,
                                  std::shared_ptr<const HeadAllocation> allocation) {
    return std::unique_ptr<TokenPolicy>(new SnapKvPolicy(snapkv_config_from(params),
                                                         shape.n_layers, {}, std::move(allocation)));
  };
  return info;
}

}  // namespace kvbench
