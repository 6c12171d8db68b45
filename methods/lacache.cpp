// LaCache: a "ladder" over layers, position-only. Each layer holds `budget` tokens: the
// first `sink` tokens, a laddered region, and the newest tokens. In the ladder the older
// tokens are cut into segments of P_b; every layer keeps P_a consecutive tokens of each,
// starting at an offset that steps with the layer (layer mod (P_b - P_a + 1)), so a segment
// is covered by different layers at different offsets and the stack of layers spans a
// longer history than any one layer holds. Whenever the cache is over budget (after the
// context, after every later forward) the cursor that ends the laddered region moves on
// over the newest tokens; once it would reach the last n_layers tokens it "starts over":
// the already-laddered region is laddered again with longer segments (iterative
// compaction), so the oldest history thins out the most.
//
// Authors' settings (GATECH-EIC/LaCache 0f27c33, LongBench/lacache/kv_cache.py
// LaCache.__call__, LongBench/pred.py greedy_generate; arXiv 2507.14204):
// - P_b = 1 + ceil((n_layers - span) / (span - overlap)), P_a = min(ceil(span /
//   (span - overlap)), P_b); span 16, overlap 0 (README also span 9 overlap 3, 8/4, 9/7).
// - cache_size = budget * max_length; start_size = min(128, n - n_layers - 1, cache_size -
//   n_layers - 1); the cursor starts at start_size; the newest n_layers tokens are never
//   laddered. Start-over `times` rounds in one call: segments of P_b + (times - 1)(P_b - 1)
//   from start_size, each layer's P_a picks `times` apart.
// - full prefill, then compress after it and after every decode step; keys are cached
//   before RoPE and re-rotated by cache slot (pos-shift, lacache/llama_patch.py).
// Here (each a `choices` line): the budget is a hard cap, so the authors' one-time
// "compensation" (cache_size += floor((P_b - P_a) / 2), to match the average size) is not
// added; where the ladder has no room or cannot drop anything (span >= n_layers leaves
// P_b = P_a and the authors' code divides by zero; budget <= n_layers + P_a), the layer
// keeps `sink` + recent as StreamingLLM; start_size = min(sink, budget - n_layers - P_a)
// (the authors' formula for P_a = 1, where theirs otherwise divides by zero). Where the
// authors' start-over would pick a token twice or drop the newest tokens (several rounds at
// once: P_a > 1, whose `times`-apart picks run into the next segment, or a context many
// times the budget, whose segments run past the end), the layer offset wraps inside the
// segment and the last segment drops only what is still needed. Checked against a
// transcription of their index arithmetic: the same tokens in every other case tried.
#include <algorithm>
#include <string>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "methods/lacache.h"

namespace kvbench {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// The ladder's segment sizes for a model depth.
struct Ladder {
  int64_t before = 1;  // P_b: tokens in a segment
  int64_t after = 1;   // P_a: tokens each layer keeps of a segment
  int64_t reduce() const { return before - after; }
};

Ladder make_ladder(int32_t n_layers, int64_t span, int64_t overlap) {
  const int64_t step = span - overlap;
  Ladder ladder;
  ladder.before = 1 + ceil_div(n_layers - span, step);
  ladder.after = std::min(ceil_div(span, step), ladder.before);
  return ladder;
}

// Segments of the ladder: `count` of `before` tokens from `first`, each layer keeping
// `after` of each from its offset, `stride` apart; then, where a shortened last segment is
// needed, one of `last_before` tokens keeping `after` consecutive ones.
struct Segments {
  int64_t first = 0, count = 0, before = 1, after = 1, stride = 1, offset = 0;
  int64_t last_before = 0, last_offset = 0;  // last_before 0: no shortened segment
  int64_t end() const { return first + before * count + last_before; }
};

// Layer picks of `n` tokens (indices in position order, ascending): [0, first), the
// segments' picks, then everything after them.
std::vector<int64_t> ladder_picks(int64_t n, const Segments& s) {
  std::vector<int64_t> picks;
  for (int64_t t = 0; t < s.first; ++t) picks.push_back(t);
  for (int64_t j = 0; j < s.count; ++j) {
    for (int64_t k = 0; k < s.after; ++k) {
      picks.push_back(s.first + s.offset + s.before * j + s.stride * k);
    }
  }
  if (s.last_before > 0) {
    for (int64_t k = 0; k < s.after; ++k) {
      picks.push_back(s.first + s.before * s.count + s.last_offset + k);
    }
  }
  for (int64_t t = s.end(); t < n; ++t) picks.push_back(t);
  return picks;
}

}  // namespace

