// The narrow stores: every kept token's keys and values in fp16 or bf16, as the engines
// users run hold their caches (vLLM, SGLang, llama.cpp, transformers), or in fp8 e4m3 with a
// scale per token and KV head. The engines' baseline: a 16-bit cache is what a method saves
// memory against (the report's default reference).
//
// Rows are rounded when they are appended (kernels/cpu/narrow.h) and attention converts
// each key tile as it reads it (attention_narrow_cpu): nothing is widened whole. As
// llama.cpp's F16 cache, the context attends over the rounded rows too (KIVI's prefill
// reads fp32 instead). Composes after any eviction method (snapkv:ratio=0.25+bf16): a
// policy scores the rounded values, widened into a buffer held until settle().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"

namespace kvbench {

class NarrowLayerKv : public LayerKv {
 public:
  NarrowLayerKv(int32_t n_kv_heads, int32_t head_dim, KvElement element);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;
  void settle() override { drop_view(); }
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return n_tokens_; }
  int64_t bytes_resident() const override;
  std::unique_ptr<LayerKv> head_store(int32_t head) const override;

  NarrowKv layout() const;
  int64_t capacity() const { return capacity_; }

 private:
  void reallocate(int64_t new_capacity);
  // Moves row `from` of KV head h to row `to` (key, value, their scales, position).
  void move_row(int32_t h, int64_t from, int64_t to);
  void drop_view() const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  KvElement element_;
  int64_t row_bytes_;  // element bytes of one token's keys (or values) in one KV head
  int64_t capacity_ = 0;
  int64_t n_tokens_ = 0;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack

  std::vector<uint8_t> k_, v_;            // [n_kv_heads, capacity, row_bytes]
  std::vector<float> k_scale_, v_scale_;  // [n_kv_heads, capacity], fp8 only
  std::vector<int32_t> positions_;        // [n_kv_heads, capacity]

  // The rows widened to fp32 for a policy ([n_kv_heads, n_tokens, head_dim]), until settle().
  mutable bool view_ready_ = false;
  mutable std::vector<float> view_k_, view_v_;
  mutable std::vector<int32_t> view_positions_;
};

// A narrow store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_narrow_layers(const KvShape& shape,
                                                         KvElement element);

}  // namespace kvbench
