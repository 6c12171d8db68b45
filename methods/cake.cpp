// CAKE (Cascading and Adaptive KV cache Eviction): each layer's share of the total budget
// follows its preference P_l = H_l^(1/tau1) * V_l^(1/tau2), from the attention the last
// `window` context queries give the prefix: H_l its dispersion (entropy of those attention
// weights, summed over heads, window rows and prefix tokens) and V_l its shift (the
// variance across window rows of each prefix token's weight, summed over heads and
// tokens). Within a layer each KV head keeps the prefix tokens with the largest
// mean + gamma * variance over the window rows (avg-pooled, the group's query heads
// averaged), plus the window itself.
//
// Authors' settings (antgroup/cakekv): cake/model/modify_llama.py (and _qwen2, _mistral)
// compute both statistics on the softmax of the window's queries against all keys (causal
// inside the window; torch.var is unbiased), cake/cake_cache.py CakeprefillKVCache splits
// (cache_size - window) * n_layers prefix tokens as P_l / sum(P), truncated to integers, then
// cake/utils.py adjust_budgets caps each layer at the prefix length and hands the excess and
// the rounding remainder out evenly, the first layers taking the remainder. Defaults from
// experiments/LongBench/pred_cake.py: cache_size 1024, window 32, gamma 200, avg-pool 5;
// tau1 and tau2 per model from config/model2tau.json (e.g. Qwen2.5-7B at 1024: 1.5 / 0.6),
// falling back to 1 / 1, which are the defaults here.
//
// The authors' cascading mode re-splits the budget as each layer's prefill finishes, every
// time from the preferences known so far, and each layer keeps the top of its previous
// choice. The scores do not change between those steps (a layer's statistics come from its
// own full prefill) and the budgets only shrink as layers join, so the last step, over all
// layers, is the allocation both modes end at; kvbench computes it at once at ContextEnd,
// when every layer's window has been seen, from each layer's final window over the whole
// context (TokenPolicy::context_ending).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "common/input_error.h"
#include "methods/snapkv.h"

namespace kvbench {

// CAKE's adjust_budgets (cake/utils.py), shared with the tests: truncated shares, capped at
// `cap`, the excess and then the difference to `total` spread evenly over the layers that
// can still take (or give) tokens, the first of them one more; capped again at [0, cap] as
// the authors' eviction does.
std::vector<int64_t> cake_adjust_budgets(const std::vector<double>& shares, int64_t total,
                                         int64_t cap) {
  std::vector<int64_t> b;
  for (double s : shares) b.push_back(static_cast<int64_t>(s));  // numpy's astype(int)
  const auto spread = [&b](int64_t amount, bool add, auto valid) {
    std::vector<size_t> where;
    for (size_t i = 0; i < b.size(); ++i)
      if (valid(b[i])) where.push_back(i);
    if (where.empty()) return;
    const int64_t each = amount / static_cast<int64_t>(where.size());
    const int64_t rest = amount % static_cast<int64_t>(where.size());
    for (size_t j = 0; j < where.size(); ++j) {
      const int64_t step = each + (static_cast<int64_t>(j) < rest ? 1 : 0);
      b[where[j]] += add ? step : -step;
    }
  };
  int64_t excess = 0;
  for (int64_t& x : b) {
    excess += std::max<int64_t>(0, x - cap);
    x = std::min(x, cap);
  }
  if (excess > 0) spread(excess, true, [cap](int64_t x) { return x < cap; });
  int64_t sum = 0;
  for (int64_t x : b) sum += x;
  const int64_t diff = total - sum;
  if (diff > 0) spread(diff, true, [cap](int64_t x) { return x < cap; });
  if (diff < 0) spread(-diff, false, [](int64_t x) { return x > 1; });
  for (int64_t& x : b) x = std::clamp<int64_t>(x, 0, cap);
  return b;
}

namespace {

struct CakeConfig {
  SnapKvConfig snap;  // budget, window, pooling
  double gamma = 200, tau1 = 1, tau2 = 1;
};

class CakePolicy : public TokenPolicy {
 public:
  CakePolicy(const CakeConfig& config, int32_t n_layers)
      : config_(config),
        limits_(config.snap.budget, n_layers),
        windows_(n_layers, QueryWindow(config.snap.window)),
        closed_(n_layers, false),
        preference_(n_layers, 0.0) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<CakePolicy>(*this);
  }

