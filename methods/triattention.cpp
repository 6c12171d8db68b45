// TriAttention: scores each key by the attention logit future queries are expected to give
// it, from the RoPE frequency statistics of the queries before RoPE. Per query head and RoPE
// pair f (complex q_f = q[2f] + i q[2f+1]), the mean q̄_f and the mean magnitude E|q_f|;
// for a key k at position p, at round t:
//   S(k, D) = sum_f |q̄_f||k_f| cos(w_f (t - p + D) + arg(q̄_f conj k_f))
//           + sum_f (E|q_f| - |q̄_f|) |k_f|,
// the mean over the offsets D in {1, 2, 4, ..., offset_max} is the score (the first term is
// where the queries' mean lands after the distance, the second what their spread adds).
// Per KV head the max over its GQA group ranks the tokens; each layer keeps its own top
// `budget`. With the stored (RoPE'd) key k' = k e^{i w p}, q̄ conj(k) e^{i w (t - p)} is
// q̄ conj(k') e^{i w t}: the keys' RoPE cancels against the distance, so no key is turned
// back (the same score, exactly).
//
// When: `context=compress` (default) compresses the shared context to the budget at its end;
// then, as the authors, a round every `divide` positions (a forward crossing a multiple of
// `divide`) evicts back to the budget once over it, the cache growing by up to `divide`
// tokens in between. `context=pin` keeps the shared context whole (the authors' HF default):
// only tokens after it compete for what the budget leaves, at the rounds.
//
// Authors' settings (WeianMao/triattention c3744ee6, triattention/methods/pruning_utils.py
// compute_frequency_statistics_from_means, score_keys_for_round, build_geometric_offsets;
// triattention/methods/triattention.py TriAttentionConfig; METHODS-FACTS "TriAttention"):
// - offset_max_length 65536, score_aggregation mean, divide_length 128, budget 2048,
//   normalize_scores off, disable_mlr / disable_trig off; freq_scale 1 for plain RoPE.
// - the query statistics are calibrated OFFLINE (scripts/calibrate.py: mean over a trace of
//   the complex pre-RoPE query and of its magnitude). Here they come in-run from the queries
//   this cache has seen (the context's, then every later one), turned back before RoPE by
//   their positions (KvShape::rope_inv_freq; the model rotates interleaved pairs, the HF
//   code halves: the same rotation, another channel order).
// - allow_prefill_compression off in the HF scripts (prefill pinned); the vLLM runtime's
//   TRIATTN_RUNTIME_PROTECT_PREFILL is false (README): the context competes there.
// - head aggregation: default union over sampled heads of all layers; paper scripts
//   per_head_pruning (mean over layers of the GQA-group max, one set per KV head index);
//   per_layer_perhead_pruning the per-(layer, KV head) max used here, since kvbench plans
//   each layer on its own.
// A shape without RoPE has w = 0: the score is q̄.k + sum_f (E|q_f| - |q̄_f|)|k_f|.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <complex>
#include <string>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "common/input_error.h"

