// KVMerger (Wang et al., "Model Tells You Where to Merge: Adaptive KV Cache Merging for
// LLMs on Long-Context Tasks", 2024): keys of neighbouring tokens are often nearly the
// same, so instead of dropping tokens, runs of consecutive similar keys are merged into one.
// At the end of the shared context, per KV head:
// - merge sets: runs of consecutive tokens (in position order) whose neighbouring keys have
//   cosine similarity above `threshold`;
// - pivot: the token of a set the last `window` context queries attend to most;
// - merge: each member's weight is a Gaussian kernel of its key's distance to the pivot's,
//   exp(-|k_i - k_p|^2 / (2 sigma^2)) with sigma^2 the set's mean squared distance to the
//   pivot; keys and values become the weighted means, at the pivot's slot and position.
// Choices where the paper leaves room:
// - The budget caps the tokens kept (window included): when the threshold leaves more sets
//   than the budget, the least similar neighbours stay apart and the most similar ones merge
//   even below the threshold. Every KV head keeps the same count (the store's layout), the
//   largest any head needs, so a head may split a few runs above the threshold.
// - The newest `window` tokens (the queries' own) are kept as they are, as SnapKV keeps its
//   window.
// - Merges once, at the end of the context; later tokens are kept whole.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "cache/registry.h"
#include "cache/windowed_policy.h"
#include "kernels/cpu/merge.h"

namespace kvbench {

namespace {

struct KvMergerConfig {
  Budget budget;
  double threshold = 0.75;
  int64_t window = 32;
};

class KvMergerPolicy : public WindowedPolicy {
 public:
  KvMergerPolicy(const KvMergerConfig& config, int32_t n_layers)
      : WindowedPolicy(config.budget, config.window, n_layers), config_(config) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<KvMergerPolicy>(*this);
  }

