// AdaKV: the heads of a layer share its budget unevenly. Of the prefix tokens the layer may
// keep (budget - window per head, B), the n_kv_heads * B best across all its heads are
// picked together, and head h, having cnt_h of them, keeps cnt_h (1 - floor) + B floor of its
// best (at least a floor of B per head, AdaKV's safeguard) plus the window: a head whose
// attention is concentrated gives tokens to one whose attention is spread.
//
// Authors' settings (FFY0/AdaKV efe4e2e, adaptive_snapkv/monkeypatch/snapkv_utils.py,
// AdaptiveSnapKVCluster.update_kv_gqa; experiments/LongBench scripts):
// - scores: SnapKV's window scores, mean over the window, max-pool 7, window 32; with GQA the
//   mean over the group's query heads per KV head. Here the scores are those of the eviction
//   method composed behind (snapkv or pyramidkv, with their own parameters);
// - floor_alpha 0.2 in the scripts (config_compress defaults to 0.5): floor=0.2;
// - base B = budget - window; global top-(H B) of the sorted scores; cnt_h per head;
//   budget_h = round(cnt_h (1 - alpha) + int(B alpha)); normalize off (the scripts' None);
// - layers below `skip` (0) stay uniform; pyramid mode sets B per layer first (pyramidkv
//   behind adakv does that here).
// kvpress's AdaKVPress masks the pruned entries instead of removing them (no memory saved);
// here each head really holds its own count (DenseLayerKv's heads of their own).
#include <algorithm>
#include <memory>
#include <vector>

#include "cache/allocation.h"
#include "cache/registry.h"

namespace kvbench {
namespace {

class AdaKvAllocation : public HeadAllocation {
 public:
  explicit AdaKvAllocation(double floor) : floor_(floor) {}

  std::vector<int64_t> head_counts(const float* scores, int64_t stride, int32_t n_kv_heads,
                                   int64_t n_tokens, int64_t keep) const override {
    const int64_t total = std::min<int64_t>(n_kv_heads * keep, n_kv_heads * n_tokens);
    // The layer's total-th largest score: every score above it is picked, and of those equal
    // to it the first in head order, then token order.
    std::vector<float> all;
    all.reserve(static_cast<size_t>(n_kv_heads * n_tokens));
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      all.insert(all.end(), scores + h * stride, scores + h * stride + n_tokens);
    }
    std::vector<int64_t> picked(static_cast<size_t>(n_kv_heads), 0);
    if (total > 0) {
      std::vector<float> sorted = all;
      std::nth_element(sorted.begin(), sorted.begin() + (total - 1), sorted.end(),
                       std::greater<float>());
      const float threshold = sorted[total - 1];
      int64_t above = 0;
      for (const float s : all) above += s > threshold;
      int64_t ties = total - above;
      for (int32_t h = 0; h < n_kv_heads; ++h) {
        for (int64_t t = 0; t < n_tokens; ++t) {
          const float s = scores[h * stride + t];
          if (s > threshold || (s == threshold && ties-- > 0)) ++picked[h];
        }
      }
    }
    const double floor_tokens = static_cast<double>(static_cast<int64_t>(keep * floor_));
    std::vector<double> targets(static_cast<size_t>(n_kv_heads));
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      targets[h] = std::min<double>(n_tokens, picked[h] * (1 - floor_) + floor_tokens);
    }
    return round_counts(targets);
  }

 private:
  double floor_;
};

}  // namespace

// Registered as `adakv` (methods/method_list.cpp).
MethodInfo adakv_method() {
  MethodInfo info;
  info.name = "adakv";
  info.kind = MethodKind::Allocation;
  info.stage = "2: the eviction method's, splitting each layer's budget over its KV heads";
  info.summary =
      "a layer's budget shared unevenly by its KV heads: the best tokens of all heads picked "
      "together, each head keeping at least `floor` of an even share";
  info.paper =
      "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM "
      "Inference (Feng et al.), arXiv 2407.11550";
  info.choices = {
      "scores are those of the eviction method behind it (snapkv, pyramidkv) with its own "
      "parameters; the authors' scripts run SnapKV's with max-pool 7 and window 32",
      "the heads' counts are rounded by largest remainder so a layer holds at most its budget; "
      "the authors round each head's (torch.round), up to n_kv_heads / 2 tokens over",
      "each head really holds its own count (kvpress's AdaKVPress masks the pruned tokens and "
      "keeps their memory), on the CPU or the GPU, in the fp32 store or behind a storage "
      "method that holds heads apart (fp16, bf16, fp8, kivi)",
      "the split is the authors' (window kept in every head, cnt_h (1 - floor) + B floor of "
      "the prefix); kvpress's AdaKVPress guarantees each head its own top alpha n_kept first "
      "and takes the global top of the rest, window included, so its per-head counts differ",
      "adakv+pyramidkv sets each layer's B by PyramidKV's rule first, KVCache-Factory's: a "
      "context under 2 x (budget - window) gives every layer the same B. AdaKV's own pyramid "
      "mode has no such rule, and its per-layer budgets are its own formula; kvbench follows "
      "KVCache-Factory's for both",
  };
  info.params = {float_param("floor", "0.2", 0, 1,
                             "share of an even split every head keeps whatever its scores "
                             "(the authors' floor_alpha)")};
  info.make_allocation = [](const MethodParams& params) {
    return std::shared_ptr<const HeadAllocation>(
        std::make_shared<AdaKvAllocation>(params.get_float("floor")));
  };
  return info;
}

}  // namespace kvbench
