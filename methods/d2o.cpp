// D2O (Dynamic Discriminative Operations): layer budgets from how dense each layer's prefill
// attention is, then H2O's eviction in every layer (heavy hitters by accumulated attention,
// plus the most recent tokens) with a compensation: each evicted token whose key is close
// enough to a kept one is merged into it instead of being lost.
//
// - Layer budgets (once, when the context first exceeds the budget): per query head, the
//   variance across keys of the attention each key received over the prefill (column sums),
//   min-max normalised across the layer's heads and averaged: v_l. Denser attention (lower
//   v_l) gets more: budget_l = softmax(-v)_l * n_layers * budget, clamped to [1%, 100%] of
//   the context, so the layers average `budget`.
// - Eviction (then after every forward): per KV head, the `recent` share of budget_l newest
//   tokens, the first `sink` tokens and the heaviest hitters, scores summed over every query.
// - Merge: each evicted key's cosine similarity to the head's kept keys gives its nearest
//   kept token and max_sim. A per-layer threshold follows an EMA, tau = alpha * tau +
//   beta * mean(max_sim) (the first mean to start). The j-th evicted token of every head (by
//   position) is merged when its max_sim averaged over heads reaches tau; a kept token
//   becomes the mean of itself and max_sim * (each token merged into it), keys and values
//   alike.
//
// Authors' settings (AIoT-MLSys-Lab/d2o, LLM_merge_new/LMEval_kv_token_merge):
// modeling_llama3_new.py LlamaModel.forward (allocation: softmax(-v) * L * (hh_ratio +
// recent_ratio), clamped to [0.01, 1]), modeling_llama3_7b_13b_d2o.py D2O_LayerKVCache
// (eviction, the 4 first tokens kept, the merge as torch.scatter_reduce 'mean' with
// include_self) and LlamaAttention3_D2O.forward (the statistics). Defaults from
// run_pred_long_bench_sample.py: hh_ratio 0.1, recent_ratio 0.1 (here `recent` 0.5 of the
// budget), alpha 0.5, beta ("belta") 0.5.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"
#include "methods/received_attention.h"

namespace kvbench {

// D2O's layer budgets, shared with the tests: softmax(-v) * n_layers * budget per layer,
// clamped to [1%, 100%] of n_context (at least one token) and rounded down; where the floor
// lifts the total above n_layers * budget, the largest layers give the excess back, one
// token at a time.
std::vector<int64_t> d2o_layer_budgets(const std::vector<double>& density, int64_t budget,
                                       int64_t n_context) {
  const size_t n_layers = density.size();
  double lowest = std::numeric_limits<double>::infinity();
  for (double v : density) lowest = std::min(lowest, v);
  double sum = 0;
  for (double v : density) sum += std::exp(-(v - lowest));  // shifted: the same softmax
  std::vector<int64_t> out;
  int64_t total = 0;
  const double floor_share = std::max(1.0, 0.01 * static_cast<double>(n_context));
  for (double v : density) {
    const double share = std::exp(-(v - lowest)) / sum * static_cast<double>(n_layers * budget);
    const double clamped = std::clamp(share, floor_share, static_cast<double>(n_context));
    out.push_back(static_cast<int64_t>(clamped));
    total += out.back();
  }
  for (int64_t excess = total - static_cast<int64_t>(n_layers) * budget; excess > 0; --excess) {
    --*std::max_element(out.begin(), out.end());
  }
  return out;
}

namespace {

struct D2oConfig {
  Budget budget;
  double recent = 0.5;  // share of a layer's budget for its newest tokens
  int64_t sink = 4;     // first tokens always kept
  double alpha = 0.5, beta = 0.5;
};

class D2oPolicy : public TokenPolicy {
 public:
  D2oPolicy(const D2oConfig& config, const KvShape& shape)
      : config_(config),
        limits_(config.budget, shape.n_layers),
        n_kv_heads_(shape.n_kv_heads),
        layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override { return std::make_unique<D2oPolicy>(*this); }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    layers_[layer].received.observe(query, kv);
  }

  // Every row's attention, from the attention pass (KvCache::attend_scored) or the device;
  // keys are still read to merge, so plan sees host copies on a GPU.
  ScoredRows scored_rows() const override { return ScoredRows::All; }
  bool plans_on_kv() const override { return true; }
  void observe_scores(int32_t layer, const float* scores, int32_t n_heads,
                      int64_t n_tokens) override {
    layers_[layer].received.add(scores, n_heads, n_tokens);
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0) return false;
    if (layer_budget_.empty()) {
      if (n <= limit) return false;
      allocate(limit, n);  // every layer has observed the forward that crossed the budget
    }
    const int64_t keep = layer_budget_[layer];
    if (n <= keep) return false;
    LayerState& s = layers_[layer];
    s.received.grow(n);
    select(s, kv, keep, plan);
    merge(s, kv, plan);
    return true;
  }

  void retained(int32_t layer, const RetainPlan& plan) override {
    layers_[layer].received.retained(plan, n_kv_heads_);
  }

  int64_t bytes_resident(int32_t layer) const override {
    return layers_[layer].received.bytes();
  }

