// Expected Attention (kvpress): scores each token by the attention future queries are
// expected to pay it. The context's queries, turned back before RoPE, give per query head a
// mean mu and covariance S; RoPE averaged over the next `future` positions (R, the mean of
// the rotations) carries them to where the next queries will be: mu' = R mu, S' = R S R^T.
// For q ~ N(mu', S'), E[exp(q.k / sqrt(d))] = exp(k.mu' / sqrt(d) + k^T S' k / (2 d)): the
// softmax of that over the context, averaged over the GQA group, times ||v|| is the score;
// the first `sink` tokens are always kept. Applied once to the shared context at
// ContextEnd; later tokens are appended whole.
//
// Authors' settings (kvpress presses/expected_attention_press.py ExpectedAttentionPress,
// 8bb29b9; METHODS-FACTS "Expected Attention"):
// - n_future_positions 512 (positions T .. T+511 for a context of T), n_sink 4 (its
//   queries are left out of the statistics and its tokens kept), use_covariance True,
//   use_vnorm True, epsilon 0: score (s + epsilon) * ||v||.
// - statistics over every query of the prompt past the sinks (the whole prefill), the
//   covariance divided by their count; 1/sqrt(head_dim) as the scale.
// - keep int(T * (1 - ratio)) per KV head by top-k; prefill only.
// Here: the queries come RoPE'd from the forward and are turned back by their positions
// with the model's frequencies (KvShape::rope_inv_freq; RoPE on interleaved pairs, where
// the HF code rotates halves: the same rotation, another channel order). A shape without
// RoPE takes the queries as they are. Sums in double.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"

namespace kvbench {
namespace {

struct ExpectedAttentionConfig {
  Budget budget;
  int64_t future = 512;
  int64_t sink = 4;
  bool covariance = true;
  bool vnorm = true;
  double epsilon = 0;
};

// Turns x[0], x[stride], ... (head_dim entries) by the mean rotation: pair (2i, 2i + 1) by
// [[c_i, -s_i], [s_i, c_i]] as RoPE turns it.
void rotate_pairs(double* x, int64_t stride, const std::vector<double>& c,
                  const std::vector<double>& s) {
  for (size_t i = 0; i < c.size(); ++i) {
    double& x0 = x[(2 * i) * stride];
    double& x1 = x[(2 * i + 1) * stride];
    const double a = x0, b = x1;
    x0 = a * c[i] - b * s[i];
    x1 = a * s[i] + b * c[i];
  }
}

// One layer's query statistics while its context comes in.
struct QueryMoments {
  int64_t count = 0;
  std::vector<double> sum;    // [n_heads, head_dim]
  std::vector<double> outer;  // [n_heads, head_dim, head_dim], upper triangle filled
};

class ExpectedAttentionPolicy : public TokenPolicy {
 public:
  ExpectedAttentionPolicy(const ExpectedAttentionConfig& config, const KvShape& shape)
      : config_(config),
        limits_(config.budget, shape.n_layers),
        inv_freq_(shape.rope_inv_freq),
        moments_(shape.n_layers),
        closed_(shape.n_layers, false) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ExpectedAttentionPolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (closed_[layer]) return;
    const int32_t d = kv.head_dim, n_heads = query.n_heads;
    QueryMoments& m = moments_[layer];
    if (m.sum.empty()) {
      m.sum.assign(static_cast<size_t>(n_heads) * d, 0.0);
      if (config_.covariance) m.outer.assign(static_cast<size_t>(n_heads) * d * d, 0.0);
    }
    const bool rope = inv_freq_.size() == static_cast<size_t>(d / 2);
    std::vector<double> c(d / 2, 1.0), s(d / 2, 0.0), q(d);
    for (int32_t r = 0; r < query.n_queries; ++r) {
      const int32_t position = query.q_positions[r];
      if (position < config_.sink) continue;
      if (rope) {  // the angle back: RoPE by -position
        for (int32_t i = 0; i < d / 2; ++i) {
          const double angle = -static_cast<double>(position) * inv_freq_[i];
          c[i] = std::cos(angle);
          s[i] = std::sin(angle);
        }
      }
      ++m.count;
      for (int32_t h = 0; h < n_heads; ++h) {
        const float* row = query.q + (static_cast<int64_t>(r) * n_heads + h) * d;
        std::copy(row, row + d, q.begin());
        rotate_pairs(q.data(), 1, c, s);
        double* sum = m.sum.data() + static_cast<int64_t>(h) * d;
        for (int32_t a = 0; a < d; ++a) sum[a] += q[a];
        if (!config_.covariance) continue;  // m.outer is empty then
        double* outer = m.outer.data() + static_cast<int64_t>(h) * d * d;
        for (int32_t a = 0; a < d; ++a) {
          for (int32_t b = a; b < d; ++b) outer[a * d + b] += q[a] * q[b];
        }
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd || closed_[layer]) return false;
    closed_[layer] = true;
    const QueryMoments m = std::move(moments_[layer]);
    moments_[layer] = QueryMoments();
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    std::vector<float> scores = score(m, kv);
    plan_top_k_per_head(scores.data(), kv.n_kv_heads, n, limit, plan);
    return true;
  }

