// StreamingLLM: keep the first `sink` tokens (the attention sinks) and a window of the most
// recent ones; drop everything in between. Position-only, the same tokens in every head and
// layer (mit-han-lab/streaming-llm StartRecentKVCache).
//
// Positions: the paper re-assigns positions inside the cache (keys cached before RoPE,
// "pos shift"). Here RoPE is already in the stored keys, so kept tokens keep their
// original positions, as kvpress's StreamingLLMPress does without KeyRerotationPress.
#include <algorithm>
#include <string>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/prefill_mode.h"
#include "cache/registry.h"
#include "common/input_error.h"

namespace kvbench {
namespace {

class StreamingLlmPolicy : public TokenPolicy {
 public:
  StreamingLlmPolicy(const Budget& budget, int64_t sink, int64_t chunk, int32_t n_layers)
      : limits_(budget, n_layers), sink_(sink), chunk_(chunk) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<StreamingLlmPolicy>(*this);
  }

  // prefill=stream: the context comes in chunks, each followed by a ContextChunk plan.
  int64_t context_block() const override { return chunk_; }

  // Evicts whenever a layer is over its limit: at ContextEnd (after each streamed context
  // chunk too) and after every later forward, so memory stays bounded by the budget plus
  // one forward's tokens.
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    const int64_t limit = limits_.resolve(layer, phase, kv.n_tokens);
    if (limit < 0 || kv.n_tokens <= limit) return false;
    // The sinks are the lowest positions and the window the highest (every head holds the
    // same tokens). A ratio can resolve to a limit at or below `sink`: then the newest
    // token still stays.
    const int64_t n_sink = std::min(sink_, limit - 1);
    const std::vector<int32_t> order = slots_by_position(kv, 0, n_sink, limit - n_sink);
    std::vector<int32_t> keep(order.begin(), order.begin() + n_sink);
    keep.insert(keep.end(), order.end() - (limit - n_sink), order.end());
    std::sort(keep.begin(), keep.end());
    plan_same_slots(keep, kv.n_kv_heads, plan);
    return true;
  }

 private:
  LayerLimits limits_;
  int64_t sink_;
  int64_t chunk_;  // 0: dense prefill
};

}  // namespace

MethodInfo streamingllm_method() {
  MethodInfo info;
  info.name = "streamingllm";
  info.kind = MethodKind::Eviction;
  info.stage = "2: after prefill (or every streamed chunk) and every decode step";
  info.summary = "keeps the first `sink` tokens and the most recent budget - sink tokens";
  info.paper =
      "Efficient Streaming Language Models with Attention Sinks (Xiao et al., ICLR 2024), "
      "arXiv 2309.17453";
  info.choices = {
      "positions: kept tokens keep their original positions (RoPE is in the stored "
      "keys); the paper re-assigns positions inside the cache",
      "prefill=dense by default, as kvpress and SCBench; the original streams, which "
      "prefill=stream,chunk=N runs",
      "evicts after every decode step too, as the authors' rolling cache; kvpress's "
      "StreamingLLMPress compresses the prompt once and then appends, so a long answer "
      "slides kvbench's window off the prompt's end where kvpress's keeps it (docs/methods.md)",
  };
  const ParamInfo sink =
      int_param("sink", 4, 0, kMaxTokens,
                "attention-sink tokens always kept (the first positions); part of the budget");
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(sink);
  for (const ParamInfo& p : prefill_params()) info.params.push_back(p);
  info.check = [](const MethodParams& params) {
    check_budget(params);
    check_prefill(params);
    const Budget budget = budget_from(params);
    const int64_t sink = params.get_int("sink");
    if (!budget.is_ratio() && sink >= budget.tokens) {
      throw InputError("streamingllm: sink=" + std::to_string(sink) +
                       " must be smaller than budget=" + std::to_string(budget.tokens) +
                       " (the budget counts the sinks and the recent window)");
    }
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new StreamingLlmPolicy(budget_from(params), params.get_int("sink"),
                               stream_chunk(params), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
