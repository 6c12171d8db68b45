// CriticalKV: a token matters by how much dropping it perturbs the attention output, which
// its attention weight alone does not tell: the value it brings in, through the output
// projection, counts too. On SnapKV's selection (methods/snapkv.h): of the prefix tokens a KV
// head keeps (B), the best first_stage_ratio * B by SnapKV's score are kept outright; the
// rest are the best by (score + epsilon) * ||W_o v||, score the window rows' mean attention
// (as the authors'; epsilon is on that scale), where ||W_o v|| is the norm of the
// token's value projected by the output projection columns of the head's query heads (their
// mean per KV head). With an allocation in front (`adakv+criticalkv`) each head's B is its
// own, set from the plain scores; both stages then run per head on its B (CriticalAdaKV).
//
// Authors' settings (arXiv 2502.03805; kvpress presses/criticalkv_press.py CriticalKVPress and
// CriticalAdaKVPress, which the authors contributed; FFY0/CriticalKV could not be fetched):
// - epsilon 1e-4, first_stage_ratio 0.5; stage 1 keeps int(B * first_stage_ratio) per head;
// - the base score is any attention score (kvpress wraps a ScorerPress; the paper's runs
//   use SnapKV's, window 32, max-pool 7); here SnapKV's with its parameters;
// - ||W_o v||: kvpress takes the L1 norm over the hidden dimension; with GQA, per query head
//   and then the mean over the group per KV head.
// Here (list methods' choices): the L2 norm, sqrt(v^T G_h v) from KvShape::value_out_gram
// (G_h = W_o_h^T W_o_h, head_dim^2 per query head), which needs head_dim^2 work per token
// and head, not head_dim * hidden, and no copy of W_o; stage 1's share is of the prefix
// budget (the window is kept besides, as SnapKV keeps it), where kvpress's share counts
// the window among the kept.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "methods/snapkv.h"

namespace kvbench {
namespace {

struct CriticalKvConfig {
  double epsilon = 1e-4;
  double first_stage_ratio = 0.5;
  int32_t n_heads = 0;  // query heads
  std::shared_ptr<const std::vector<float>> gram;  // KvShape::value_out_gram
};

class CriticalKvPolicy : public SnapKvPolicy {
 public:
  CriticalKvPolicy(const SnapKvConfig& snapkv, int32_t n_layers, CriticalKvConfig config,
                   std::shared_ptr<const HeadAllocation> allocation)
      : SnapKvPolicy(snapkv, n_layers, {}, std::move(allocation)), config_(std::move(config)) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<CriticalKvPolicy>(*this);
  }

 protected:
  void rerank(int32_t layer, const DenseKv& kv, int64_t window, int64_t window_rows,
              const std::vector<int64_t>& prefix_keep, std::vector<float>& ranked) const override {
    const int64_t n = kv.n_tokens, n_prefix = n - window, d = kv.head_dim;
    const int32_t group = config_.n_heads / kv.n_kv_heads;
    std::vector<float> norm(static_cast<size_t>(n_prefix));
    std::vector<float> gv(static_cast<size_t>(d));
    std::vector<int64_t> order(static_cast<size_t>(n_prefix));
    for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
      float* score = ranked.data() + g * n;
      // ||W_o_h v_t|| for each of the group's query heads h, their mean.
      std::fill(norm.begin(), norm.end(), 0.f);
      for (int32_t h = g * group; h < (g + 1) * group; ++h) {
        const float* gram = config_.gram->data() + ((int64_t{layer} * config_.n_heads + h) * d) * d;
        for (int64_t t = 0; t < n_prefix; ++t) {
          const float* v = kv.v + (g * kv.capacity + t) * d;
          double sq = 0;
          for (int64_t i = 0; i < d; ++i) {
            float row = 0;
            for (int64_t j = 0; j < d; ++j) row += gram[i * d + j] * v[j];
            sq += double{v[i]} * row;
          }
          norm[t] += static_cast<float>(std::sqrt(std::max(0.0, sq)) / group);
        }
      }
      // Stage 1: the head's first int(B * first_stage_ratio) by the plain score (ties: the
      // older token), kept whatever their values.
      const int64_t first = std::min<int64_t>(
          n_prefix, static_cast<int64_t>(prefix_keep[g] * config_.first_stage_ratio));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + first, order.end(),
                        [score](int64_t a, int64_t b) {
                          return score[a] > score[b] || (score[a] == score[b] && a < b);
                        });
      // Stage 2: the rest by the score weighted by the value's projected norm. The score is
      // the window rows' mean attention, as the authors' (kvpress's SnapKV scores are a mean
      // over the window's rows): with the sum, epsilon would weigh window_rows times less.
      const double per_row = 1.0 / static_cast<double>(std::max<int64_t>(window_rows, 1));
      for (int64_t t = 0; t < n_prefix; ++t) {
        score[t] = static_cast<float>((score[t] * per_row + config_.epsilon) * norm[t]);
      }
      for (int64_t i = 0; i < first; ++i) score[order[i]] = FLT_MAX;
    }
  }

 private:
  CriticalKvConfig config_;
};

