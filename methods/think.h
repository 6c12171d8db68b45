// ThinK (Xu et al., "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025,
// arXiv 2407.21018; code SalesforceAIResearch/ThinK, ThinK_flash/src/kv_pruning_utils.py
// key_pruner_query_driven, and kvpress presses/think_press.py ThinKPress): prunes key
// *channels*, not tokens. When the context ends, each KV head scores every channel c by the
// query-key interaction over the observation window,
//     score_c = mean over the last `window` queries (and the GQA group) of q_c^2
//             * mean over the held keys of k_c^2
// (the paper's ||Q[:, c]|| ||K[:, c]||, squared: the same ranking), and the
// floor(channels * head_dim) lowest channels are pruned.
//
// Unlike kvpress, which zeroes the pruned channels and so saves nothing, the store holds only
// the kept channels of each key ([n_kv_heads, capacity, n_kept] fp32; values whole), so the
// memory is really saved. Attention reads those channels and scatters them into zeroed rows
// of each key tile (attention_decoded_cpu): bit for bit the dense kernel over keys whose
// pruned channels are zero, which is what the authors' code and kvpress compute.
//
// The store sees the window queries itself (LayerKv::observe_queries, every forward's queries
// after they attended), so it composes behind an eviction method that plans first at the
// end of the context (snapkv:ratio=0.5+think: the channels are chosen on the keys SnapKV
// kept, as the authors' update_thinkv does after its SnapKV selection).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"

namespace kvbench {

struct ThinkConfig {
  double channels = 0.4;  // fraction of key channels pruned (authors' default ratio)
  int64_t window = 32;    // context queries that score the channels
};

class ThinkLayerKv : public LayerKv {
 public:
  ThinkLayerKv(int32_t n_kv_heads, int32_t head_dim, const ThinkConfig& config);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void observe_queries(const AttentionQuery& query) override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;
  void settle() override;
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return pruned_ ? n_tokens_ : rows_.n_tokens; }
  int64_t bytes_resident() const override;

  bool pruned() const { return pruned_; }
  int32_t n_kept() const { return n_kept_; }
  // KV head h's kept key channels, ascending (empty until the context has ended).
  std::vector<int32_t> kept_channels(int32_t h) const;

 private:
  void prune();  // the store's first settle: the context has ended
  void reallocate(int64_t new_capacity);

  int32_t n_kv_heads_;
  int32_t head_dim_;
  int32_t n_kept_;
  int64_t window_;
  bool pruned_ = false;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack

  // Until the context ends: fp32 rows whole, and the last `window` query rows seen.
  HeadRows rows_;
  std::vector<float> window_q_;  // [window_rows_, n_heads_, head_dim], oldest first
  int64_t window_rows_ = 0;
  int32_t n_heads_ = 0;

  // After: each key's kept channels, values whole.
  std::vector<int32_t> channels_;   // [n_kv_heads, n_kept]
  std::vector<float> keys_;         // [n_kv_heads, capacity_, n_kept]
  std::vector<float> values_;       // [n_kv_heads, capacity_, head_dim]
  std::vector<int32_t> positions_;  // [n_kv_heads, capacity_]
  int64_t capacity_ = 0;
  int64_t n_tokens_ = 0;

  mutable std::vector<float> view_k_;  // keys widened for a policy, until the next change
};

}  // namespace kvbench