  // Every forward of the context moves the layer's window; its preference is computed once,
  // from the final window over the whole context (context_ending), not at every forward.
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (closed_[layer]) return;
    windows_[layer].observe(query, kv.head_dim);
  }

  bool reads_context_end() const override { return true; }
  void context_ending(int32_t layer, const DenseKv& kv) override {
    preference_[layer] = preference(windows_[layer], kv);
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd || closed_[layer]) return false;
    closed_[layer] = true;
    const QueryWindow held = std::move(windows_[layer]);
    windows_[layer] = QueryWindow();

    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    const int64_t window = std::min(config_.snap.window, limit);
    const int64_t n_prefix = n - window;
    if (prefix_keep_.empty()) allocate(n_prefix, limit - window);
    const int64_t keep_prefix = std::clamp<int64_t>(prefix_keep_[layer], 0, n_prefix);
    if (keep_prefix == n_prefix) return false;

    const std::vector<float> ranked = eviction_indicator(held, kv, window);
    plan_top_k_per_head(ranked.data(), kv.n_kv_heads, n, keep_prefix + window, plan);
    return true;
  }

  int64_t bytes_resident(int32_t layer) const override {
    return windows_[layer].bytes_resident();
  }
  bool done(int32_t layer) const override { return closed_[layer]; }

 private:
  // P_l = H^(1/tau1) * V^(1/tau2) over the held rows and the prefix before them.
  double preference(const QueryWindow& window, const DenseKv& kv) const {
    const int64_t rows = window.n_rows(), n = kv.n_tokens, n_prefix = n - rows;
    if (rows < 2 || n_prefix <= 0) return 0;
    const std::vector<float> a = window.row_scores(kv);  // [rows, n_heads, n]
    const int64_t n_heads = static_cast<int64_t>(a.size()) / (rows * n);
    double entropy = 0, variance = 0;
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t t = 0; t < n_prefix; ++t) {
        double sum = 0, sum_sq = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const double x = a[(r * n_heads + h) * n + t];
          entropy -= x * std::log(x + 1e-10);
          sum += x;
          sum_sq += x * x;
        }
        const double mean = sum / rows;
        variance += std::max(0.0, (sum_sq - rows * mean * mean) / (rows - 1));
      }
    }
    return std::pow(entropy, 1 / config_.tau1) * std::pow(variance, 1 / config_.tau2);
  }

  // Prefix tokens per layer: the total split by preference (evenly where no layer has
  // any), then adjust_budgets.
  void allocate(int64_t n_prefix, int64_t prefix_budget) {
    const size_t n_layers = preference_.size();
    const int64_t total = prefix_budget * static_cast<int64_t>(n_layers);
    double sum = 0;
    for (double p : preference_) sum += std::isfinite(p) ? p : 0;
    std::vector<double> shares(n_layers, static_cast<double>(prefix_budget));
    if (sum > 0) {
      for (size_t l = 0; l < n_layers; ++l) {
        const double p = std::isfinite(preference_[l]) ? preference_[l] : 0;
        shares[l] = p / sum * static_cast<double>(total);
      }
    }
    prefix_keep_ = cake_adjust_budgets(shares, total, n_prefix);
  }

  // Per KV head: mean + gamma * variance (unbiased) over the window rows of each slot's
  // weight, per query head, pooled along the prefix, averaged over the group; the window
  // ranked above any score so top-k keeps it. [n_kv_heads, n].
  std::vector<float> eviction_indicator(const QueryWindow& held, const DenseKv& kv,
                                        int64_t window) const {
    const int64_t n = kv.n_tokens, n_prefix = n - window, rows = held.n_rows();
    const int32_t n_kv = kv.n_kv_heads;
    std::vector<float> ranked(static_cast<size_t>(n_kv * n), 0.f);
    if (rows > 0) {
      const std::vector<float> a = held.row_scores(kv);
      const int64_t n_heads = static_cast<int64_t>(a.size()) / (rows * n);
      const int64_t group = std::max<int64_t>(1, n_heads / n_kv);
      std::vector<float> indicator(static_cast<size_t>(n_prefix)), pooled(indicator.size());
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t t = 0; t < n_prefix; ++t) {
          double sum = 0, sum_sq = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const double x = a[(r * n_heads + h) * n + t];
            sum += x;
            sum_sq += x * x;
          }
          const double mean = sum / rows;
          const double var =
              rows > 1 ? std::max(0.0, (sum_sq - rows * mean * mean) / (rows - 1)) : 0.0;
          indicator[t] = static_cast<float>(mean + config_.gamma * var);
        }
        pool1d_cpu(indicator.data(), pooled.data(), 1, n_prefix, config_.snap.kernel,
                   config_.snap.pool);
        float* out = ranked.data() + (h / group) * n;
        for (int64_t t = 0; t < n_prefix; ++t) out[t] += pooled[t] / group;
      }
    }
    for (int32_t g = 0; g < n_kv; ++g)
      std::fill(ranked.begin() + g * n + n_prefix, ranked.begin() + (g + 1) * n, FLT_MAX);
    return ranked;
  }

  CakeConfig config_;
  LayerLimits limits_;
  std::vector<QueryWindow> windows_;
  std::vector<bool> closed_;
  std::vector<double> preference_;    // per layer, from its final window (context_ending)
  std::vector<int64_t> prefix_keep_;  // per layer, set at the first compressed layer
};

}  // namespace

