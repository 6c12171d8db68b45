// The last queries of a layer's shared context and the attention they give each stored
// slot: how SnapKV scores the prefix and KVMerger picks each merge set's pivot.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

// A ring over forward chunks of the last `size` query rows (row order does not matter:
// scores are summed over rows, each row carries its position).
class QueryWindow {
 public:
  explicit QueryWindow(int64_t size = 0) : size_(size) {}

  void observe(const AttentionQuery& query, int32_t head_dim);
  int64_t n_rows() const { return n_rows_; }
  // The held rows as a query (scores only: no output), valid while the window lives.
  AttentionQuery query() const;
  // Softmax attention each slot receives from the held rows (causal by position), the GQA
  // group's query heads averaged per KV head: [kv.n_kv_heads, kv.n_tokens]; zeros when no
  // row is held.
  std::vector<float> kv_head_scores(const DenseKv& kv) const;
  // The same per query head, before the group average (CompressKV picks heads):
  // [n_heads, kv.n_tokens]; empty when no row is held.
  std::vector<float> head_scores(const DenseKv& kv) const;
  // The same per held row, before the sum over rows (CAKE's entropy and variance across
  // the window's rows): [n_rows, n_heads, kv.n_tokens], rows in ring order; empty when no
  // row is held.
  std::vector<float> row_scores(const DenseKv& kv) const;
  int64_t bytes_resident() const;

 private:
  int64_t size_;
  std::vector<float> q_;            // [size, n_heads, head_dim]
  std::vector<int32_t> positions_;  // [size]
  int64_t n_rows_ = 0;              // rows filled, <= size
  int64_t next_ = 0;                // row the next query overwrites
  int32_t n_heads_ = 0;
  float scale_ = 1.f;
};

// One QueryWindow per layer while the shared context comes in; a layer's window is handed
// over once, when the policy compresses that layer at the end of the context, and no more
// queries are kept for it (SnapKV and KVMerger compress once).
class ContextWindows {
 public:
  ContextWindows(int32_t n_layers, int64_t size)
      : windows_(n_layers, QueryWindow(size)), closed_(n_layers, false) {}

  void observe(int32_t layer, const AttentionQuery& query, int32_t head_dim) {
    if (!closed_[layer]) windows_[layer].observe(query, head_dim);
  }
  bool closed(int32_t layer) const { return closed_[layer]; }
  // The layer's window; the layer is closed from now on.
  QueryWindow close(int32_t layer) {
    QueryWindow held = std::move(windows_[layer]);
    windows_[layer] = QueryWindow();
    closed_[layer] = true;
    return held;
  }
  int64_t bytes_resident(int32_t layer) const { return windows_[layer].bytes_resident(); }

 private:
  std::vector<QueryWindow> windows_;
  std::vector<bool> closed_;
};

}  // namespace kvbench