 protected:
  bool select(int32_t /*layer*/, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    const int64_t window = std::min(config_.window, limit);
    const int64_t n_prefix = n - window;      // tokens that may merge, oldest first
    const int64_t max_sets = limit - window;  // merge sets the budget leaves them
    const int32_t n_kv = kv.n_kv_heads;
    const int32_t d = kv.head_dim;

    std::vector<int32_t> order(static_cast<size_t>(n_kv * n));
    for (int32_t h = 0; h < n_kv; ++h) {
      int32_t* row = order.data() + h * n;
      const int32_t* pos = kv.positions + h * kv.capacity;
      std::iota(row, row + n, 0);
      std::sort(row, row + n, [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
    }
    std::vector<float> similarity(static_cast<size_t>(n_kv * n));
    adjacent_key_cosine_cpu(kv, order.data(), similarity.data());

    // Sets per head: as the threshold cuts them, capped by the budget; then one count for
    // every head.
    int64_t n_sets = 0;
    for (int32_t h = 0; h < n_kv; ++h) {
      const float* sim = similarity.data() + h * n;
      const int64_t cuts = std::count_if(sim, sim + std::max<int64_t>(0, n_prefix - 1),
                                         [&](float s) { return s <= config_.threshold; });
      n_sets = std::max(n_sets, std::min(max_sets, cuts + 1));
    }
    if (n_prefix == 0) n_sets = 0;

    const std::vector<float> scores = held.kv_head_scores(kv);
    plan.n_keep = n_sets + window;
    plan.slots.assign(static_cast<size_t>(n_kv * plan.n_keep), 0);
    plan.k.assign(static_cast<size_t>(n_kv * plan.n_keep * d), 0.f);
    plan.v.assign(plan.k.size(), 0.f);
    std::vector<int64_t> cut_at;
    std::vector<int32_t> kept;  // slots: each set's pivot, then the window
    for (int32_t h = 0; h < n_kv; ++h) {
      const int32_t* row = order.data() + h * n;
      const float* sim = similarity.data() + h * n;
      // The n_sets - 1 least similar neighbour pairs of the prefix separate the sets.
      cut_at.resize(std::max<int64_t>(0, n_prefix - 1));
      std::iota(cut_at.begin(), cut_at.end(), 0);
      const int64_t n_cuts = std::max<int64_t>(0, n_sets - 1);
      std::nth_element(
          cut_at.begin(), cut_at.begin() + n_cuts, cut_at.end(),
          [&](int64_t a, int64_t b) { return sim[a] < sim[b] || (sim[a] == sim[b] && a < b); });
      cut_at.resize(n_cuts);
      std::sort(cut_at.begin(), cut_at.end());
      kept.clear();
      int64_t start = 0;
      for (int64_t c = 0; c <= n_cuts && n_sets > 0; ++c) {
        const int64_t end = c < n_cuts ? cut_at[c] + 1 : n_prefix;  // set = row[start, end)
        kept.push_back(merge_set(kv, h, row + start, end - start, scores.data() + h * n));
        start = end;
      }
      kept.insert(kept.end(), row + n_prefix, row + n);
      std::sort(kept.begin(), kept.end());
      // New contents: a merged set's, else the token's own.
      for (int64_t j = 0; j < plan.n_keep; ++j) {
        const int32_t slot = kept[j];
        plan.slots[h * plan.n_keep + j] = slot;
        const auto it = merged_.find(slot);
        const float* k_src =
            it != merged_.end() ? it->second.data() : kv.k + (h * kv.capacity + slot) * d;
        const float* v_src =
            it != merged_.end() ? it->second.data() + d : kv.v + (h * kv.capacity + slot) * d;
        std::copy_n(k_src, d, plan.k.data() + (h * plan.n_keep + j) * d);
        std::copy_n(v_src, d, plan.v.data() + (h * plan.n_keep + j) * d);
      }
      merged_.clear();
    }
    return true;
  }

 private:
  // Merges one set (slots in position order) toward its pivot; returns the pivot's slot and
  // leaves the merged key and value in merged_ (sets of one token are left as they are).
  int32_t merge_set(const DenseKv& kv, int32_t h, const int32_t* slots, int64_t size,
                    const float* scores) {
    int64_t p = 0;
    for (int64_t i = 1; i < size; ++i) {
      if (scores[slots[i]] > scores[slots[p]]) p = i;
    }
    const int32_t pivot = slots[p];
    if (size == 1) return pivot;
    const int32_t d = kv.head_dim;
    const auto key = [&](int64_t i) { return kv.k + (h * kv.capacity + slots[i]) * d; };
    std::vector<double> dist(static_cast<size_t>(size));
    double mean = 0;
    for (int64_t i = 0; i < size; ++i) {
      double s = 0;
      for (int32_t c = 0; c < d; ++c) {
        const double x = key(i)[c] - key(p)[c];
        s += x * x;
      }
      dist[i] = s;
      mean += s / (size - 1);  // the pivot's own distance is 0
    }
    std::vector<double> acc(static_cast<size_t>(2 * d), 0.0);
    double total = 0;
    for (int64_t i = 0; i < size; ++i) {
      const double w = mean > 0 ? std::exp(-dist[i] / (2 * mean)) : 1.0;
      const float* v = kv.v + (h * kv.capacity + slots[i]) * d;
      for (int32_t c = 0; c < d; ++c) {
        acc[c] += w * key(i)[c];
        acc[d + c] += w * v[c];
      }
      total += w;
    }
    std::vector<float>& out = merged_[pivot];
    out.resize(static_cast<size_t>(2 * d));
    for (int32_t c = 0; c < 2 * d; ++c) out[c] = static_cast<float>(acc[c] / total);
    return pivot;
  }

  KvMergerConfig config_;
  std::map<int32_t, std::vector<float>> merged_;  // scratch of one head: pivot -> k then v
};

}  // namespace

// Registered as `kvmerger` (methods/method_list.cpp).
MethodInfo kvmerger_method() {
  MethodInfo info;
  info.name = "kvmerger";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context (merges instead of dropping)";
  info.summary =
      "merges runs of consecutive similar keys into their most attended token with Gaussian "
      "weights; keeps the newest `window` tokens";
  info.paper =
      "Model Tells You Where to Merge: Adaptive KV Cache Merging for LLMs on Long-Context "
      "Tasks (Wang et al., 2024), arXiv 2407.08454";
  info.choices = {
      "the authors' code is not public: from the paper; the budget caps the tokens "
      "kept, and every KV head keeps the same count (the largest any head needs)",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(float_param("threshold", "0.75", -1, 1,
                                    "cosine similarity above which neighbouring keys merge"));
  info.params.push_back(int_param(
      "window", 32, 1, kMaxTokens, "newest context tokens kept unmerged; their queries pick pivots"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    check_window_in_budget(params);
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    KvMergerConfig config;
    config.budget = budget_from(params);
    config.threshold = params.get_float("threshold");
    config.window = params.get_int("window");
    return std::unique_ptr<TokenPolicy>(new KvMergerPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