std::unique_ptr<TokenPolicy> make_criticalkv(const MethodParams& params, const KvShape& shape,
                                             std::shared_ptr<const HeadAllocation> allocation) {
  if (!shape.value_out_gram || shape.value_out_gram->empty()) {
    throw InputError(
        "criticalkv weighs tokens by ||W_o v||, which needs the model's output projection; "
        "this cache's shape carries none (KvShape::value_out_gram, which a model loaded by "
        "kvbench fills)");
  }
  const int64_t expected =
      int64_t{shape.n_layers} * shape.n_heads * shape.head_dim * shape.head_dim;
  if (shape.n_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 ||
      static_cast<int64_t>(shape.value_out_gram->size()) != expected) {
    throw InputError("criticalkv: the model's value_out_gram holds " +
                     std::to_string(shape.value_out_gram->size()) + " floats for " +
                     std::to_string(shape.n_heads) + " query heads over " +
                     std::to_string(shape.n_kv_heads) + " KV heads; expected n_layers x " +
                     "n_heads x head_dim^2 = " + std::to_string(expected));
  }
  CriticalKvConfig config;
  config.epsilon = params.get_float("epsilon");
  config.first_stage_ratio = params.get_float("first_stage_ratio");
  config.n_heads = shape.n_heads;
  config.gram = shape.value_out_gram;
  return std::make_unique<CriticalKvPolicy>(snapkv_config_from(params), shape.n_layers,
                                            std::move(config), std::move(allocation));
}

}  // namespace

// Registered as `criticalkv` (methods/method_list.cpp).
MethodInfo criticalkv_method() {
  MethodInfo info;
  info.name = "criticalkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "SnapKV's selection in two stages: per KV head the best first_stage_ratio of its budget "
      "by the window's attention, the rest by that attention times the value's norm through "
      "the output projection ||W_o v||, plus the window";
  info.paper =
      "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective "
      "(Feng et al.), arXiv 2502.03805";
  info.choices = {
      "||W_o v|| is the L2 norm, sqrt(v^T W_o_h^T W_o_h v) from a head_dim x head_dim Gram per "
      "query head computed at model load; the authors (kvpress's CriticalKVPress) take the L1 "
      "norm, which needs W_o itself and head_dim x hidden work per token and head",
      "GQA: the norm per query head, then the mean over the group per KV head, as kvpress; the "
      "attention scores are SnapKV's (group mean per KV head, window 32, avg-pool 5 by "
      "default; the paper's runs max-pool 7)",
      "stage 1 takes int(first_stage_ratio x the prefix budget) per head, the window kept "
      "besides as SnapKV keeps it; kvpress's share counts the window among the kept tokens",
      "adakv+criticalkv (CriticalAdaKV): each head's budget from AdaKV on the plain scores, "
      "then both stages per head on its own budget, stored ragged (kvpress masks instead)",
  };
  info.params = snapkv_params();
  info.params.push_back(float_param("epsilon", "1e-4", 0, 1,
                                    "added to the attention score before it is weighted by "
                                    "||W_o v|| (the authors' epsilon)"));
  info.params.push_back(float_param("first_stage_ratio", "0.5", 0, 1,
                                    "share of each head's prefix budget kept by attention "
                                    "alone before the value-weighted stage"));
  info.check = check_snapkv_params;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return make_criticalkv(params, shape, nullptr);
  };
  info.make_allocated_policy = [](const MethodParams& params, const KvShape& shape,
                                  std::shared_ptr<const HeadAllocation> allocation) {
    return make_criticalkv(params, shape, std::move(allocation));
  };
  return info;
}

}  // namespace kvbench
