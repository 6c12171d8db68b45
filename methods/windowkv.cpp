// WindowKV (arXiv 2503.17922; optim996/WindowKV, models/compress_utils.py
// WindowKVCluster.update_kv and init_WindowKV, args_demo.py, README): the context is the
// "review" part plus a suffix (the last `suffix` tokens, always kept). The suffix queries'
// softmax attention, summed over suffix rows, scores the review part, cut into windows of
// `window` consecutive tokens; the lowest-scored windows are dropped, the same in every head.
// Settings (METHODS-FACTS "WindowKV"):
// - window score: strategy=average, the mean over heads x tokens; strategy=max, the mean
//   over heads of each head's top window/2 scores (torch.topk along tokens);
// - suffix 32 under max, 16 under average (README --suffix_max 32 --suffix_avg 16);
//   window 8, groups of 8 layers (--review_window_size 8 --shared_layers 8);
// - only the first layer of each group scores; the others keep its windows;
// - group budgets decrease arithmetically: last = B * group / beta, first = 2B - last, the
//   groups between evenly spaced (step rounded down), beta 14 (args_demo.py);
// - once, at the end of the prefill; later tokens are appended uncompressed.
// Choices where the authors leave room or differ:
// - strategy: a trained BERT classifier picks it per input ("qa" gives max, other tasks
//   average); kvbench has no classifier, so it is a parameter, default max (kvbench's tasks
//   are question answering over a context);
// - the budget counts the suffix (kvbench's convention, as SnapKV's window); the authors'
//   max_capacity_prompt is the review part's alone;
// - the budget is held: the lowest windows are dropped until the review part fits (the
//   authors drop ceil((review - budget) / window) windows, which runs over when the short
//   last window is among them);
// - GQA: scores are the group's query heads averaged per KV head before the top-k of
//   strategy=max (the authors repeat K/V and take each query head's top-k);
// - layers not a multiple of the group: the last group is short; one group gets the
//   budget B (the authors' arithmetic divides by groups - 1).
#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "cache/windowed_policy.h"
#include "common/input_error.h"

namespace kvbench {

namespace {

struct WindowKvConfig {
  Budget budget;         // average tokens per layer and KV head, suffix included
  int64_t suffix = 32;   // last context tokens whose queries score; always kept
  int64_t window = 8;    // tokens per review window
  bool max = true;       // strategy=max (else average)
  int64_t group = 8;     // layers sharing the first one's windows
  int64_t beta = 14;     // arithmetic decay of group budgets
  bool arithmetic = true;
};

// Layer `layer`'s budget among n_layers for an average budget b.
int64_t group_budget(const WindowKvConfig& c, int32_t layer, int32_t n_layers, int64_t b) {
  const int64_t n_groups = (n_layers + c.group - 1) / c.group;
  if (!c.arithmetic || n_groups <= 1) return b;
  const int64_t last = b * c.group / c.beta;
  const int64_t first = 2 * b - last;
  const int64_t g = layer / c.group;
  if (g == n_groups - 1) return last;
  return first - g * ((first - last) / (n_groups - 1));
}

// The window here is the `suffix`: the context's last queries, which review the rest.
class WindowKvPolicy : public WindowedPolicy {
 public:
  WindowKvPolicy(const WindowKvConfig& config, int32_t n_layers)
      : WindowedPolicy(config.budget, config.suffix, n_layers),
        config_(config),
        n_layers_(n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<WindowKvPolicy>(*this);
  }

  int64_t bytes_resident(int32_t layer) const override {
    return WindowedPolicy::bytes_resident(layer) + group_slots_.bytes();
  }

 protected:
  // The budget is the layers' average: a context within it stays whole in every layer
  // (kvbench's invariant; the authors' last groups would still compress); else the layer's
  // group's share.
  int64_t layer_limit(int32_t layer, int64_t n_tokens, int64_t average) const override {
    if (n_tokens <= average) return n_tokens;
    return std::max<int64_t>(0, group_budget(config_, layer, n_layers_, average));
  }

  bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    // A layer inside a group keeps what the group's first layer chose.
    const std::vector<int32_t>& slots = group_slots_.slots(
        layer, config_.group, kv.n_tokens, limit, [&] { return choose(held, kv, limit); });
    plan_same_slots(slots, kv.n_kv_heads, plan);
    return true;
  }

