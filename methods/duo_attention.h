// DuoAttention's policy (methods/duo_attention.cpp), declared for the tests that check which
// positions each KV head holds once the heads hold their own counts (the store's view is
// then the shape alone, so the policy follows the positions itself).
#pragma once

#include <cstdint>
#include <vector>

#include "cache/budget.h"
#include "cache/policy.h"

namespace kvbench {

class DuoAttentionPolicy : public TokenPolicy {
 public:
  // head_retrieval: KvShape::head_retrieval, [n_layers * n_kv_heads], not empty.
  DuoAttentionPolicy(Budget budget, int64_t sink, int64_t recent, int32_t n_layers,
                     int32_t n_kv_heads, std::vector<float> head_retrieval);

  std::unique_ptr<TokenPolicy> clone() const override;
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override;
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override;
  void retained(int32_t layer, const RetainPlan& plan) override;
  int64_t bytes_resident(int32_t layer) const override;

  // Whether KV head `head` of `layer` is a streaming head (decided at the end of the context;
  // false before).
  bool streaming(int32_t layer, int32_t head) const;
  // The positions held in each slot of the head, once its layer holds ragged heads; empty
  // before (the store's view shows them then).
  const std::vector<int32_t>& held_positions(int32_t layer, int32_t head) const;

 private:
  void split(int64_t n_context);  // which heads stream, and their sink and recent

  Budget budget_;
  int64_t sink_, recent_;  // as configured; sink_kept_ and recent_kept_ fit them in the budget
  int32_t n_layers_, n_kv_heads_;
  std::vector<float> head_retrieval_;
  bool split_ = false;
  std::vector<char> streaming_;  // [n_layers * n_kv_heads]
  int64_t sink_kept_ = 0, recent_kept_ = 0;
  std::vector<char> ragged_;                          // [n_layers]: positions followed here
  std::vector<std::vector<std::vector<int32_t>>> held_;  // [layer][head][slot] position
};

}  // namespace kvbench