  int64_t bytes_resident(int32_t layer) const override {
    return vector_bytes(moments_[layer].sum) + vector_bytes(moments_[layer].outer);
  }
  bool done(int32_t layer) const override { return closed_[layer]; }

 private:
  // Scores [n_kv_heads, n_tokens]; the sinks FLT_MAX.
  std::vector<float> score(const QueryMoments& m, const DenseKv& kv) const {
    const int64_t n = kv.n_tokens;
    const int32_t d = kv.head_dim, n_kv = kv.n_kv_heads;
    const int32_t n_heads = m.sum.empty() ? n_kv : static_cast<int32_t>(m.sum.size() / d);
    const int32_t group = n_heads / n_kv;
    // The mean rotation over the future positions next .. next + future - 1.
    int64_t next = 0;
    for (int32_t h = 0; h < n_kv; ++h) {
      for (int64_t t = 0; t < n; ++t)
        next = std::max<int64_t>(next, kv.positions[h * kv.capacity + t] + 1);
    }
    std::vector<double> c(d / 2, 1.0), s(d / 2, 0.0);
    if (inv_freq_.size() == static_cast<size_t>(d / 2)) {  // future >= 1 (registry range)
      for (int32_t i = 0; i < d / 2; ++i) {
        double cs = 0, sn = 0;
        for (int64_t p = next; p < next + config_.future; ++p) {
          const double angle = static_cast<double>(p) * inv_freq_[i];
          cs += std::cos(angle);
          sn += std::sin(angle);
        }
        c[i] = cs / config_.future;
        s[i] = sn / config_.future;
      }
    }
    // mu' and S' per query head, in float for the per-token products.
    std::vector<float> mean(static_cast<size_t>(n_heads) * d, 0.f);
    std::vector<float> cov(config_.covariance ? static_cast<size_t>(n_heads) * d * d : 0, 0.f);
    if (m.count > 0) {
      std::vector<double> mu(d), sigma(static_cast<size_t>(d) * d);
      for (int32_t h = 0; h < n_heads; ++h) {
        for (int32_t a = 0; a < d; ++a) mu[a] = m.sum[h * d + a] / m.count;
        if (config_.covariance) {
          const double* outer = m.outer.data() + static_cast<int64_t>(h) * d * d;
          for (int32_t a = 0; a < d; ++a) {
            for (int32_t b = a; b < d; ++b) {
              sigma[a * d + b] = sigma[b * d + a] = outer[a * d + b] / m.count - mu[a] * mu[b];
            }
          }
          for (int32_t a = 0; a < d; ++a) rotate_pairs(sigma.data() + a * d, 1, c, s);  // S R^T
          for (int32_t b = 0; b < d; ++b) rotate_pairs(sigma.data() + b, d, c, s);      // R (S R^T)
          std::copy(sigma.begin(), sigma.end(), cov.begin() + static_cast<int64_t>(h) * d * d);
        }
        rotate_pairs(mu.data(), 1, c, s);
        std::copy(mu.begin(), mu.end(), mean.begin() + static_cast<int64_t>(h) * d);
      }
    }
    const float inv_sqrt_d = 1.f / std::sqrt(static_cast<float>(d));
    std::vector<float> scores(static_cast<size_t>(n_kv) * n, 0.f);
    std::vector<double> logits(static_cast<size_t>(n));
    std::vector<float> y(d);
    for (int32_t g = 0; g < n_kv; ++g) {
      const float* k = kv.k + g * kv.capacity * d;
      const int32_t* pos = kv.positions + g * kv.capacity;
      float* out = scores.data() + g * n;
      for (int32_t h = g * group; h < (g + 1) * group; ++h) {
        const float* mu = mean.data() + static_cast<int64_t>(h) * d;
        double top = -DBL_MAX;
        for (int64_t t = 0; t < n; ++t) {
          if (pos[t] < config_.sink) continue;
          const float* kt = k + t * d;
          double logit = 0;
          for (int32_t a = 0; a < d; ++a) logit += static_cast<double>(kt[a]) * mu[a];
          logit *= inv_sqrt_d;
          if (config_.covariance) {  // y = S' k by columns, then k.y
            const float* sigma = cov.data() + static_cast<int64_t>(h) * d * d;
            std::fill(y.begin(), y.end(), 0.f);
            for (int32_t b = 0; b < d; ++b) {
              const float kb = kt[b];
              const float* col = sigma + static_cast<int64_t>(b) * d;  // symmetric
              for (int32_t a = 0; a < d; ++a) y[a] += col[a] * kb;
            }
            double quad = 0;
            for (int32_t a = 0; a < d; ++a) quad += static_cast<double>(kt[a]) * y[a];
            logit += quad / d / 2;
          }
          logits[t] = logit;
          top = std::max(top, logit);
        }
        double z = 0;
        for (int64_t t = 0; t < n; ++t) {
          if (pos[t] >= config_.sink) z += (logits[t] = std::exp(logits[t] - top));
        }
        for (int64_t t = 0; t < n; ++t) {
          if (pos[t] >= config_.sink) out[t] += static_cast<float>(logits[t] / z / group);
        }
      }
      const float* v = kv.v + g * kv.capacity * d;
      for (int64_t t = 0; t < n; ++t) {
        if (pos[t] < config_.sink) {
          out[t] = FLT_MAX;
          continue;
        }
        if (!config_.vnorm) continue;
        double norm = 0;
        for (int32_t a = 0; a < d; ++a) norm += static_cast<double>(v[t * d + a]) * v[t * d + a];
        out[t] = static_cast<float>((out[t] + config_.epsilon) * std::sqrt(norm));
      }
    }
    return scores;
  }