LacacheStep lacache_step(int64_t n, int64_t cache_size, int64_t start, int64_t cursor,
                         int32_t layer, int32_t n_layers, int64_t span, int64_t overlap) {
  const Ladder ladder = make_ladder(n_layers, span, overlap);
  const int64_t before = ladder.before, after = ladder.after, reduce = ladder.reduce();
  const int64_t to_drop = n - cache_size;
  const int64_t room = std::max<int64_t>(0, cache_size - cursor - n_layers);
  const int64_t droppable = (room / after) * reduce;
  LacacheStep step;
  Segments pass;
  pass.first = cursor;
  pass.before = before;
  pass.after = after;
  pass.offset = layer % (reduce + 1);
  if (to_drop <= droppable) {
    pass.count = ceil_div(to_drop, reduce);
    step.keep = ladder_picks(n, pass);
    step.cursor = cursor + pass.count * after;
    return step;
  }
  // Ladder what room is left, then start over from `start` on the result.
  pass.count = room / after;
  const std::vector<int64_t> first = ladder_picks(n, pass);
  const int64_t n_first = static_cast<int64_t>(first.size());
  const int64_t per_round = ((cache_size - start - n_layers) / after) * reduce;
  const int64_t left = to_drop - droppable;
  const int64_t times = ceil_div(left, per_round);
  Segments again;
  again.first = start;
  again.before = before + (times - 1) * (before - 1);
  again.after = after;
  again.stride = times;
  const int64_t reduce_s = again.before - after;
  again.count = ceil_div(left, reduce_s);
  // Offsets from which `after` picks `times` apart stay inside a segment (times = 1 or
  // P_a = 1: the authors' layer mod (reduce_s + 1)).
  again.offset = layer % (times * reduce + 1);
  if (again.end() >= n_first) {
    // The whole segments would reach the newest token (many rounds at once: the authors'
    // code then drops the newest tokens): the last one drops only what is still needed.
    again.count -= 1;
    const int64_t still = left - again.count * reduce_s;
    again.last_before = after + still;
    again.last_offset = layer % (still + 1);
  }
  const std::vector<int64_t> second = ladder_picks(n_first, again);
  step.keep.reserve(second.size());
  for (int64_t i : second) step.keep.push_back(first[i]);
  step.cursor = start + (again.count + (again.last_before > 0 ? 1 : 0)) * after;
  return step;
}

namespace {

class LacachePolicy : public TokenPolicy {
 public:
  LacachePolicy(const Budget& budget, int64_t sink, int64_t span, int64_t overlap,
                int32_t n_layers)
      : limits_(budget, n_layers), sink_(sink), span_(span), overlap_(overlap),
        n_layers_(n_layers), ladder_(make_ladder(n_layers, span, overlap)),
        start_(n_layers, -1), cursor_(n_layers, 0) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<LacachePolicy>(*this);
  }

