// UNComp: a KV head whose keys spread over few directions (low matrix entropy: little
// uncertainty) loses little when compressed hard. At the end of the context each KV head's
// keys get their truncated matrix entropy (methods/uncomp.h: key_entropy), a layer's is the
// sum over its heads; layers are ranked into `layer_groups` groups by it and heads within a
// layer into `head_groups`, and lower-entropy groups keep fewer tokens, the average over
// layers and over each layer's heads staying at the budget. Which tokens each head keeps is
// SnapKV's selection (methods/snapkv.h): the top of the window's attention, plus the window.
// Each head really holds its own count (RetainPlan::head_keep).
//
// Authors' settings (menik1126/UNComp b3e9f7b; the paper, arXiv 2410.03090):
// - entropy (uncomp/utils/entropy_utils.py): states centred over the tokens, rows
//   L2-normalized, A = Z^T Z / n per head, eigenvalues of A / trace(A), -sum l log l over the
//   top k (svd32 in their head search), divided by log(head_dim) (a constant: ranks the same).
// - heads (uncomp_utils.py, method `uncomp`): two groups of heads from an offline search
//   (head_type_search_2 over samples, by query-state entropy of tokens the last query
//   attends to), kept at capacities C*3/4 and C*3/2 (1 : 2) of the per-layer capacity C;
//   layers: `uncomp_stage` groups layers as well, same rule (its group sizes per model).
// - selection inside a head: SnapKV's window scores (window 8 in their scripts, avg-pool 5).
// Here the grouping is computed per context from its keys at ContextEnd, not searched
// offline (no per-model search files), and the groups' weights are spread around the mean
// so the budget holds on average (their two groups average 1.125 C). spread=1/3 gives their
// 1 : 2. Not implemented: their hidden-state pruning at prefill (a prefill speed-up).
#include "methods/uncomp.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/input_error.h"
#include "methods/snapkv.h"

