// LagKV: attention-free. The context after the first `sink` tokens is cut into partitions
// of `lag` tokens; each partition is scored against the next one (its "lag" reference):
// every channel of a key is min-max normalised by the reference partition's range of that
// channel, and the token's score is the standard deviation of its normalised channels,
// softmaxed over the partition; keys and values alike, their mean. Within each partition
// the tokens are ranked by it (rank / lag), so every partition keeps its share; the sinks
// and the last partition with the remainder (which has no reference) score 1, above any
// rank. Applied once to the shared context at ContextEnd; later tokens are appended whole.
//
// Authors' settings (kvpress presses/lagkv_press.py LagKVPress, 8bb29b9; arXiv 2504.04704):
// - n_sink 4, lag_size 128, cross_scoring False (ranks per partition, not raw scores).
// - std is torch's default, unbiased (divides by head_dim - 1); stored keys are post-RoPE.
// - a context shorter than n_sink + 2 lag_size has no reference partition: the sinks score
//   1 and the rest a ramp by position, so the sinks and the newest tokens are kept.
// - keep int(T * (1 - ratio)) per KV head by top-k; kvpress compresses at prefill only.
// Here: a channel whose reference range is 0 (kvpress divides by 0 and gets NaN)
// contributes 0; ties in the rank go to the older token (torch argsort is not stable).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"

namespace kvbench {
namespace {

// The softmaxed normalised-channel std of `lag` rows x[0..lag) (stride d) against the
// reference rows ref[0..lag), added times 0.5 into out[0..lag).
void add_lag_scores(const float* x, const float* ref, int64_t lag, int32_t d, float* out) {
  std::vector<float> lo(ref, ref + d), hi(ref, ref + d);
  for (int64_t t = 1; t < lag; ++t) {
    for (int32_t c = 0; c < d; ++c) {
      lo[c] = std::min(lo[c], ref[t * d + c]);
      hi[c] = std::max(hi[c], ref[t * d + c]);
    }
  }
  std::vector<double> std_dev(static_cast<size_t>(lag));
  std::vector<double> z(static_cast<size_t>(d));
  for (int64_t t = 0; t < lag; ++t) {
    double mean = 0;
    for (int32_t c = 0; c < d; ++c) {
      const double range = static_cast<double>(hi[c]) - lo[c];
      z[c] = range > 0 ? (static_cast<double>(x[t * d + c]) - lo[c]) / range : 0.0;
      mean += z[c];
    }
    mean /= d;
    double var = 0;
    for (int32_t c = 0; c < d; ++c) var += (z[c] - mean) * (z[c] - mean);
    std_dev[t] = d > 1 ? std::sqrt(var / (d - 1)) : 0.0;
  }
  const double top = *std::max_element(std_dev.begin(), std_dev.end());
  double sum = 0;
  for (double& s : std_dev) sum += (s = std::exp(s - top));
  for (int64_t t = 0; t < lag; ++t) out[t] += static_cast<float>(0.5 * std_dev[t] / sum);
}

class LagKvPolicy : public TokenPolicy {
 public:
  LagKvPolicy(const Budget& budget, int64_t sink, int64_t lag, int32_t n_layers)
      : limits_(budget, n_layers), sink_(sink), lag_(lag) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<LagKvPolicy>(*this);
  }

  // A context never evicted before ContextEnd holds its slots in position order.
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd) return false;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    std::vector<float> scores(static_cast<size_t>(kv.n_kv_heads) * n);
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) score_head(kv, h, scores.data() + h * n);
    plan_top_k_per_head(scores.data(), kv.n_kv_heads, n, limit, plan);
    return true;
  }

 private:
  void score_head(const DenseKv& kv, int32_t head, float* score) const {
    const int64_t n = kv.n_tokens;
    const int32_t d = kv.head_dim;
    std::fill(score, score + n, 1.f);
    const int64_t sink = std::min(sink_, n);
    if (n < sink_ + 2 * lag_) {  // no reference partition: the sinks, then by recency
      for (int64_t t = sink; t < n; ++t) {
        score[t] = static_cast<float>(t - sink) / static_cast<float>(n - sink);
      }
      return;
    }
    const int64_t n_parts = (n - sink_) / lag_;  // whole partitions; the last is the tail's
    const float* k = kv.k + head * kv.capacity * d;
    const float* v = kv.v + head * kv.capacity * d;
    std::vector<float> part(static_cast<size_t>(lag_));
    std::vector<int64_t> order(static_cast<size_t>(lag_));
    for (int64_t p = 0; p + 1 < n_parts; ++p) {
      const int64_t first = sink_ + p * lag_, ref = first + lag_;
      std::fill(part.begin(), part.end(), 0.f);
      add_lag_scores(k + first * d, k + ref * d, lag_, d, part.data());
      add_lag_scores(v + first * d, v + ref * d, lag_, d, part.data());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return part[a] < part[b]; });
      // Rank r in [0, lag) becomes r / lag: the partition's best token ranks highest.
      for (int64_t r = 0; r < lag_; ++r) {
        score[first + order[r]] = static_cast<float>(r) / static_cast<float>(lag_);
      }
    }
  }

  LayerLimits limits_;
  int64_t sink_;
  int64_t lag_;
};

}  // namespace

// Registered as `lagkv` (methods/method_list.cpp).
MethodInfo lagkv_method() {
  MethodInfo info;
  info.name = "lagkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "per KV head, each `lag`-token partition ranked by the spread of its keys and values "
      "normalised by the next partition's range (attention-free); sinks and the last "
      "partition kept";
  info.paper =
      "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important "
      "(2025), arXiv 2504.04704";
  info.choices = {
      "defaults are kvpress LagKVPress's: sink 4, lag 128, ranks within each partition "
      "(cross_scoring off; the raw-score mode is not done)",
      "a context shorter than sink + 2 lag keeps the sinks and the newest tokens, as kvpress",
      "a channel whose reference range is 0 counts 0 (kvpress divides by 0); rank ties go "
      "to the older token",
      "a budget under the sinks plus the last partition (sink + lag + the remainder, all "
      "scored 1) is filled by the tie rule alone: the oldest here, torch.topk's order in "
      "kvpress (at budget 64 the two keep other tokens from layer 0)",
  };
  const ParamInfo sink =
      int_param("sink", 4, 0, kMaxTokens, "the first `sink` tokens are always kept");
  const ParamInfo lag =
      int_param("lag", 128, 2, kMaxTokens,
                "partition size: each partition is scored against the next one's key/value ranges");
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(sink);
  info.params.push_back(lag);
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new LagKvPolicy(budget_from(params), params.get_int("sink"),
                                                        params.get_int("lag"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