  // After the context and after every later forward, whenever the layer is over budget.
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase == CachePhase::ContextChunk) return false;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    if (limit < 0 || n <= limit) return false;
    // Every head holds the same tokens: head 0's slots in position order.
    std::vector<int32_t> slots(static_cast<size_t>(n));
    for (int32_t s = 0; s < n; ++s) slots[s] = s;
    std::sort(slots.begin(), slots.end(),
              [&](int32_t a, int32_t b) { return kv.positions[a] < kv.positions[b]; });
    std::vector<int32_t> keep;
    if (start_[layer] < 0) {
      start_[layer] = std::min(sink_, limit - n_layers_ - ladder_.after);
      cursor_[layer] = start_[layer];
    }
    if (ladder_.reduce() < 1 || start_[layer] < 1) {
      // No ladder fits: the sinks and the newest tokens, as StreamingLLM.
      const int64_t n_sink = std::min(sink_, limit - 1);
      keep.assign(slots.begin(), slots.begin() + n_sink);
      keep.insert(keep.end(), slots.end() - (limit - n_sink), slots.end());
    } else {
      const LacacheStep step = lacache_step(n, limit, start_[layer], cursor_[layer], layer,
                                            n_layers_, span_, overlap_);
      for (int64_t i : step.keep) keep.push_back(slots[i]);
      cursor_[layer] = step.cursor;
    }
    std::sort(keep.begin(), keep.end());
    plan_same_slots(keep, kv.n_kv_heads, plan);
    return true;
  }

 private:
  LayerLimits limits_;
  int64_t sink_, span_, overlap_;
  int32_t n_layers_;
  Ladder ladder_;
  // Per layer (all layers move alike; kept apart so each plans alone): the sinks' count,
  // -1 until the first compaction, and the end of the laddered region in position order.
  std::vector<int64_t> start_, cursor_;
};

}  // namespace

// Registered as `lacache` (methods/method_list.cpp).
MethodInfo lacache_method() {
  MethodInfo info;
  info.name = "lacache";
  info.kind = MethodKind::Eviction;
  info.stage = "2: after prefill and every later forward (iterative compaction)";
  info.summary =
      "per layer `budget` tokens: the first `sink`, a ladder where each layer keeps a "
      "different band of every older segment (shifted layer by layer), and the newest";
  info.paper =
      "LaCache: Ladder-Shaped KV Caching for Efficient Long-Context Modeling of Large "
      "Language Models (Shi et al., ICML 2025), arXiv 2507.14204";
  info.choices = {
      "the budget is a hard cap: the authors' one-time compensation (cache size + "
      "floor((P_b - P_a) / 2), to match the average) is not added",
      "sinks = min(sink, budget - n_layers - P_a), the authors' start_size for P_a = 1 "
      "(128 there); where no ladder fits (budget <= n_layers + P_a, or span >= n_layers so "
      "that no layer may drop a token; the authors' code divides by zero) a layer keeps "
      "sink + recent as StreamingLLM",
      "where the authors' start-over would repeat a token or drop the newest (several "
      "rounds at once with P_a > 1, or a context many times the budget), the picks stay "
      "inside their segment and the last segment drops only what is still needed",
      "positions: kept tokens keep their original positions (RoPE is in the stored keys); "
      "the authors cache keys before RoPE and re-assign positions (pos-shift)",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("sink", 128, 1, kMaxTokens,
                                  "initial tokens kept (the authors' start_size); part of "
                                  "the budget, lowered to leave the ladder room"));
  info.params.push_back(int_param("span", 16, 1, kMaxTokens,
                                  "layers one ladder rung covers (with overlap: P_b, P_a)"));
  info.params.push_back(
      int_param("overlap", 0, 0, kMaxTokens, "layers shared by consecutive rungs (< span)"));
  info.check = [](const MethodParams& params) {
    check_budget(params);
    const int64_t span = params.get_int("span"), overlap = params.get_int("overlap");
    if (overlap >= span) {
      throw InputError("lacache: overlap=" + std::to_string(overlap) +
                       " must be smaller than span=" + std::to_string(span));
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new LacachePolicy(budget_from(params), params.get_int("sink"), params.get_int("span"),
                          params.get_int("overlap"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