namespace kvbench {

namespace {

// Eigenvalues of a symmetric [dim, dim] matrix by cyclic Jacobi rotations (64 x 64 converges
// in a few sweeps; double precision).
std::vector<double> symmetric_eigenvalues(std::vector<double> a, int32_t dim) {
  const auto at = [&a, dim](int32_t i, int32_t j) -> double& { return a[i * dim + j]; };
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, diag = 0;
    for (int32_t i = 0; i < dim; ++i) {
      diag += at(i, i) * at(i, i);
      for (int32_t j = i + 1; j < dim; ++j) off += at(i, j) * at(i, j);
    }
    if (off <= 1e-24 * std::max(diag, 1e-300)) break;
    for (int32_t p = 0; p < dim; ++p) {
      for (int32_t q = p + 1; q < dim; ++q) {
        const double apq = at(p, q);
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (at(q, q) - at(p, p)) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int32_t k = 0; k < dim; ++k) {  // columns p, q
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = c * akp - s * akq;
          at(k, q) = s * akp + c * akq;
        }
        for (int32_t k = 0; k < dim; ++k) {  // rows p, q
          const double apk = at(p, k), aqk = at(q, k);
          at(p, k) = c * apk - s * aqk;
          at(q, k) = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> values(static_cast<size_t>(dim));
  for (int32_t i = 0; i < dim; ++i) values[i] = at(i, i);
  return values;
}

}  // namespace

double spectral_entropy(std::vector<double> gram, int32_t dim, int32_t top_k) {
  double trace = 0;
  for (int32_t i = 0; i < dim; ++i) trace += gram[i * dim + i];
  if (!(trace > 0)) return 0;
  std::vector<double> values = symmetric_eigenvalues(std::move(gram), dim);
  std::sort(values.begin(), values.end(), std::greater<double>());
  const int32_t k = top_k > 0 ? std::min(top_k, dim) : dim;
  double entropy = 0;
  for (int32_t i = 0; i < k; ++i) {
    const double l = values[i] / trace;
    if (l > 0) entropy -= l * std::log(l);  // rounding can leave tiny negatives: 0 log 0
  }
  return entropy;
}

double key_entropy(const float* keys, int64_t n_tokens, int64_t stride, int32_t head_dim,
                   int32_t top_k) {
  if (n_tokens <= 0) return 0;
  std::vector<double> mean(static_cast<size_t>(head_dim), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int32_t d = 0; d < head_dim; ++d) mean[d] += keys[t * stride + d];
  }
  for (double& m : mean) m /= static_cast<double>(n_tokens);
  std::vector<double> gram(static_cast<size_t>(head_dim * head_dim), 0.0);
  std::vector<double> z(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < n_tokens; ++t) {
    double norm = 0;
    for (int32_t d = 0; d < head_dim; ++d) {
      z[d] = keys[t * stride + d] - mean[d];
      norm += z[d] * z[d];
    }
    if (!(norm > 0)) continue;  // a key at the mean has no direction
    norm = std::sqrt(norm);
    for (double& x : z) x /= norm;
    for (int32_t i = 0; i < head_dim; ++i) {
      for (int32_t j = i; j < head_dim; ++j) gram[i * head_dim + j] += z[i] * z[j];
    }
  }
  for (int32_t i = 0; i < head_dim; ++i) {
    for (int32_t j = i; j < head_dim; ++j) {
      gram[i * head_dim + j] /= static_cast<double>(n_tokens);
      gram[j * head_dim + i] = gram[i * head_dim + j];
    }
  }
  return spectral_entropy(std::move(gram), head_dim, top_k);
}

std::vector<int64_t> entropy_counts(const std::vector<double>& entropy, int64_t total,
                                    int64_t cap, int32_t groups, double spread) {
  const size_t n = entropy.size();
  if (n == 0) return {};
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&entropy](size_t a, size_t b) { return entropy[a] < entropy[b]; });
  const int64_t g_count = std::clamp<int64_t>(groups, 1, static_cast<int64_t>(n));
  std::vector<double> weight(n, 1.0);
  if (g_count > 1) {
    for (size_t r = 0; r < n; ++r) {
      const int64_t g = static_cast<int64_t>(r) * g_count / static_cast<int64_t>(n);
      weight[order[r]] = 1 - spread + 2 * spread * static_cast<double>(g) / (g_count - 1);
    }
  }
  // Proportional shares; a unit over the cap is held at it and the rest re-split.
  std::vector<double> target(n, 0.0);
  std::vector<bool> capped(n, false);
  double remaining = static_cast<double>(std::min<int64_t>(total, cap * static_cast<int64_t>(n)));
  for (bool newly_capped = true; newly_capped;) {
    newly_capped = false;
    double weights = 0;
    for (size_t i = 0; i < n; ++i) weights += capped[i] ? 0 : weight[i];
    for (size_t i = 0; i < n; ++i) {
      if (capped[i]) continue;
      target[i] = weights > 0 ? remaining * weight[i] / weights : 0;
      if (target[i] > static_cast<double>(cap)) {  // stays over: the others' shares only grow
        capped[i] = newly_capped = true;
        target[i] = static_cast<double>(cap);
        remaining -= static_cast<double>(cap);
      }
    }
  }
  // Largest remainder to the integer total (ties: the lower unit); the shares' sum may miss
  // it by a rounding error, so the total is counted, not summed from the shares.
  const int64_t whole = std::min<int64_t>(total, cap * static_cast<int64_t>(n));
  std::vector<int64_t> counts(n);
  int64_t extra = whole;
  for (size_t i = 0; i < n; ++i) {
    counts[i] = std::clamp<int64_t>(static_cast<int64_t>(std::floor(target[i] + 1e-9)), 0, cap);
    extra -= counts[i];
  }
  std::vector<size_t> by_remainder(n);
  std::iota(by_remainder.begin(), by_remainder.end(), 0);
  std::stable_sort(by_remainder.begin(), by_remainder.end(), [&](size_t a, size_t b) {
    return target[a] - counts[a] > target[b] - counts[b];
  });
  for (size_t j = 0; j < n && extra > 0; ++j) {
    if (counts[by_remainder[j]] < cap) {
      ++counts[by_remainder[j]];
      --extra;
    }
  }
  return counts;
}

namespace {

struct UncompConfig {
  SnapKvConfig snap;  // budget, window, pooling
  int32_t layer_groups = 2, head_groups = 2, top_k = 32;
  double spread = 1.0 / 3;
};

class UncompPolicy : public WindowedPolicy {
 public:
  UncompPolicy(const UncompConfig& config, int32_t n_layers)
      : WindowedPolicy(config.snap.budget, config.snap.window, n_layers),
        config_(config),
        head_entropy_(n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<UncompPolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (closed(layer)) return;
    WindowedPolicy::observe(layer, query, kv);
    // The context so far (the last forward before ContextEnd has all of it).
    std::vector<double>& entropy = head_entropy_[layer];
    entropy.assign(static_cast<size_t>(kv.n_kv_heads), 0.0);
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      entropy[h] = key_entropy(kv.k + h * kv.capacity * kv.head_dim, kv.n_tokens, kv.head_dim,
                               kv.head_dim, config_.top_k);
    }
  }