 private:
  std::vector<int32_t> choose(const QueryWindow& held, const DenseKv& kv, int64_t limit) const {
    const int64_t n = kv.n_tokens;
    const int64_t suffix = std::min(config_.suffix, limit);
    const int64_t review = n - suffix, review_budget = limit - suffix;
    const std::vector<float> scores = held.kv_head_scores(kv);  // [n_kv_heads, n]
    const int64_t w = config_.window, top = std::max<int64_t>(1, w / 2);
    const int64_t n_windows = (review + w - 1) / w;
    std::vector<double> window_score(static_cast<size_t>(n_windows), 0.0);
    std::vector<float> row;
    for (int64_t i = 0; i < n_windows; ++i) {
      const int64_t first = i * w, len = std::min(w, review - first);
      double sum = 0;
      for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
        const float* s = scores.data() + h * n + first;
        if (config_.max) {
          row.assign(s, s + len);
          const int64_t k = std::min(top, len);
          std::partial_sort(row.begin(), row.begin() + k, row.end(), std::greater<float>());
          sum += std::accumulate(row.begin(), row.begin() + k, 0.0) / static_cast<double>(k);
        } else {
          sum += std::accumulate(s, s + len, 0.0) / static_cast<double>(len);
        }
      }
      window_score[i] = sum / kv.n_kv_heads;
    }
    // Drop the lowest windows (ties: the later one first) until the review part fits.
    std::vector<int64_t> order(static_cast<size_t>(n_windows));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return window_score[a] > window_score[b]; });
    std::vector<bool> kept(static_cast<size_t>(n_windows), true);
    int64_t n_review = review;
    for (auto it = order.rbegin(); it != order.rend() && n_review > review_budget; ++it) {
      kept[*it] = false;
      n_review -= std::min(w, review - *it * w);
    }
    std::vector<int32_t> slots;
    for (int64_t t = 0; t < n; ++t) {
      if (t >= review || kept[t / w]) slots.push_back(static_cast<int32_t>(t));
    }
    return slots;
  }

  WindowKvConfig config_;
  int32_t n_layers_;
  LayerGroupSlots group_slots_;
};

}  // namespace

// Registered as `windowkv` (methods/method_list.cpp).
MethodInfo windowkv_method() {
  MethodInfo info;
  info.name = "windowkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "the context before the last `suffix` tokens is cut into windows of `window` tokens, "
      "scored by the suffix queries' attention (mean, or mean of each head's top window/2); the "
      "lowest windows are dropped in every head; each group of `group` layers reuses its first "
      "layer's windows; group budgets decrease arithmetically (beta)";
  info.paper =
      "WindowKV: Task-Adaptive Group-Wise KV Cache Window Selection for Efficient LLM "
      "Inference (Zuo et al., 2025), arXiv 2503.17922";
  info.choices = {
      "strategy: the authors' BERT classifier picks max for QA, average otherwise; kvbench has "
      "no classifier, so it is a parameter, default max (kvbench's tasks are QA over a context)",
      "suffix defaults to the strategy's (32 for max, 16 for average, the authors' README)",
      "the budget is the average over layers and counts the suffix (the authors' "
      "max_capacity_prompt excludes it); a group's budget may exceed it, as PyramidKV's",
      "the budget is held: lowest windows go until the rest fits (the authors drop "
      "ceil((review - budget) / window) windows, over budget when the short last one goes)",
      "GQA: the group's query heads are averaged per KV head before strategy=max's top-k (the "
      "authors take each query head's top-k over repeated K/V)",
      "a layer budget below the suffix shrinks the suffix to the budget; a context within "
      "the budget is kept whole in every layer (the authors' later groups would still "
      "compress it)",
      "a single group (fewer layers than `group`) gets the budget; a short last group is "
      "allowed (the authors' arithmetic needs at least two whole groups)",
  };
  info.params = budget_params(kDefaultBudget);
  ParamInfo suffix = int_param("suffix", 0, 1, kMaxTokens,
                               "last context tokens whose queries score the rest; always kept "
                               "(default: 32 under strategy=max, 16 under average)");
  suffix.default_value = "";
  info.params.push_back(suffix);
  info.params.push_back(int_param("window", 8, 1, kMaxTokens, "tokens per review window"));
  info.params.push_back(choice_param("strategy", "max", {"max", "average"},
                                     "window score: mean of each head's top window/2 scores "
                                     "(max) or mean of all (average)"));
  info.params.push_back(
      int_param("group", 8, 1, kMaxTokens, "layers sharing their first layer's windows"));
  info.params.push_back(choice_param("decay", "arithmetic", {"arithmetic", "uniform"},
                                     "group budgets: decreasing arithmetically (the authors') "
                                     "or the budget in every layer"));
  info.params.push_back(int_param("beta", 14, 1, kMaxTokens,
                                  "arithmetic decay: the last group keeps budget * group / beta"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    if (params.get("decay") == "arithmetic" &&
        params.get_int("beta") * 2 < params.get_int("group")) {
      throw InputError("beta=" + std::to_string(params.get_int("beta")) +
                       " must be at least group/2=" + std::to_string(params.get_int("group") / 2) +
                       " (the first group keeps 2 budget - budget * group / beta)");
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    WindowKvConfig config;
    config.budget = budget_from(params);
    config.max = params.get("strategy") == "max";
    config.suffix = params.has("suffix") ? params.get_int("suffix") : (config.max ? 32 : 16);
    config.window = params.get_int("window");
    config.group = params.get_int("group");
    config.arithmetic = params.get("decay") == "arithmetic";
    config.beta = params.get_int("beta");
    return std::unique_ptr<TokenPolicy>(new WindowKvPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
