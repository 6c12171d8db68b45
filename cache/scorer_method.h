// The short path to a method, as kvpress's ScorerPress: a function that scores every stored
// token of a layer per KV head once the shared context is in. kvbench does the rest, as for
// its own methods: the budget (budget= tokens or ratio=), the observation window and sink
// kept whole, GQA (the scores are per KV head, what the cache stores), the retain plan,
// per-head allocation in front (adakv+<name>), a storage method behind (<name>+kivi), the
// shared prefill, the host wrapping on --device cuda, and the bytes. Knorm in this form:
// examples/plugin_method/knorm_scorer.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "kernels/layouts.h"

namespace kvbench {

struct ScorerInput {
  int32_t layer = 0;
  int32_t n_layers = 0;
  // The layer's whole context: keys (RoPE applied), values and positions of kv.n_tokens slots
  // per KV head, in position order.
  const DenseKv* kv = nullptr;
  // The method's parameters: its own, and budget, ratio, window and sink.
  const MethodParams* params = nullptr;
  // The observation window's queries (the last `window` context rows, RoPE applied; no
  // output): n_queries 0 when the window is 0.
  AttentionQuery window_queries{};
  // Where ScorerMethod::window_attention asks: the softmax attention those queries give each
  // slot, averaged over each KV head's query heads, [kv.n_kv_heads, kv.n_tokens]; else null.
  const float* window_attention = nullptr;
};

// Fills scores[h * kv.n_tokens + t] for every KV head h and slot t, higher kept first (a NaN
// counts as the lowest score), and returns true; or returns false to keep the layer whole.
using TokenScorer = std::function<bool(const ScorerInput& input, float* scores)>;

struct ScorerMethod {
  std::string name;  // lower-case letters, digits and '_'
  std::string summary;
  std::string paper;
  std::vector<std::string> choices;  // where it departs from its authors' code
  std::vector<ParamInfo> params;     // its own; budget, ratio, window and sink are added
  int64_t window = 0;  // default of `window`: the last context queries handed to the scorer,
                       // whose own tokens are always kept (SnapKV's 32; 0: none)
  bool window_attention = false;  // hand the scorer the window's attention too
  TokenScorer score;
  // Checks the method's own parameters when a spec is resolved, before any work (each given
  // value is already in its ParamInfo's range): throw InputError for a combination it
  // cannot run. Optional; budget and window are checked by kvbench.
  std::function<void(const MethodParams& params)> check;
};

// The method's MethodInfo: an eviction method that compresses each layer once, at the end
// of the shared context, keeping per KV head the `sink` first and `window` last tokens and
// the best-scored rest up to the budget (tokens after the context are appended whole).
MethodInfo scorer_method(ScorerMethod method);

}  // namespace kvbench
