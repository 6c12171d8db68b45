// SimLayerKV: a layer-level decision. At the end of the shared context each layer measures
// how much of its last query's attention (mean over query heads) falls on the first `sink`
// tokens plus the newest budget - sink. Above `threshold` the layer is "lazy" and becomes
// StreamingLLM: it keeps exactly those tokens. Otherwise it keeps the whole context. Later
// tokens are appended uncompressed.
//
// So `budget` is the size of a lazy layer's cache (sinks + recent window), not the average
// over layers: non-lazy layers keep everything, and the average lies between the budget
// and the context, depending on how many layers the test finds lazy. That is the method:
// the threshold, not the budget, sets how much is saved.
//
// Authors' settings (sail-sg/SimLayerKV 1fb6bda, LongBench/SimLayerKV_attention_llama.py
// ori_forward and SimLayerKV_llama.py LlamaModel.forward; arXiv 2410.13846):
// - "SimLayerKV-decode": at the first decode step the new token's attention row, averaged
//   over the query heads, summed over positions [0, 4) and the last 1024 (the new token
//   included). Lazy if above the threshold; the layer's cache is cut to those 4 + 1024
//   tokens once, and later tokens are appended.
// - threshold per model (LongBench/pred.py): Llama-3 0.9, Llama-2 0.65, Mistral 0.8,
//   Qwen 0.85; 0 makes every layer lazy (their StreamingLLM baseline).
// kvpress (SimLayerKVPress, 8bb29b9) decides at prefill from the last n_last = 1 prompt
// queries (mean over heads and rows), n_initial 4, n_recent 1024; lazy_threshold 1 turns it
// off. kvbench follows kvpress's timing: the decision is made on the shared context's last
// query, before any question is seen.
#include <algorithm>
#include <string>

#include "cache/registry.h"
#include "cache/windowed_policy.h"
#include "common/input_error.h"

namespace kvbench {
namespace {

// The window here is the context's last n_last queries, whose attention decides whether a
// layer is lazy.
class SimLayerKvPolicy : public WindowedPolicy {
 public:
  SimLayerKvPolicy(const Budget& budget, int64_t sink, int64_t n_last, double threshold,
                   int32_t n_layers)
      : WindowedPolicy(budget, n_last, n_layers), sink_(sink), threshold_(threshold) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<SimLayerKvPolicy>(*this);
  }

 protected:
  bool select(int32_t /*layer*/, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    if (held.n_rows() == 0) return false;
    // A ratio can resolve to a limit at or below `sink`: the newest token still stays.
    const int64_t n_sink = std::min(sink_, limit - 1);
    const int64_t n_recent = limit - n_sink;
    const std::vector<int32_t> order = slots_by_position(kv, 0, n_sink, n_recent);
    std::vector<int32_t> keep(order.begin(), order.begin() + n_sink);
    keep.insert(keep.end(), order.end() - n_recent, order.end());

    // Attention mass on the tokens a lazy layer would keep, averaged over query heads and
    // rows: kv_head_scores sums the rows and averages each GQA group, the groups being of
    // equal size.
    const std::vector<float> scores = held.kv_head_scores(kv);
    double mass = 0;
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      for (int32_t slot : keep) mass += scores[static_cast<size_t>(h) * n + slot];
    }
    mass /= static_cast<double>(kv.n_kv_heads) * static_cast<double>(held.n_rows());
    const bool lazy = threshold_ < 1 && mass > threshold_;
    if (!lazy) return false;
    std::sort(keep.begin(), keep.end());
    plan_same_slots(keep, kv.n_kv_heads, plan);
    return true;
  }

 private:
  int64_t sink_;
  double threshold_;
};

}  // namespace

// Registered as `simlayerkv` (methods/method_list.cpp).
MethodInfo simlayerkv_method() {
  MethodInfo info;
  info.name = "simlayerkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "lazy layers (the last query puts more than `threshold` of its attention on the sinks "
      "and the recent window) keep `sink` + recent = budget tokens; the others keep all";
  info.paper =
      "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction (Zhang et al., "
      "2024), arXiv 2410.13846";
  info.choices = {
      "budget = a lazy layer's tokens (sink + recent window), both the kept set and the "
      "window the lazy test sums over, as the authors' 4 + 1024; ratio resolves it from the "
      "context; the average over layers is above the budget (non-lazy layers keep all)",
      "decided at the end of the shared context from its last n_last queries (kvpress's "
      "timing); the authors decide at the first decode step, on the question's first "
      "generated token",
      "threshold default 0.85, the authors' value for Qwen (Llama-3 0.9, Llama-2 0.65, "
      "Mistral 0.8); threshold=1 turns the method off as kvpress's lazy_threshold does",
      "positions: kept tokens keep their original positions (RoPE is in the stored keys)",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("sink", 4, 0, kMaxTokens,
                                  "initial tokens a lazy layer keeps; part of the budget"));
  info.params.push_back(int_param("n_last", 1, 1, kMaxTokens,
                                  "last context queries whose attention tests laziness"));
  info.params.push_back(float_param("threshold", "0.85", 0, 1,
                                    "a layer is lazy above this attention mass on sink + "
                                    "recent (0: every layer; 1: none)"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    const Budget budget = budget_from(params);
    const int64_t sink = params.get_int("sink");
    if (!budget.is_ratio() && sink >= budget.tokens) {
      throw InputError("simlayerkv: sink=" + std::to_string(sink) +
                       " must be smaller than budget=" + std::to_string(budget.tokens) +
                       " (the budget counts the sinks and the recent window)");
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new SimLayerKvPolicy(
        budget_from(params), params.get_int("sink"), params.get_int("n_last"),
        params.get_float("threshold"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