 private:
  struct LayerState {
    ReceivedAttention received;  // H2O's sums, per query head
    double threshold = 0;  // the merge threshold's EMA
    bool has_threshold = false;
  };

  // v_l per layer from its accumulated column sums, then the budgets.
  void allocate(int64_t budget, int64_t n_context) {
    std::vector<double> density;
    for (const LayerState& s : layers_) {
      const ReceivedAttention& r = s.received;
      const int64_t n = r.n_tokens();
      std::vector<double> per_head;
      for (int32_t h = 0; h < r.n_heads(); ++h) {
        const float* col = r.head(h);
        double sum = 0, sum_sq = 0;
        for (int64_t t = 0; t < n; ++t) {
          sum += col[t];
          sum_sq += static_cast<double>(col[t]) * col[t];
        }
        const double mean = n > 0 ? sum / n : 0;
        per_head.push_back(n > 1 ? std::max(0.0, (sum_sq - n * mean * mean) / (n - 1)) : 0.0);
      }
      double v = 0;
      if (!per_head.empty()) {
        const auto [lo, hi] = std::minmax_element(per_head.begin(), per_head.end());
        const double low = *lo, span = *hi - *lo + 1e-6;
        for (double x : per_head) v += (x - low) / span;
        v /= static_cast<double>(per_head.size());
      }
      density.push_back(v);
    }
    layer_budget_ = d2o_layer_budgets(density, budget, n_context);
  }

  // Per KV head: the newest `recent` share, then the sinks, then the heaviest hitters (the
  // group's summed scores), `keep` in all.
  void select(const LayerState& s, const DenseKv& kv, int64_t keep, RetainPlan& plan) const {
    const int64_t n = kv.n_tokens;
    const int64_t n_recent =
        std::min(keep, static_cast<int64_t>(std::floor(config_.recent * keep + 1e-9)));
    const int64_t n_sink = std::min(config_.sink, n - n_recent);
    std::vector<float> ranked = s.received.per_kv_head(n_kv_heads_);
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      const std::vector<int32_t> order = slots_by_position(kv, g, n_sink, n_recent);
      for (int64_t i = 0; i < n_sink; ++i) ranked[g * n + order[i]] = FLT_MAX / 2;
      for (int64_t i = n - n_recent; i < n; ++i) ranked[g * n + order[i]] = FLT_MAX;
    }
    plan_top_k_per_head(ranked.data(), n_kv_heads_, n, keep, plan);
  }

  // Fills plan.k / plan.v: every kept token, those that absorb evicted ones merged.
  void merge(LayerState& s, const DenseKv& kv, RetainPlan& plan) const {
    const int32_t d = kv.head_dim;
    const int64_t n = kv.n_tokens, keep = plan.n_keep, n_evicted = n - keep;
    const auto key = [&](int32_t h, int64_t slot) { return kv.k + (h * kv.capacity + slot) * d; };
    const auto value = [&](int32_t h, int64_t slot) {
      return kv.v + (h * kv.capacity + slot) * d;
    };
    const auto norm = [d](const float* x) {
      double sq = 0;
      for (int32_t i = 0; i < d; ++i) sq += static_cast<double>(x[i]) * x[i];
      return std::sqrt(sq);
    };
    // Per head, the evicted slots by position, each one's nearest kept token and similarity.
    std::vector<int64_t> evicted(static_cast<size_t>(n_kv_heads_ * n_evicted));
    std::vector<int64_t> nearest(evicted.size());
    std::vector<double> similarity(evicted.size());
    double sum_similarity = 0;
    std::vector<float> unit;  // the head's unit evicted keys [n_evicted, d]
    std::vector<int64_t> best(static_cast<size_t>(n_evicted));
    std::vector<float> best_cosine(best.size());
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int32_t* kept = plan.slots.data() + h * keep;
      std::vector<bool> is_kept(static_cast<size_t>(n), false);
      for (int64_t j = 0; j < keep; ++j) is_kept[kept[j]] = true;
      std::vector<int64_t> gone;
      for (int64_t t = 0; t < n; ++t)
        if (!is_kept[t]) gone.push_back(t);
      const int32_t* pos = kv.positions + h * kv.capacity;
      std::sort(gone.begin(), gone.end(), [pos](int64_t a, int64_t b) { return pos[a] < pos[b]; });
      // Cosines as fp32 GEMMs of unit rows (the authors' torch matmul of normalised keys),
      // threaded, not a double dot per (evicted, kept) pair: that loop was most of D2O's time.
      const int ld = static_cast<int>(keep);
      std::vector<float> kept_t(static_cast<size_t>(d) * ld, 0.f);  // [d][ld], unit columns
      for (int64_t j = 0; j < keep; ++j) {
        const float* kk = key(h, kept[j]);
        const double nk = norm(kk);
        for (int32_t i = 0; i < d; ++i)
          kept_t[static_cast<size_t>(i) * ld + j] = nk > 0 ? static_cast<float>(kk[i] / nk) : 0.f;
      }
      unit.resize(static_cast<size_t>(n_evicted) * d);
      for (int64_t r = 0; r < n_evicted; ++r) {
        const float* ke = key(h, gone[r]);
        const double ne = norm(ke);
        for (int32_t i = 0; i < d; ++i)
          unit[static_cast<size_t>(r) * d + i] = ne > 0 ? static_cast<float>(ke[i] / ne) : 0.f;
      }
      nearest_columns_cpu(unit.data(), n_evicted, d, kept_t.data(), keep, best.data(),
                          best_cosine.data());
      for (int64_t r = 0; r < n_evicted; ++r) {
        const size_t at = static_cast<size_t>(h * n_evicted + r);
        evicted[at] = gone[r];
        nearest[at] = best[r];
        similarity[at] = best_cosine[r];
        sum_similarity += best_cosine[r];
      }
    }
    const double mean = sum_similarity / static_cast<double>(n_kv_heads_ * n_evicted);
    s.threshold = s.has_threshold ? config_.alpha * s.threshold + config_.beta * mean : mean;
    s.has_threshold = true;

    // Sums and counts per kept token, itself included (scatter_reduce 'mean').
    std::vector<double> sum_k(static_cast<size_t>(n_kv_heads_ * keep * d));
    std::vector<double> sum_v(sum_k.size());
    std::vector<int64_t> count(static_cast<size_t>(n_kv_heads_ * keep), 1);
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      for (int64_t j = 0; j < keep; ++j) {
        const int32_t slot = plan.slots[h * keep + j];
        std::copy_n(key(h, slot), d, sum_k.begin() + (h * keep + j) * d);
        std::copy_n(value(h, slot), d, sum_v.begin() + (h * keep + j) * d);
      }
    }
    for (int64_t e = 0; e < n_evicted; ++e) {
      double across_heads = 0;
      for (int32_t h = 0; h < n_kv_heads_; ++h) across_heads += similarity[h * n_evicted + e];
      if (across_heads / n_kv_heads_ < s.threshold) continue;
      for (int32_t h = 0; h < n_kv_heads_; ++h) {
        const size_t at = static_cast<size_t>(h * n_evicted + e);
        const int64_t into = h * keep + nearest[at];
        const float* ke = key(h, evicted[at]);
        const float* ve = value(h, evicted[at]);
        for (int32_t i = 0; i < d; ++i) {
          sum_k[into * d + i] += similarity[at] * ke[i];
          sum_v[into * d + i] += similarity[at] * ve[i];
        }
        ++count[into];
      }
    }
    plan.k.resize(sum_k.size());
    plan.v.resize(sum_v.size());
    for (size_t r = 0; r < count.size(); ++r) {
      for (int32_t i = 0; i < d; ++i) {
        plan.k[r * d + i] = static_cast<float>(sum_k[r * d + i] / count[r]);
        plan.v[r * d + i] = static_cast<float>(sum_v[r * d + i] / count[r]);
      }
    }
  }

  D2oConfig config_;
  LayerLimits limits_;
  int32_t n_kv_heads_;
  std::vector<LayerState> layers_;
  std::vector<int64_t> layer_budget_;  // per layer, once the context first exceeds the budget
};

}  // namespace

