// SCOPE: the prefill and the decode get separate budgets. At the end of the context SnapKV's
// selection compresses it to `budget` (or `ratio` of it) and that part is frozen: nothing
// after it ever evicts a context token. Every token after the context (kvbench's decode:
// generated tokens, and in multi-turn runs the later questions and teacher-forced answers)
// goes to a decode part with its own budget, kept per KV head as the newest `recent` tokens
// plus the decode tokens the current query attends to most:
// - slide: the decode part holds `decode_window` tokens: recent + the top
//   decode_window - recent of the older decode tokens;
// - adaptive: the decode part holds recent + floor(s / delta) tokens after s decode tokens
//   (it starts at the recent window and grows by one every `delta` tokens);
// - discontinuous: adaptive's size, but the decode part is only cut back on every
//   (delta + 1)-th forward that finds it over its size; in between it grows.
//
// Authors' settings (Linking-ai/SCOPE 8cbae48, model/kv_utils.py SnapKVCluster
// update_kv_in_decoding, init_snapkv): decoding_window_size 1024, decoding_recent_size 256,
// delta 15; SnapKV prefill with window 32, kernel 5, avgpool (kvbench's snapkv defaults).
// Where kvbench departs:
// - scores are the current (last) query row's softmax attention, the GQA group's query heads
//   averaged per KV head (SnapKV's kvbench port); the authors score per query head.
// - the authors' step counter counts decode forwards (one token each); here adaptive counts
//   tokens after the context, and discontinuous counts forwards that find the decode part
//   over size, per layer (the authors' counter is shared by the layers, which advance in
//   lockstep, so it is the same).
// - which tokens are "prefill" is decided by position (before the end of the context); the
//   authors take the first max_capacity_prompt slots, the same once the prompt is compressed.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <string>

#include "cache/plan_helpers.h"
#include "common/input_error.h"
#include "kernels/cpu/scores.h"
#include "methods/snapkv.h"

namespace kvbench {
namespace {

enum class DecodeMode { Slide, Adaptive, Discontinuous };

struct ScopeConfig {
  SnapKvConfig prefill;
  DecodeMode mode = DecodeMode::Slide;
  int64_t decode_window = 1024;
  int64_t recent = 256;
  int64_t delta = 15;
};

class ScopePolicy : public TokenPolicy {
 public:
  ScopePolicy(const ScopeConfig& config, const KvShape& shape)
      : config_(config),
        prefill_(config.prefill, shape.n_layers),
        n_kv_heads_(shape.n_kv_heads),
        layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ScopePolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    LayerState& s = layers_[layer];
    if (s.context_end == kOpen) {
      prefill_.observe(layer, query, kv);
      return;
    }
    // The current query's attention, taken only when this forward leaves the decode part
    // over its size (plan follows with the same tokens).
    s.scores.clear();
    const AttentionQuery last = last_query_row(query, kv.head_dim);
    const int64_t seen = static_cast<int64_t>(last.q_positions[0]) + 1 - s.context_end;
    if (kv.n_tokens - s.n_frozen <= decode_size(seen)) return;
    std::vector<float> per_head(static_cast<size_t>(query.n_heads) * kv.n_tokens, 0.f);
    attention_scores_cpu(last, kv, per_head.data());
    s.scores.assign(static_cast<size_t>(n_kv_heads_) * kv.n_tokens, 0.f);
    const int32_t group = std::max(1, query.n_heads / n_kv_heads_);
    for (int32_t h = 0; h < query.n_heads; ++h) {
      float* out = s.scores.data() + (h / group) * kv.n_tokens;
      const float* in = per_head.data() + static_cast<int64_t>(h) * kv.n_tokens;
      for (int64_t t = 0; t < kv.n_tokens; ++t) out[t] += in[t] / static_cast<float>(group);
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    LayerState& s = layers_[layer];
    if (s.context_end == kOpen) {
      // The context is in: SnapKV compresses it (or keeps it whole) and it is frozen.
      int32_t end = 0;
      for (int64_t t = 0; t < kv.n_tokens; ++t) end = std::max(end, kv.positions[t] + 1);
      s.context_end = end;
      const bool evicts = prefill_.plan(layer, kv, phase, plan);
      s.n_frozen = evicts ? plan.n_keep : kv.n_tokens;
      return evicts;
    }
    return plan_decode(s, kv, plan);
  }

  void retained(int32_t layer, const RetainPlan& /*plan*/) override {
    layers_[layer].scores.clear();  // used by this plan only
  }

  int64_t bytes_resident(int32_t layer) const override {
    return prefill_.bytes_resident(layer) + vector_bytes(layers_[layer].scores);
  }

 private:
  static constexpr int32_t kOpen = INT32_MIN;  // context_end until the context has ended

  struct LayerState {
    int32_t context_end = kOpen;  // positions below it are the (frozen) context
    int64_t n_frozen = 0;         // context tokens kept, per KV head
    int64_t n_skipped = 0;        // discontinuous: over-size forwards left uncut
    std::vector<float> scores;    // [n_kv_heads, n_tokens]: the current query's attention
  };

