// SnapKV's selection, shared with PyramidKV (methods/pyramidkv.cpp), which changes only how
// many prefix tokens each layer keeps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cache/allocation.h"
#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/policy.h"
#include "cache/query_window.h"
#include "cache/registry.h"
#include "cache/windowed_policy.h"
#include "kernels/cpu/scores.h"

namespace kvbench {

struct SnapKvConfig {
  Budget budget;        // tokens kept per layer and KV head, window included
  int64_t window = 32;  // observation window: the last prompt queries, always kept
  int32_t kernel = 5;   // pooling width along tokens (odd)
  PoolKind pool = PoolKind::Avg;
};

// Prefix tokens (all but the window) layer `layer` keeps of a context of n_context tokens,
// for a resolved budget and window (window <= budget < n_context). SnapKV: budget - window.
using PrefixKeep =
    std::function<int64_t(int32_t layer, int64_t n_context, int64_t budget, int64_t window)>;

// Scores the prefix by the softmax attention the last `window` context queries give it
// (causal inside the window), the GQA group's query heads averaged per KV head, pooled
// along tokens; keeps the top prefix_keep tokens per KV head plus the window. Compresses
// once, at ContextEnd; tokens after the context are appended uncompressed.
class SnapKvPolicy : public WindowedPolicy {
 public:
  // prefix_keep empty: SnapKV's budget - window in every layer. allocation (AdaKV): the
  // layer's prefix keep, n_kv_heads times over, split unevenly over its KV heads (each keeps
  // the window besides); nullptr: every head keeps the same count.
  SnapKvPolicy(const SnapKvConfig& config, int32_t n_layers, PrefixKeep prefix_keep = {},
               std::shared_ptr<const HeadAllocation> allocation = nullptr);

  std::unique_ptr<TokenPolicy> clone() const override;

 protected:
  bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override;
  // Turns SnapKV's ranking of a layer's n_tokens slots ([n_kv_heads, n_tokens], snapkv_ranking:
  // the last `window` at FLT_MAX) into the one KV head h keeps its top prefix_keep[h] prefix
  // tokens and the window by. SnapKV keeps it as is; CriticalKV (methods/criticalkv.cpp)
  // reweights it by the values. The scores are sums over the window's `window_rows` query
  // rows (which rank as their mean would).
  virtual void rerank(int32_t /*layer*/, const DenseKv& /*kv*/, int64_t /*window*/,
                      int64_t /*window_rows*/, const std::vector<int64_t>& /*prefix_keep*/,
                      std::vector<float>& /*ranked*/) const {}

 private:
  SnapKvConfig config_;
  PrefixKeep prefix_keep_;
  std::shared_ptr<const HeadAllocation> allocation_;
};

// SnapKV's ranking of a context's n_tokens slots (in position order, the last `window`
// the window's own): each KV head's window scores (QueryWindow::kv_head_scores) of the
// prefix pooled along tokens, the window ranked above any score, [n_kv_heads, n_tokens];
// plan_top_k_per_head over it keeps the top prefix tokens plus the window. CaM
// (methods/cam.cpp) selects with it too.
std::vector<float> snapkv_ranking(const std::vector<float>& window_scores, int32_t n_kv_heads,
                                  int64_t n_tokens, int64_t window, const SnapKvConfig& config);

// Parameters SnapKV and PyramidKV share (budget, ratio, window, kernel, pool), their
// cross-checks (budget xor ratio, budget >= window, odd kernel) and reading them back.
std::vector<ParamInfo> snapkv_params();
void check_snapkv_params(const MethodParams& params);
SnapKvConfig snapkv_config_from(const MethodParams& params);

}  // namespace kvbench
