// CaM (Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024;
// zyxxmu/cam fc80e64): a token leaving the cache is not simply dropped: its value is merged
// into the values of the tokens kept after it, with a probability set by its attention.
// Settings (METHODS-FACTS "CaM"):
// - selection: SnapKV's, once, at the end of the shared context (methods/snapkv.h: the last
//   `window` context queries score the prefix, the GQA group's heads averaged, `pool` over
//   `kernel`; the window kept), as KVCache-Factory's prefill port (CAMKVCluster) selects;
//   the authors' own code pairs the merge with StreamingLLM's start + recent cache
//   (generate_task/streaming_llm/kv_cache_cam.py) or an H2O-style mask (cam_hf lm-eval);
// - merge, values only (keys are dropped as evicted): per KV head, each evicted token j
//   with the first `merge` (m = 16, kv_cache_cam.py's slicev) kept tokens after it in
//   position order as receivers R: p = A_j / mean_{r in R} A_r, clamped to [0, 1], with A
//   the attention the window gives (unpooled); with probability p, v_j / |R| is added to
//   each receiver's value.
// Choices where the authors leave room or differ:
// - A is the window's attention, not the streaming code's attention accumulated over every
//   query so far: kvbench merges once, when only the context's queries have been seen.
// - Only evicted tokens give and only kept tokens receive, from the evicted tokens' original
//   values, so the order of merges does not matter. KVCache-Factory's port adds every token
//   after the first ceil(0.1 T) into the next `window` tokens, kept or not, before
//   selecting, so its merges may land on tokens it then drops.
// - sample=bernoulli (default: the authors' torch.bernoulli) draws from a hash of (seed,
//   layer, KV head, position): a run is reproducible for a seed, and forks and clones draw
//   alike whatever order layers are planned in. sample=expected adds p * v_j / |R| (the
//   draw's mean: no sampling noise).
// - |R| < m only when fewer than m tokens are kept after j (merge > window): v_j is split
//   among those.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "methods/snapkv.h"

namespace kvbench {

namespace {

struct CamConfig {
  SnapKvConfig select;
  int64_t merge = 16;     // receivers m of each evicted token
  bool expected = false;  // sample=expected: add p * v_j instead of drawing
  uint64_t seed = 0;
};

// A uniform draw in [0, 1) from (seed, layer, head, position): splitmix64's finaliser.
double uniform_draw(uint64_t seed, int32_t layer, int32_t head, int32_t position) {
  uint64_t x = seed ^ (static_cast<uint64_t>(layer) << 48) ^ (static_cast<uint64_t>(head) << 32) ^
               static_cast<uint32_t>(position);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

class CamPolicy : public WindowedPolicy {
 public:
  CamPolicy(const CamConfig& config, int32_t n_layers)
      : WindowedPolicy(config.select.budget, config.select.window, n_layers), config_(config) {}

  std::unique_ptr<TokenPolicy> clone() const override { return std::make_unique<CamPolicy>(*this); }

 protected:
  bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    const int64_t window = std::min(config_.select.window, limit);
    const std::vector<float> scores = held.kv_head_scores(kv);
    const std::vector<float> ranked =
        snapkv_ranking(scores, kv.n_kv_heads, n, window, config_.select);
    plan_top_k_per_head(ranked.data(), kv.n_kv_heads, n, limit, plan);
    merge_values(layer, kv, scores, plan);
    return true;
  }

 private:
  // Fills plan.k and plan.v: the kept slots' keys as they are, their values plus what the
  // evicted tokens before them give. scores: [n_kv_heads, n_tokens], the window's attention.
  void merge_values(int32_t layer, const DenseKv& kv, const std::vector<float>& scores,
                    RetainPlan& plan) const {
    const int64_t n = kv.n_tokens, n_keep = plan.n_keep;
    const int32_t d = kv.head_dim;
    plan.k.resize(static_cast<size_t>(kv.n_kv_heads * n_keep * d));
    plan.v.resize(plan.k.size());
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::vector<int64_t> row_of(static_cast<size_t>(n));  // slot -> kept row, -1: evicted
    std::vector<int64_t> kept_rows;                       // kept rows in position order
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int32_t* keep = plan.slots.data() + h * n_keep;
      const int32_t* pos = kv.positions + h * kv.capacity;
      const float* a = scores.data() + h * n;
      float* k_out = plan.k.data() + h * n_keep * d;
      float* v_out = plan.v.data() + h * n_keep * d;
      std::fill(row_of.begin(), row_of.end(), -1);
      for (int64_t j = 0; j < n_keep; ++j) {
        row_of[keep[j]] = j;
        std::copy_n(kv.k + (h * kv.capacity + keep[j]) * d, d, k_out + j * d);
        std::copy_n(kv.v + (h * kv.capacity + keep[j]) * d, d, v_out + j * d);
      }
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return pos[x] < pos[y]; });
      kept_rows.clear();
      for (const int32_t slot : order) {
        if (row_of[slot] >= 0) kept_rows.push_back(row_of[slot]);
      }
      // Walking in position order, the receivers of an evicted token are the kept rows
      // from the next one not yet passed.
      size_t next_kept = 0;
      for (const int32_t slot : order) {
        if (row_of[slot] >= 0) {
          ++next_kept;
          continue;
        }
        const size_t n_recv =
            std::min<size_t>(static_cast<size_t>(config_.merge), kept_rows.size() - next_kept);
        if (n_recv == 0) continue;
        double mean = 0;
        for (size_t r = 0; r < n_recv; ++r) mean += a[keep[kept_rows[next_kept + r]]];
        mean /= static_cast<double>(n_recv);
        const double p = mean > 0 ? std::clamp(a[slot] / mean, 0.0, 1.0) : (a[slot] > 0 ? 1 : 0);
        const double weight =
            config_.expected ? p : (uniform_draw(config_.seed, layer, h, pos[slot]) < p ? 1 : 0);
        if (weight == 0) continue;
        const float share = static_cast<float>(weight / static_cast<double>(n_recv));
        const float* v = kv.v + (h * kv.capacity + slot) * d;
        for (size_t r = 0; r < n_recv; ++r) {
          float* out = v_out + kept_rows[next_kept + r] * d;
          for (int32_t c = 0; c < d; ++c) out[c] += share * v[c];
        }
      }
    }
  }

  CamConfig config_;
};

}  // namespace

