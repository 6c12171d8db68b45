// A layer whose KV heads hold their own counts (head-wise budgets: after a ragged RetainPlan
// each head is stored apart, sized to its count) shown to a policy as one DenseKv: the heads
// copied into DenseKv's layout ([n_kv_heads, capacity, head_dim], capacity the largest
// count), each head's rows past its own count padded (keys and values 0, position
// kPaddingPosition) and DenseKv::head_tokens set. Built only for a policy that reads such
// layers (TokenPolicy::reads_ragged_heads: one that evicts at every step under adakv+),
// since it copies the layer; the others see the shape alone.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

class RaggedView {
 public:
  RaggedView() = default;
  // A copy starts empty: a view belongs to the layer that gathered it, and a cloned layer
  // (a fork of the shared prefill) gathers its own.
  RaggedView(const RaggedView&) {}
  RaggedView& operator=(const RaggedView&) {
    clear();
    return *this;
  }

  // heads[h]: KV head h alone (n_kv_heads 1, host memory), as its store shows it. The view
  // lives until the next gather or clear.
  DenseKv gather(const std::vector<DenseKv>& heads);
  void clear();

 private:
  std::vector<float> k_, v_;
  std::vector<int32_t> positions_;
  std::vector<int64_t> counts_;
};

}  // namespace kvbench