  // The size the decode part is cut back to once `seen` tokens came after the context.
  int64_t decode_size(int64_t seen) const {
    if (config_.mode == DecodeMode::Slide) return config_.decode_window;
    return config_.recent + std::max<int64_t>(0, seen - 1) / config_.delta;
  }

  bool plan_decode(LayerState& s, const DenseKv& kv, RetainPlan& plan) {
    const int64_t n = kv.n_tokens;
    const int64_t n_decode = n - s.n_frozen;
    int32_t newest = s.context_end - 1;
    for (int64_t t = 0; t < n; ++t) newest = std::max(newest, kv.positions[t]);
    const int64_t size = decode_size(newest + 1 - static_cast<int64_t>(s.context_end));
    if (n_decode <= size) return false;
    if (config_.mode == DecodeMode::Discontinuous && s.n_skipped < config_.delta) {
      ++s.n_skipped;
      return false;
    }
    s.n_skipped = 0;
    // Frozen context and the newest `recent` ranked above any score; the rest of the
    // decode part by the current query's attention (by position if none was taken).
    const int64_t n_recent = std::min(config_.recent, size);
    std::vector<float> ranked(static_cast<size_t>(n_kv_heads_) * n);
    const bool scored = static_cast<int64_t>(s.scores.size()) == n_kv_heads_ * n;
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      const int32_t* pos = kv.positions + static_cast<int64_t>(g) * kv.capacity;
      float* row = ranked.data() + static_cast<int64_t>(g) * n;
      for (int64_t t = 0; t < n; ++t) {
        row[t] = pos[t] < s.context_end ? FLT_MAX
                 : scored               ? s.scores[g * n + t]
                                        : static_cast<float>(pos[t] - s.context_end) / n;
      }
      const std::vector<int32_t> order = slots_by_position(kv, g, 0, n_recent);
      for (int64_t i = n - n_recent; i < n; ++i) row[order[i]] = FLT_MAX;
    }
    plan_top_k_per_head(ranked.data(), n_kv_heads_, n, s.n_frozen + size, plan);
    return true;
  }

  ScopeConfig config_;
  SnapKvPolicy prefill_;
  int32_t n_kv_heads_;
  std::vector<LayerState> layers_;
};

}  // namespace

// Registered as `scope` (methods/method_list.cpp).
MethodInfo scope_method() {
  MethodInfo info;
  info.name = "scope";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: SnapKV once at the end of the shared context (then frozen); after every later "
      "forward the tokens after the context are cut to their own decode budget";
  info.summary =
      "SnapKV's context selection frozen at `budget`; tokens after the context held apart: "
      "the newest `recent` + the top of the rest by the current query's attention, per KV head";
  info.paper =
      "SCOPE: Optimizing Key-Value Cache Compression in Long-context Generation (Wu et al., "
      "ACL 2025), arXiv 2412.13649";
  info.choices = {
      "decode part = every token after the shared context: generated tokens and, in "
      "multi-turn runs, later questions and teacher-forced answers; budget/ratio is the "
      "context's budget only, the decode part adds up to decode_window (slide)",
      "prefill part: SnapKV as kvbench's snapkv (window 32, avg-pool 5, GQA group mean), "
      "the settings SCOPE's init_snapkv uses",
      "decode scores: the current query row's attention, GQA group averaged per KV head; "
      "the authors rank per query head over repeated KV",
      "adaptive grows by one token per `delta` tokens after the context; discontinuous cuts "
      "on every (delta+1)-th over-size forward per layer (the authors count decode steps)",
  };
  info.params = snapkv_params();
  info.params.push_back(choice_param("mode", "slide", {"slide", "adaptive", "discontinuous"},
                                     "decode budget: fixed window, growing, or growing and "
                                     "cut only every delta+1 forwards"));
  info.params.push_back(int_param("decode_window", 1024, 2, kMaxTokens,
                                  "slide: tokens after the context kept (recent included)"));
  info.params.push_back(int_param("recent", 256, 1, kMaxTokens,
                                  "newest tokens after the context always kept"));
  info.params.push_back(int_param("delta", 15, 1, kMaxTokens,
                                  "adaptive/discontinuous: decode tokens per extra kept token"));
  info.check = [](const MethodParams& params) {
    check_snapkv_params(params);
    const int64_t window = params.get_int("decode_window"), recent = params.get_int("recent");
    if (window <= recent) {
      throw InputError("decode_window=" + std::to_string(window) + " must exceed recent=" +
                       std::to_string(recent) + " (SCOPE keeps the top decode_window - recent)");
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    ScopeConfig config;
    config.prefill = snapkv_config_from(params);
    const std::string mode = params.get("mode");
    config.mode = mode == "adaptive"        ? DecodeMode::Adaptive
                  : mode == "discontinuous" ? DecodeMode::Discontinuous
                                            : DecodeMode::Slide;
    config.decode_window = params.get_int("decode_window");
    config.recent = params.get_int("recent");
    config.delta = params.get_int("delta");
    return std::unique_ptr<TokenPolicy>(new ScopePolicy(config, shape));
  };
  return info;
}

}  // namespace kvbench