// Registered as `cam` (methods/method_list.cpp).
MethodInfo cam_method() {
  MethodInfo info;
  info.name = "cam";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context (merges values of what it drops)";
  info.summary =
      "SnapKV's selection; each dropped token's value is added, with probability its "
      "attention over its receivers' mean, to the next `merge` kept tokens' values (1/m each)";
  info.paper =
      "CaM: Cache Merging for Memory-efficient LLMs Inference (Zhang et al., ICML 2024), "
      "openreview LCTmppB165";
  info.choices = {
      "variant: KVCache-Factory's prefill port (SnapKV's selection once, at the end of the "
      "context) with the merge rule of the authors' streaming code (the next m = 16 kept "
      "tokens receive); the authors pair it with a StreamingLLM or H2O-style cache instead",
      "attention A is the window's (summed over the last `window` context queries, GQA group "
      "mean), not accumulated over every query as in the streaming code",
      "only dropped tokens give and only kept tokens receive, so merges do not cascade; "
      "KVCache-Factory's port adds every token after ceil(0.1 T) into the next window tokens, "
      "kept or not, before selecting",
      "sample=bernoulli (default, as the authors) draws from a hash of (seed, layer, KV head, "
      "position): reproducible, and alike in forks and clones; sample=expected adds p v_j / m",
      "keys are not merged (as the authors); merged values keep their own token's position",
  };
  info.params = snapkv_params();
  info.params.push_back(int_param("merge", 16, 1, kMaxTokens,
                                  "kept tokens after a dropped one that share its value (m)"));
  info.params.push_back(choice_param("sample", "bernoulli", {"bernoulli", "expected"},
                                     "bernoulli: merge with probability p (the authors'); "
                                     "expected: merge p times the value"));
  info.params.push_back(int_param("seed", 0, 0, 4294967295.0, "seed of the Bernoulli draws"));
  info.check = check_snapkv_params;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    CamConfig config;
    config.select = snapkv_config_from(params);
    config.merge = params.get_int("merge");
    config.expected = params.get("sample") == "expected";
    config.seed = static_cast<uint64_t>(params.get_int("seed"));
    return std::unique_ptr<TokenPolicy>(new CamPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