  ExpectedAttentionConfig config_;
  LayerLimits limits_;
  std::vector<float> inv_freq_;  // [head_dim / 2], empty without RoPE
  std::vector<QueryMoments> moments_;
  std::vector<bool> closed_;
};

}  // namespace

// Registered as `expected_attention` (methods/method_list.cpp).
MethodInfo expected_attention_method() {
  MethodInfo info;
  info.name = "expected_attention";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "per KV head, the tokens the next `future` queries are expected to attend to (the "
      "context queries' mean and covariance before RoPE, carried by the mean RoPE of the "
      "future positions), times ||v||; the first `sink` tokens kept";
  info.paper =
      "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries "
      "Distribution (Devoto, Jeblick, Jégou, 2025; NVIDIA kvpress), arXiv 2510.00636";
  info.choices = {
      "defaults are kvpress ExpectedAttentionPress's: future 512, sink 4, covariance on, "
      "vnorm on, epsilon 0",
      "statistics over every context query past the sinks, as kvpress (its prompt's "
      "hidden states), not only the last ones; the queries are turned back before RoPE by "
      "their positions",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(
      int_param("future", 512, 1, 65536,
                "future positions the RoPE is averaged over (at least 1: the statistics are of "
                "un-rotated queries, the keys rotated, so 0 would score nothing meaningful)"));
  info.params.push_back(
      int_param("sink", 4, 0, kMaxTokens,
                "the first `sink` tokens are kept and their queries left out of the statistics"));
  info.params.push_back(choice_param("covariance", "on", {"on", "off"},
                                     "the queries' covariance term in the expected logit"));
  info.params.push_back(
      choice_param("vnorm", "on", {"on", "off"}, "scores times the value norm ||v||"));
  info.params.push_back(
      float_param("epsilon", "0", 0, 1e6, "added to the scores before the ||v|| factor"));
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    ExpectedAttentionConfig config;
    config.budget = budget_from(params);
    config.future = params.get_int("future");
    config.sink = params.get_int("sink");
    config.covariance = params.get("covariance") == "on";
    config.vnorm = params.get("vnorm") == "on";
    config.epsilon = params.get_float("epsilon");
    return std::unique_ptr<TokenPolicy>(new ExpectedAttentionPolicy(config, shape));
  };
  return info;
}

}  // namespace kvbench
