// ShotKV: the context is compressed by whole segments ("shots": a few-shot example, a
// record), never a part of one, and the tokens after the context get a token-level
// compression of their own.
// - Prefill: each segment's score is the softmax attention the last `window` context
//   queries give its tokens (summed over the window's rows, the query heads and the KV
//   heads), divided by its length. Segments are kept whole in that order while they fit the
//   budget; one that does not fit is skipped and later, smaller ones may still fill the
//   room. The window is always kept; a segment the window cuts competes with its prefix part
//   only. One token set for every KV head of a layer (a shot is kept or dropped whole).
//   Segments are cut from the context's token texts (TokenPolicy::context_text, told by
//   the harness): a segment ends after a run of tokens holding a line break (`split=line`),
//   or also a comma or semicolon (`split=item`: the items of a list or JSON object, e.g.
//   retr_kv's key-value pairs, which sit on one line). Without the texts every token is its
//   own segment.
// - After the context: once more than `decode_budget` tokens past the context are held,
//   each KV head drops the ones the newest query attends to least (summed over its query
//   heads), the newest token always kept; the context's tokens are not touched.
//
// Authors' settings (ShotKV, arXiv 2502.01941, "Can LLMs Maintain Fundamental Abilities
// under KV Cache Compression?"; no public code, METHODS-FACTS "ShotKV"): shot-level
// retention at prefill, a separate dynamic token-level compression of generated tokens;
// the shot score formula, the shot boundaries and the budget split are not given there.
// Here all of those are kvbench's: the score above, line-break (or item) segments, SnapKV's
// window (32), `decode_budget` 1024 tokens scored by the newest query (TOVA's rule).
#include <algorithm>
#include <cfloat>
#include <numeric>
#include <string>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/query_window.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

// Where the context's segments start (context positions, the first 0): after each run of
// tokens holding one of `ends`.
std::vector<int64_t> segment_starts(const std::vector<std::string>& token_texts,
                                    const std::string& ends) {
  std::vector<int64_t> starts = {0};
  bool after_end = false;
  for (size_t i = 0; i < token_texts.size(); ++i) {
    const bool is_end = token_texts[i].find_first_of(ends) != std::string::npos;
    if (after_end && !is_end) starts.push_back(static_cast<int64_t>(i));
    after_end = is_end;
  }
  return starts;
}

// Marks the slots of the prefix (the first n_prefix, in position order) that ShotKV keeps:
// whole segments by mean score, while they fit in `room`.
std::vector<char> keep_whole_segments(const std::vector<float>& token_score,
                                      const int32_t* positions, int64_t n_prefix, int64_t room,
                                      const std::vector<int64_t>& starts) {
  // Segment of each prefix slot: by its position among the starts (none: its own).
  std::vector<int64_t> segment(static_cast<size_t>(n_prefix));
  for (int64_t t = 0; t < n_prefix; ++t) {
    segment[t] = starts.empty() ? t
                                : std::upper_bound(starts.begin(), starts.end(), positions[t]) -
                                      starts.begin() - 1;
  }
  const int64_t n_segments = starts.empty() ? n_prefix : static_cast<int64_t>(starts.size());
  std::vector<double> sum(static_cast<size_t>(n_segments), 0.0);
  std::vector<int64_t> length(static_cast<size_t>(n_segments), 0);
  for (int64_t t = 0; t < n_prefix; ++t) {
    sum[segment[t]] += token_score[t];
    ++length[segment[t]];
  }
  std::vector<int64_t> order;
  for (int64_t s = 0; s < n_segments; ++s) {
    if (length[s] > 0) order.push_back(s);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return sum[a] / length[a] > sum[b] / length[b]; });
  std::vector<char> kept_segment(static_cast<size_t>(n_segments), 0);
  for (int64_t s : order) {
    if (length[s] > room) continue;
    kept_segment[s] = 1;
    room -= length[s];
  }
  std::vector<char> kept(static_cast<size_t>(n_prefix));
  for (int64_t t = 0; t < n_prefix; ++t) kept[t] = kept_segment[segment[t]];
  return kept;
}

class ShotKvPolicy : public TokenPolicy {
 public:
  ShotKvPolicy(const Budget& budget, int64_t window, int64_t decode_budget,
               const std::string& segment_ends, int32_t n_layers)
      : segment_ends_(segment_ends),
        limits_(budget, n_layers),
        window_(window),
        decode_budget_(decode_budget),
        windows_(n_layers, window),
        context_end_(n_layers, 0),
        newest_scores_(n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ShotKvPolicy>(*this);
  }