namespace kvbench {
namespace {

struct TriAttentionConfig {
  Budget budget;
  int64_t divide = 128;
  int64_t offset_max = 65536;
  bool pin_context = false;
};

// One layer's pre-RoPE query statistics, per query head and frequency pair.
struct FrequencyStats {
  int64_t count = 0;
  std::vector<std::complex<double>> sum;  // [n_heads, head_dim / 2]: sum of q_f
  std::vector<double> abs_sum;            // [n_heads, head_dim / 2]: sum of |q_f|
};

class TriAttentionPolicy : public TokenPolicy {
 public:
  TriAttentionPolicy(const TriAttentionConfig& config, const KvShape& shape)
      : config_(config),
        limits_(config.budget, shape.n_layers),
        inv_freq_(shape.rope_inv_freq),
        stats_(shape.n_layers),
        next_position_(shape.n_layers, 0),
        round_(shape.n_layers, 0),
        context_end_(shape.n_layers, -1) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<TriAttentionPolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    const int32_t half = kv.head_dim / 2, n_heads = query.n_heads;
    FrequencyStats& s = stats_[layer];
    if (s.sum.empty()) {
      s.sum.assign(static_cast<size_t>(n_heads) * half, 0.0);
      s.abs_sum.assign(s.sum.size(), 0.0);
    }
    std::vector<std::complex<double>> back(half, 1.0);  // e^{-i w_f p}
    for (int32_t r = 0; r < query.n_queries; ++r) {
      const int32_t position = query.q_positions[r];
      next_position_[layer] = std::max<int64_t>(next_position_[layer], position + 1);
      for (int32_t f = 0; f < half; ++f) back[f] = std::polar(1.0, -position * omega(f));
      ++s.count;
      for (int32_t h = 0; h < n_heads; ++h) {
        const float* q = query.q + (static_cast<int64_t>(r) * n_heads + h) * kv.head_dim;
        for (int32_t f = 0; f < half; ++f) {
          const std::complex<double> qf(q[2 * f], q[2 * f + 1]);
          s.sum[h * half + f] += qf * back[f];
          s.abs_sum[h * half + f] += std::abs(qf);
        }
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t n = kv.n_tokens;
    const int64_t t = next_position_[layer];
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (phase == CachePhase::ContextEnd) {
      context_end_[layer] = t;
      round_[layer] = t / config_.divide;
      if (config_.pin_context) return false;
    } else {
      // A round once a forward crosses a multiple of `divide` (the authors: position %
      // divide_length == 0 after a single-token step).
      if (t / config_.divide == round_[layer]) return false;
      round_[layer] = t / config_.divide;
    }
    if (limit < 0 || n <= limit) return false;
    std::vector<float> scores = score(layer, kv, t);
    int64_t keep = limit;
    if (config_.pin_context) {  // the context ranks above any score and stays whole
      int64_t pinned = 0;
      for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
        int64_t in_head = 0;
        for (int64_t j = 0; j < n; ++j) {
          if (kv.positions[g * kv.capacity + j] < context_end_[layer]) {
            scores[g * n + j] = FLT_MAX;
            ++in_head;
          }
        }
        pinned = std::max(pinned, in_head);
      }
      keep = std::max(limit, pinned);
      if (keep >= n) return false;
    }
    plan_top_k_per_head(scores.data(), kv.n_kv_heads, n, keep, plan);
    return true;
  }

  int64_t bytes_resident(int32_t layer) const override {
    return vector_bytes(stats_[layer].sum) + vector_bytes(stats_[layer].abs_sum);
  }

 private:
  double omega(int32_t f) const {
    return static_cast<size_t>(f) < inv_freq_.size() ? static_cast<double>(inv_freq_[f]) : 0.0;
  }

  // Scores [n_kv_heads, n_tokens] at round t: the GQA group's max.
  std::vector<float> score(int32_t layer, const DenseKv& kv, int64_t t) const {
    const FrequencyStats& s = stats_[layer];
    const int64_t n = kv.n_tokens;
    const int32_t d = kv.head_dim, half = d / 2, n_kv = kv.n_kv_heads;
    const int32_t n_heads = s.sum.empty() ? n_kv : static_cast<int32_t>(s.sum.size() / half);
    const int32_t group = n_heads / n_kv;
    // Per pair, e^{i w t} times the mean over the offsets of e^{i w D}: the cosine's mean
    // over D is the real part of the phase times it.
    std::vector<std::complex<double>> carry(half);
    for (int32_t f = 0; f < half; ++f) {
      std::complex<double> mean = 0;
      int64_t count = 0;
      for (int64_t offset = 1; offset <= config_.offset_max; offset *= 2, ++count) {
        mean += std::polar(1.0, omega(f) * static_cast<double>(offset));
      }
      carry[f] =
          std::polar(1.0, omega(f) * static_cast<double>(t)) * mean / static_cast<double>(count);
    }
    // Per query head: w_f = q̄_f carry_f and the spread coefficient E|q_f| - |q̄_f|.
    std::vector<std::complex<double>> weight(static_cast<size_t>(n_heads) * half, 0.0);
    std::vector<double> spread(weight.size(), 0.0);
    if (s.count > 0) {
      for (size_t i = 0; i < weight.size(); ++i) {
        const std::complex<double> mean = s.sum[i] / static_cast<double>(s.count);
        weight[i] = mean * carry[i % half];
        spread[i] = s.abs_sum[i] / static_cast<double>(s.count) - std::abs(mean);
      }
    }
    std::vector<float> scores(static_cast<size_t>(n_kv) * n, -FLT_MAX);
    for (int32_t g = 0; g < n_kv; ++g) {
      for (int64_t j = 0; j < n; ++j) {
        const float* k = kv.k + (g * kv.capacity + j) * d;
        float& out = scores[g * n + j];
        for (int32_t h = g * group; h < (g + 1) * group; ++h) {
          const std::complex<double>* w = weight.data() + static_cast<int64_t>(h) * half;
          const double* e = spread.data() + static_cast<int64_t>(h) * half;
          double value = 0;
          for (int32_t f = 0; f < half; ++f) {
            const double re = k[2 * f], im = k[2 * f + 1];
            value += w[f].real() * re + w[f].imag() * im + e[f] * std::sqrt(re * re + im * im);
          }
          out = std::max(out, static_cast<float>(value));
        }
      }
    }
    return scores;
  }