 protected:
  bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    const int64_t window = std::min(config_.snap.window, limit);
    const int64_t n_prefix = n - window;
    if (layer_keep_.empty()) {
      // Every layer's keys are in by now (ContextEnd follows the whole context).
      std::vector<double> layer_entropy;
      for (const std::vector<double>& heads : head_entropy_) {
        layer_entropy.push_back(std::accumulate(heads.begin(), heads.end(), 0.0));
      }
      const int64_t n_layers = static_cast<int64_t>(head_entropy_.size());
      layer_keep_ = entropy_counts(layer_entropy, (limit - window) * n_layers, n_prefix,
                                   config_.layer_groups, config_.spread);
    }
    std::vector<double> entropy = head_entropy_[layer];
    entropy.resize(static_cast<size_t>(kv.n_kv_heads), 0.0);
    std::vector<int64_t> keep =
        entropy_counts(entropy, std::min(layer_keep_[layer], n_prefix) * kv.n_kv_heads,
                       n_prefix, config_.head_groups, config_.spread);
    if (std::all_of(keep.begin(), keep.end(), [n_prefix](int64_t k) { return k == n_prefix; })) {
      return false;
    }
    const std::vector<float> ranked =
        snapkv_ranking(held.kv_head_scores(kv), kv.n_kv_heads, n, window, config_.snap);
    for (int64_t& k : keep) k += window;
    plan_top_k_ragged(ranked.data(), kv.n_kv_heads, n, keep, plan);
    return true;
  }

 private:
  UncompConfig config_;
  std::vector<std::vector<double>> head_entropy_;  // [layer][KV head], latest forward's
  std::vector<int64_t> layer_keep_;                // prefix tokens per layer, set once
};

}  // namespace

// Registered as `uncomp` (methods/method_list.cpp).
MethodInfo uncomp_method() {
  MethodInfo info;
  info.name = "uncomp";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "layers and KV heads grouped by the matrix entropy of their keys, lower-entropy groups "
      "keeping fewer tokens (averaging `budget`); SnapKV's selection inside each head";
  info.paper =
      "UNComp: Can Matrix Entropy Uncover Sparsity? -- A Compressor Design from an "
      "Uncertainty-Aware Perspective (Xiong et al.), arXiv 2410.03090";
  info.choices = {
      "head and layer groups from the keys' truncated matrix entropy of this context, at "
      "ContextEnd; the authors search head groups offline (query states, svd32) per model",
      "group weights 1 - spread .. 1 + spread around the mean, so the budget holds on average; "
      "spread=1/3 is the authors' 1 : 2 between two head groups (theirs average 1.125 C)",
      "layer groups (the authors' uncomp_stage) use the same rule and spread as heads; "
      "layer_groups=1 keeps layers even, as their default `uncomp`",
      "SnapKV's selection at kvbench's defaults (window 32, avg-pool 5); their scripts run "
      "window 8. No hidden-state pruning at prefill (their prefill speed-up)",
      "each head really holds its own count, on the CPU or the GPU, in the fp32 store or "
      "behind a storage method that holds heads apart (fp16, bf16, fp8, kivi)",
  };
  info.params = snapkv_params();
  info.params.push_back(int_param("layer_groups", 2, 1, 1024,
                                  "groups of layers by entropy (1: every layer the budget)"));
  info.params.push_back(int_param("head_groups", 2, 1, 1024,
                                  "groups of a layer's KV heads by entropy (1: even heads)"));
  info.params.push_back(float_param("spread", "0.333333", 0, 1,
                                    "lowest group's weight 1 - spread, highest 1 + spread"));
  info.params.push_back(int_param("top_k", 32, 0, 4096,
                                  "eigenvalues the truncated entropy sums (0: all)"));
  info.check = check_snapkv_params;
  info.ragged_heads = true;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    UncompConfig config;
    config.snap = snapkv_config_from(params);
    config.layer_groups = static_cast<int32_t>(params.get_int("layer_groups"));
    config.head_groups = static_cast<int32_t>(params.get_int("head_groups"));
    config.spread = params.get_float("spread");
    config.top_k = static_cast<int32_t>(params.get_int("top_k"));
    return std::unique_ptr<TokenPolicy>(new UncompPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