  void context_text(const std::vector<std::string>& token_texts) override {
    starts_ = segment_starts(token_texts, segment_ends_);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (!windows_.closed(layer)) {
      windows_.observe(layer, query, kv.head_dim);
      return;
    }
    // After the context: what the newest query gives each slot, per KV head.
    std::vector<float> heads(static_cast<size_t>(query.n_heads * kv.n_tokens), 0.f);
    attention_scores_cpu(last_query_row(query, kv.head_dim), kv, heads.data());
    std::vector<float>& scores = newest_scores_[layer];
    scores.assign(static_cast<size_t>(kv.n_kv_heads * kv.n_tokens), 0.f);
    const int32_t group = query.n_heads / kv.n_kv_heads;
    for (int32_t h = 0; h < query.n_heads; ++h) {
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        scores[(h / group) * kv.n_tokens + t] += heads[h * kv.n_tokens + t];
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (!windows_.closed(layer)) {
      return phase == CachePhase::ContextEnd && plan_shots(layer, kv, phase, plan);
    }
    return phase == CachePhase::AfterContext && plan_decode(layer, kv, plan);
  }

  int64_t bytes_resident(int32_t layer) const override {
    return windows_.bytes_resident(layer) + vector_bytes(newest_scores_[layer]);
  }
  bool done(int32_t layer) const override { return windows_.closed(layer) && decode_budget_ == 0; }

 private:
  bool plan_shots(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) {
    const QueryWindow held = windows_.close(layer);
    const int64_t n = kv.n_tokens;
    for (int64_t t = 0; t < n; ++t) {
      context_end_[layer] = std::max<int64_t>(context_end_[layer], kv.positions[t] + 1);
    }
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    // A context never evicted before ContextEnd holds its slots in position order: the
    // window's own tokens are the last `window` slots.
    const int64_t window = std::min(window_, limit);
    const int64_t n_prefix = n - window;
    const std::vector<float> scores = held.kv_head_scores(kv);
    std::vector<float> token_score(static_cast<size_t>(n_prefix), 0.f);
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      for (int64_t t = 0; t < n_prefix; ++t) token_score[t] += scores[h * n + t];
    }
    const std::vector<char> kept =
        keep_whole_segments(token_score, kv.positions, n_prefix, limit - window, starts_);
    std::vector<float> ranked(static_cast<size_t>(n), 2.f);  // the window
    for (int64_t t = 0; t < n_prefix; ++t) ranked[t] = kept[t] ? 1.f : 0.f;
    const int64_t n_keep = std::count(kept.begin(), kept.end(), 1) + window;
    plan_top_k_same(ranked.data(), n, n_keep, kv.n_kv_heads, plan);
    return true;
  }

  bool plan_decode(int32_t layer, const DenseKv& kv, RetainPlan& plan) {
    const int64_t n = kv.n_tokens;
    const std::vector<float>& scores = newest_scores_[layer];
    if (decode_budget_ == 0 || static_cast<int64_t>(scores.size()) != kv.n_kv_heads * n) {
      return false;
    }
    const int32_t* positions = kv.positions;
    int64_t n_after = 0, newest = -1;
    for (int64_t t = 0; t < n; ++t) {
      n_after += positions[t] >= context_end_[layer];
      newest = std::max<int64_t>(newest, positions[t]);
    }
    if (n_after <= decode_budget_) return false;
    std::vector<float> ranked(scores);
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int32_t* pos = kv.positions + h * kv.capacity;
      for (int64_t t = 0; t < n; ++t) {
        if (pos[t] < context_end_[layer] || pos[t] == newest) ranked[h * n + t] = FLT_MAX;
      }
    }
    plan_top_k_per_head(ranked.data(), kv.n_kv_heads, n, n - (n_after - decode_budget_), plan);
    return true;
  }

  std::string segment_ends_;  // characters a segment ends after
  LayerLimits limits_;
  int64_t window_;
  int64_t decode_budget_;
  ContextWindows windows_;
  std::vector<int64_t> starts_;       // segment starts, context positions
  std::vector<int64_t> context_end_;  // per layer: one past the context's last position
  std::vector<std::vector<float>> newest_scores_;  // per layer: [n_kv_heads, n_tokens]
};

}  // namespace

// Registered as `shotkv` (methods/method_list.cpp).
MethodInfo shotkv_method() {
  MethodInfo info;
  info.name = "shotkv";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: once, at the end of the shared context, whole line-break segments; after it, the "
      "tokens past the context beyond `decode_budget`, by the newest query's attention";
  info.summary =
      "per layer, whole context segments (cut after line breaks) by their mean window "
      "attention while they fit, plus the window; tokens after the context capped at "
      "`decode_budget` per KV head";
  info.paper =
      "Can LLMs Maintain Fundamental Abilities under KV Cache Compression? (ShotKV, 2025), "
      "arXiv 2502.01941";
  info.choices = {
      "no public code: shots are the context's segments, cut after every run of tokens holding "
      "a line break (split=line) or also a comma or semicolon (split=item), from the "
      "context's token texts the harness tells the policy (TokenPolicy::context_text); a "
      "shot's score is "
      "the attention of the last `window` (32) context queries summed over its tokens, the "
      "query and KV heads, divided by its length",
      "shots are kept whole in score order while they fit; one that does not fit is skipped "
      "and smaller later ones may fill the room (the budget may be left partly unused); one "
      "set for every KV head of a layer",
      "after the context a separate `decode_budget` (1024, kvbench's choice) caps the tokens "
      "past the context per KV head, dropping those the newest query attends to least "
      "(TOVA's rule); the paper's decode rule and budget split are unconfirmed",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param(
      "window", 32, 1, kMaxTokens,
      "observation window: the last context queries whose attention scores the shots; kept"));
  info.params.push_back(int_param("decode_budget", 1024, 0, kMaxTokens,
                                  "tokens past the context kept per KV head (0: all)"));
  info.params.push_back(choice_param(
      "split", "line", {"line", "item"},
      "where a segment ends: after line breaks (line), or also after commas and semicolons "
      "(item: list or JSON items on one line)"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    check_window_in_budget(params);
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new ShotKvPolicy(
        budget_from(params), params.get_int("window"), params.get_int("decode_budget"),
        params.get("split") == "item" ? "\n,;" : "\n", shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
