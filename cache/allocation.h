// Stage 2's "how many": an allocation method splits a layer's token budget over its KV heads
// from the scores the eviction method behind it ranks tokens by, and the heads keep their own
// counts (RetainPlan::head_keep), really stored ragged (DenseLayerKv holds each head alone).
// It composes in front of an eviction method that ranks per KV head: `adakv+snapkv:ratio=0.25`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/policy.h"

namespace kvbench {

class HeadAllocation {
 public:
  virtual ~HeadAllocation() = default;
  // Tokens each of the n_kv_heads heads keeps out of n_tokens candidates, n_kv_heads * keep
  // in all at most and each at most n_tokens. scores: head h's candidate t at
  // scores[h * stride + t], higher kept first (the eviction method's own ranking).
  virtual std::vector<int64_t> head_counts(const float* scores, int64_t stride,
                                           int32_t n_kv_heads, int64_t n_tokens,
                                           int64_t keep) const = 0;
};

// Per KV head, the counts[h] slots with the largest score (ties: the lower slot), ascending,
// as a ragged plan. scores: [n_kv_heads, n_tokens]; 0 <= counts[h] <= n_tokens.
void plan_top_k_ragged(const float* scores, int32_t n_kv_heads, int64_t n_tokens,
                       const std::vector<int64_t>& counts, RetainPlan& plan);

// Counts that sum to floor(sum of targets), each the floor of its target or one more: the
// largest remainders get the extra ones (ties: the lower head).
std::vector<int64_t> round_counts(const std::vector<double>& targets);

}  // namespace kvbench
