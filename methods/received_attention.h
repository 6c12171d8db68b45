// The softmax attention each stored slot of one layer has received, summed over every query
// so far and kept per query head: H2O's heavy-hitter scores, which D2O ranks by too. New slots
// start at 0; the slots a retain plan keeps carry theirs along.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/plan_helpers.h"
#include "cache/policy.h"
#include "kernels/layouts.h"

namespace kvbench {

class ReceivedAttention {
 public:
  // A forward's queries over `kv` (which holds their own tokens): their attention added.
  void observe(const AttentionQuery& query, const DenseKv& kv);
  // The same sums computed elsewhere (KvCache::attend_scored, the device): scores is
  // [n_heads, n_tokens].
  void add(const float* scores, int32_t n_heads, int64_t n_tokens);
  // Room for n_tokens slots, the new ones at 0: before ranking a layer of that many.
  void grow(int64_t n_tokens);
  // The store applied `plan`: each kept slot's sums move with it.
  void retained(const RetainPlan& plan, int32_t n_kv_heads);

  // Per KV head, the sums of its query heads (the GQA group): [n_kv_heads, n_tokens()].
  std::vector<float> per_kv_head(int32_t n_kv_heads) const;
  // Query head h's sums, n_tokens() of them.
  const float* head(int32_t h) const { return values_.data() + h * n_tokens_; }
  int32_t n_heads() const { return n_heads_; }
  int64_t n_tokens() const { return n_tokens_; }
  int64_t bytes() const { return vector_bytes(values_); }

 private:
  void start(int32_t n_heads) {
    if (n_heads_ == 0) n_heads_ = n_heads;
  }

  HeldVector<float> values_;  // [n_heads, n_tokens]
  int64_t n_tokens_ = 0;
  int32_t n_heads_ = 0;
};

}  // namespace kvbench