// Registered as `d2o` (methods/method_list.cpp).
MethodInfo d2o_method() {
  MethodInfo info;
  info.name = "d2o";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: at the end of the shared context, then after every forward (one token per "
      "decode step)";
  info.summary =
      "layer budgets from attention density (denser layers keep more), averaging `budget`; "
      "per KV head H2O's recent + heavy hitters, each evicted token merged into its most "
      "similar kept key when the similarity passes an EMA threshold";
  info.paper =
      "D2O: Dynamic Discriminative Operations for Efficient Generative Inference of Large "
      "Language Models (Wan et al.), arXiv 2406.13035";
  info.choices = {
      "every layer is compressed so the layers average the budget; the authors' code "
      "leaves layers 0, 1 and the last uncompressed",
      "eviction starts at ContextEnd with the prefill's scores; the authors' starts at the "
      "first decode step, its row added",
      "budget is the average per layer and `recent` its newest share (the authors' "
      "hh_ratio / recent_ratio of the prompt, 0.1 + 0.1: recent 0.5); where the 1% floor "
      "lifts the total over the budget, the largest layers give it back",
      "GQA: scores are kept per query head and summed per KV head, which evicts and merges "
      "(the authors' code is MHA)",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(float_param("recent", "0.5", 0, 1,
                                    "share of a layer's budget for its most recent tokens"));
  info.params.push_back(int_param("sink", 4, 0, kMaxTokens, "first tokens always kept"));
  info.params.push_back(
      float_param("alpha", "0.5", 0, 1, "weight of the previous merge threshold in the EMA"));
  info.params.push_back(float_param(
      "beta", "0.5", 0, 1, "weight of the step's mean max similarity in the EMA threshold"));
  info.check = check_budget;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    D2oConfig config;
    config.budget = budget_from(params);
    config.recent = params.get_float("recent");
    config.sink = params.get_int("sink");
    config.alpha = params.get_float("alpha");
    config.beta = params.get_float("beta");
    return std::unique_ptr<TokenPolicy>(new D2oPolicy(config, shape));
  };
  return info;
}

}  // namespace kvbench