  TriAttentionConfig config_;
  LayerLimits limits_;
  std::vector<float> inv_freq_;  // [head_dim / 2], empty without RoPE
  std::vector<FrequencyStats> stats_;
  std::vector<int64_t> next_position_;  // per layer: the position after the last query seen
  std::vector<int64_t> round_;          // per layer: next_position / divide at the last plan
  std::vector<int64_t> context_end_;    // per layer: positions below it are the context
};

}  // namespace

// Registered as `triattention` (methods/method_list.cpp).
MethodInfo triattention_method() {
  MethodInfo info;
  info.name = "triattention";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: at the end of the shared context (context=compress), then every `divide` positions "
      "once over the budget (between rounds the cache grows by up to `divide` tokens)";
  info.summary =
      "per KV head, the keys with the largest expected future attention logit from the "
      "pre-RoPE queries' frequency statistics (mean over offsets 1, 2, 4, ..., offset_max), "
      "max over the GQA group, per layer";
  info.paper =
      "TriAttention: Efficient Long Reasoning with Trigonometric KV Compression (Mao et al., "
      "2026), arXiv 2604.04921";
  info.choices = {
      "defaults are the authors' (WeianMao/triattention): divide 128, offsets 1..65536 "
      "doubling, mean over them, no score normalisation",
      "training-free in-run: the query statistics (complex mean and mean magnitude per RoPE "
      "pair, before RoPE) come from the queries this cache has seen (the context's, then "
      "every later one); the authors calibrate them offline on traces",
      "context=compress (default, as the authors' vLLM runtime, PROTECT_PREFILL false): the "
      "context competes and is compressed at its end, so ratio= means something; "
      "context=pin keeps it whole as the authors' HF scripts (allow_prefill_compression off) "
      "and needs a token budget",
      "heads: per layer and KV head, the max over its GQA group (the authors' "
      "per_layer_perhead_pruning); their scripts' per_head_pruning (one set per KV head "
      "index over all layers) would need every layer at once",
      "a round runs when a forward crosses a multiple of `divide` (a query of many tokens "
      "may cross one in the middle)",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(
      int_param("divide", 128, 1, kMaxTokens, "a compression round every `divide` positions"));
  info.params.push_back(int_param("offset_max", 65536, 1, 1 << 30,
                                  "largest future offset D (D = 1, 2, 4, ... up to it)"));
  info.params.push_back(choice_param(
      "context", "compress", {"compress", "pin"},
      "compress: the shared context competes, compressed at its end; pin: it stays whole"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    if (params.get("context") == "pin" && params.has("ratio")) {
      const std::string ratio = params.get("ratio");
      throw InputError(
          "context=pin keeps the shared context whole: give a token budget, not ratio=" + ratio);
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    TriAttentionConfig config;
    config.budget = budget_from(params);
    config.divide = params.get_int("divide");
    config.offset_max = params.get_int("offset_max");
    config.pin_context = params.get("context") == "pin";
    return std::unique_ptr<TokenPolicy>(new TriAttentionPolicy(config, shape));
  };
  return info;
}

}  // namespace kvbench
