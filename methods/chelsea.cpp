// Chelsea (Hu, Wang et al., "Efficient Long-Context LLM Inference via KV Cache Clustering",
// 2025, arXiv 2506.11418): keys are alike along the sequence, so the cache is clustered
// locally instead of evicted. At the end of the shared context, per KV head:
// - the prefix (all but the newest `window` tokens) is split into chunks of `chunk`
//   consecutive tokens;
// - Chunked Soft Matching: inside a chunk, tokens alternate between a source set (even
//   places) and a destination set (odd places); each source is matched to the destination
//   whose key is most cosine-similar (bipartite soft matching, as ToMe);
// - the most similar matches over all chunks merge, each source into its destination,
//   and rounds repeat on what is left until the budget holds.
// The authors' code is not public; the paper fixes neither chunk size, merge ratio nor
// weighting (METHODS-FACTS "Chelsea"). kvbench's choices:
// - a merged token is the centroid (plain mean) of every token it absorbed, keys and
//   values: sums and counts carry through rounds, as ToMe's size-weighted average, so a
//   cluster's centroid does not depend on the order it was built in;
// - it keeps the destination's slot and position; keys are merged after RoPE (the stored
//   keys), so a centroid mixes the rotations of its members' positions;
// - the most similar matches are taken over all chunks of a head (ToMe's top-r), not a
//   fixed share per chunk: repetitive stretches merge more, distinct ones stay apart;
// - chunk = 64 by default; when the budget leaves fewer prefix tokens than chunks, the
//   chunk grows to ceil(prefix / kept) so that one token per chunk still fits;
// - the newest `window` (32) tokens are kept whole, as SnapKV and KVMerger keep theirs;
// - merges once, at the end of the context; later tokens are kept whole.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"

namespace kvbench {

namespace {

struct ChelseaConfig {
  Budget budget;
  int64_t window = 32;
  int64_t chunk = 64;
};

// One KV head's prefix, as clusters over its tokens in position order.
class PrefixClusters {
 public:
  // slots: the prefix's slots in position order.
  PrefixClusters(const DenseKv& kv, int32_t head, const std::vector<int32_t>& slots)
      : d_(kv.head_dim),
        n_(static_cast<int64_t>(slots.size())),
        k_sum_(static_cast<size_t>(n_ * d_)),
        v_sum_(k_sum_.size()),
        size_(static_cast<size_t>(n_), 1),
        alive_(static_cast<size_t>(n_), true) {
    for (int64_t i = 0; i < n_; ++i) {
      const float* k = kv.k + (head * kv.capacity + slots[i]) * d_;
      const float* v = kv.v + (head * kv.capacity + slots[i]) * d_;
      std::copy_n(k, d_, k_sum_.begin() + i * d_);
      std::copy_n(v, d_, v_sum_.begin() + i * d_);
    }
  }

  // Merges `n_merges` clusters away, chunk by chunk; needs n - n_merges >= the number of chunks.
  void merge(int64_t n_merges, int64_t chunk) {
    struct Match {
      double similarity;
      int64_t source, destination;
    };
    std::vector<Match> matches;
    std::vector<int64_t> members;
    std::vector<double> norm(static_cast<size_t>(n_));
    while (n_merges > 0) {
      for (int64_t i = 0; i < n_; ++i) {
        if (alive_[i]) norm[i] = std::sqrt(dot(i, i));
      }
      matches.clear();
      for (int64_t start = 0; start < n_; start += chunk) {
        members.clear();
        for (int64_t i = start; i < std::min(n_, start + chunk); ++i) {
          if (alive_[i]) members.push_back(i);
        }
        // Even places are sources, odd places destinations.
        for (size_t s = 0; s + 1 < members.size(); s += 2) {
          Match best{-2, members[s], -1};
          for (size_t t = 1; t < members.size(); t += 2) {
            const double denom = norm[members[s]] * norm[members[t]];
            const double cos = denom > 0 ? dot(members[s], members[t]) / denom : 0;
            if (cos > best.similarity) best = {cos, members[s], members[t]};
          }
          matches.push_back(best);
        }
      }
      assert(!matches.empty());
      const int64_t take = std::min<int64_t>(n_merges, static_cast<int64_t>(matches.size()));
      std::partial_sort(matches.begin(), matches.begin() + take, matches.end(),
                        [](const Match& a, const Match& b) {
                          return a.similarity > b.similarity ||
                                 (a.similarity == b.similarity && a.source < b.source);
                        });
      for (int64_t m = 0; m < take; ++m) absorb(matches[m].destination, matches[m].source);
      n_merges -= take;
    }
  }

  bool alive(int64_t i) const { return alive_[i]; }
  // The centroid of cluster i (alive): key and value.
  void centroid(int64_t i, float* k, float* v) const {
    for (int32_t c = 0; c < d_; ++c) {
      k[c] = static_cast<float>(k_sum_[i * d_ + c] / size_[i]);
      v[c] = static_cast<float>(v_sum_[i * d_ + c] / size_[i]);
    }
  }