// Registered as `cake` (methods/method_list.cpp).
MethodInfo cake_method() {
  MethodInfo info;
  info.name = "cake";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "layer budgets by attention dispersion (entropy) and shift (variance across the "
      "window), averaging `budget`; per KV head the top mean + gamma * variance of the "
      "window's attention, plus the window";
  info.paper =
      "CAKE: Cascading and Adaptive KV Cache Eviction with Layer Preferences (Qin et al., "
      "ICLR 2025), arXiv 2503.12491";
  info.choices = {
      "allocation computed once at ContextEnd from every layer's final window; the "
      "authors' cascading re-splits as each layer finishes, ending at the same split (only "
      "their rounding remainder, handed to the first layers, can differ by a token)",
      "compresses once a context exceeds the budget; the authors' code leaves contexts "
      "up to cache_size + window uncompressed",
      "later tokens are appended uncompressed, as SnapKV here; the authors' decode-time "
      "evictor (CakeDecodingKVCache_LayerWise) drops one token per step by the new "
      "token's attention",
      "tau1 / tau2 default to 1 / 1, the authors' fallback; their tuned values are per "
      "model and budget (config/model2tau.json)",
      "a layer's preference is 0 when its window has one row; no preference anywhere "
      "splits the budget evenly (the authors' code divides by zero)",
  };
  info.params = snapkv_params();
  info.params.push_back(float_param("gamma", "200", 0, 1e9,
                                    "weight of the variance in the eviction indicator"));
  info.params.push_back(float_param("tau1", "1", 0.01, 100,
                                    "temperature of the dispersion (entropy) in P_l"));
  info.params.push_back(float_param("tau2", "1", 0.01, 100,
                                    "temperature of the shift (variance) in P_l"));
  info.check = check_snapkv_params;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    CakeConfig config;
    config.snap = snapkv_config_from(params);
    config.gamma = params.get_float("gamma");
    config.tau1 = params.get_float("tau1");
    config.tau2 = params.get_float("tau2");
    return std::unique_ptr<TokenPolicy>(new CakePolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