 private:
  // Cosine needs only the direction of the key sums, which is the centroids'.
  double dot(int64_t a, int64_t b) const {
    double s = 0;
    for (int32_t c = 0; c < d_; ++c) s += k_sum_[a * d_ + c] * k_sum_[b * d_ + c];
    return s;
  }

  void absorb(int64_t into, int64_t from) {
    for (int32_t c = 0; c < d_; ++c) {
      k_sum_[into * d_ + c] += k_sum_[from * d_ + c];
      v_sum_[into * d_ + c] += v_sum_[from * d_ + c];
    }
    size_[into] += size_[from];
    alive_[from] = false;
  }

  int32_t d_;
  int64_t n_;
  std::vector<double> k_sum_, v_sum_;  // [n, head_dim]: sums over each cluster's tokens
  std::vector<int64_t> size_;          // tokens in each cluster
  std::vector<bool> alive_;            // false once merged into another
};

class ChelseaPolicy : public TokenPolicy {
 public:
  ChelseaPolicy(const ChelseaConfig& config, int32_t n_layers)
      : config_(config), limits_(config.budget, n_layers), closed_(n_layers, false) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ChelseaPolicy>(*this);
  }

  bool done(int32_t layer) const override { return closed_[layer]; }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd || closed_[layer]) return false;
    closed_[layer] = true;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    const int64_t window = std::min(config_.window, limit);
    const int64_t n_prefix = n - window;
    const int64_t keep_prefix = limit - window;
    const int64_t chunk = keep_prefix > 0
                              ? std::max(config_.chunk, (n_prefix + keep_prefix - 1) / keep_prefix)
                              : n_prefix;
    const int32_t d = kv.head_dim;

    plan.n_keep = limit;
    plan.slots.assign(static_cast<size_t>(kv.n_kv_heads * limit), 0);
    plan.k.assign(static_cast<size_t>(kv.n_kv_heads * limit * d), 0.f);
    plan.v.assign(plan.k.size(), 0.f);
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::vector<std::pair<int32_t, int64_t>> kept;  // (slot, prefix index or -1: window)
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int32_t* pos = kv.positions + h * kv.capacity;
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
      const std::vector<int32_t> prefix(order.begin(), order.begin() + n_prefix);
      kept.clear();
      PrefixClusters clusters(kv, h, prefix);
      if (keep_prefix > 0) {
        clusters.merge(n_prefix - keep_prefix, chunk);
        for (int64_t i = 0; i < n_prefix; ++i) {
          if (clusters.alive(i)) kept.emplace_back(prefix[i], i);
        }
      }  // else the budget is the window: nothing of the prefix fits
      for (int64_t i = n_prefix; i < n; ++i) kept.emplace_back(order[i], -1);
      std::sort(kept.begin(), kept.end());
      assert(static_cast<int64_t>(kept.size()) == limit);
      for (int64_t j = 0; j < limit; ++j) {
        const auto [slot, index] = kept[j];
        plan.slots[h * limit + j] = slot;
        float* k_out = plan.k.data() + (h * limit + j) * d;
        float* v_out = plan.v.data() + (h * limit + j) * d;
        if (index >= 0) {
          clusters.centroid(index, k_out, v_out);
        } else {
          std::copy_n(kv.k + (h * kv.capacity + slot) * d, d, k_out);
          std::copy_n(kv.v + (h * kv.capacity + slot) * d, d, v_out);
        }
      }
    }
    return true;
  }

 private:
  ChelseaConfig config_;
  LayerLimits limits_;
  std::vector<bool> closed_;  // per layer: merged once, at the first ContextEnd
};

}  // namespace

// Registered as `chelsea` (methods/method_list.cpp).
MethodInfo chelsea_method() {
  MethodInfo info;
  info.name = "chelsea";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context (merges instead of dropping)";
  info.summary =
      "per KV head, chunks of `chunk` tokens; in each, alternate tokens are matched to their "
      "most key-similar partner and the most similar pairs merge into centroids (K and V) "
      "until the budget holds; keeps the newest `window` tokens";
  info.paper =
      "Efficient Long-Context LLM Inference via KV Cache Clustering (Chelsea; Hu, Wang et "
      "al., 2025), arXiv 2506.11418";
  info.choices = {
      "the authors' code is not public: from the paper; chunk size (64), weighting and "
      "window are kvbench's",
      "a merged token is the centroid (mean) of all tokens it absorbed, keys and values, "
      "counts carried through rounds as ToMe's size-weighted average",
      "it keeps the destination's slot and position; keys are averaged after RoPE",
      "the most similar matches over all chunks of a head merge first (ToMe's top-r), "
      "rounds repeat until the budget holds; a chunk grows when the budget leaves fewer "
      "tokens than chunks",
      "the newest `window` tokens are kept whole; merges once, at the end of the context",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(
      int_param("window", 32, 1, kMaxTokens, "newest context tokens kept unmerged"));
  info.params.push_back(
      int_param("chunk", 64, 2, kMaxTokens, "consecutive tokens inside which keys are matched"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    check_window_in_budget(params);
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    ChelseaConfig config;
    config.budget = budget_from(params);
    config.window = params.get_int("window");
    config.chunk = params.get_int("chunk");
    return std::unique_ptr<TokenPolicy>(new ChelseaPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
