// Heads of their own for a store that is not the fp32 one: a layer whose KV heads keep
// different numbers of tokens (head-wise budgets, RetainPlan::head_keep) in the narrow
// stores (fp16, bf16, fp8) or KIVI's. Until the first ragged plan the wrapped store holds
// the layer as usual; that plan splits it into one-head stores of the same kind
// (LayerKv::head_store: each head's codes, scales and positions as they were, nothing
// rounded or quantized again), and from then on every head applies its own row of each
// plan, packs its own blocks and is sized to its own count. Bytes are the sum over heads,
// so a head that keeps little holds little, as DenseLayerKv's heads do.
//
// Attention runs head by head: KV head h's query heads are gathered from the chunk into a
// query of their own and attended by h's store with its own kernel (the narrow or KIVI
// kernel), then scattered back. The gather copies n_queries x n_heads x head_dim floats,
// nothing next to the attention itself. The gathers run where the rows live (RowMemory): host
// memory, or device memory for the device stores (cache/cuda/row_memory.h). The stores it
// wraps take no queries (observe_queries), so none are passed on.
//
// make_cache wraps a storage method's layers in it only when an allocation or ragged-head
// method comes before it (adakv+snapkv:ratio=0.25+kivi); other caches never see it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/ragged_view.h"

namespace kvbench {

// Where a layer's rows live, for the gathers of HeadSplitLayerKv.
class RowMemory {
 public:
  virtual ~RowMemory() = default;
  // Room for n floats there, freed with the last handle.
  virtual std::shared_ptr<float> floats(int64_t n) const = 0;
  // n_rows rows of `width` floats: row i from from + i * from_stride to to + i * to_stride.
  virtual void copy_rows(float* to, int64_t to_stride, const float* from, int64_t from_stride,
                         int64_t width, int64_t n_rows) const = 0;
};

// Host memory.
const std::shared_ptr<const RowMemory>& host_memory();

class HeadSplitLayerKv : public LayerKv {
 public:
  // whole: an empty store of the layer's shape that gives head_store, its rows in `memory`.
  HeadSplitLayerKv(std::unique_ptr<LayerKv> whole, int32_t n_kv_heads, int32_t head_dim,
                   std::shared_ptr<const RowMemory> memory = host_memory());

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void retain(RetainPlan& plan) override;
  // Before the split the wrapped store's view; after it the shape alone (null pointers,
  // n_tokens the largest head's), as DenseLayerKv's.
  DenseKv view() const override;
  // After the split, in host memory: the heads gathered (their shape alone on a device).
  DenseKv heads_view() const override;
  void settle() override;
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override;  // split: the largest head's
  int64_t n_tokens_held() const override;
  int64_t head_tokens(int32_t head) const override;
  bool holds_ragged_heads() const override { return true; }
  int64_t bytes_resident() const override;
  const char* tier() const override { return whole_ ? whole_->tier() : heads_[0]->tier(); }

  bool split() const { return !heads_.empty(); }
  // The wrapped store before the split, KV head h's store after it.
  const LayerKv& whole() const { return *whole_; }
  const LayerKv& head(int32_t h) const { return *heads_[h]; }

 private:
  HeadSplitLayerKv(int32_t n_kv_heads, int32_t head_dim, std::shared_ptr<const RowMemory> memory)
      : n_kv_heads_(n_kv_heads), head_dim_(head_dim), memory_(std::move(memory)) {}

  int32_t n_kv_heads_;
  int32_t head_dim_;
  std::shared_ptr<const RowMemory> memory_;
  std::unique_ptr<LayerKv> whole_;              // until the first ragged plan
  std::vector<std::unique_ptr<LayerKv>> heads_;  // after it: KV head h alone in heads_[h]
  mutable RaggedView ragged_view_;               // heads_view's copy, until settle()
};

// The layers of `layers` each wrapped in a HeadSplitLayerKv; stores of a storage method that
// splits_heads (cache/registry.h). One that cannot give its heads (head_store returns
// nullptr) throws std::logic_error at the first ragged plan.
std::vector<std::unique_ptr<LayerKv>> split_heads_on_ragged_plans(
    std::vector<std::unique_ptr<LayerKv>> layers, int32_t n_kv_heads, int32_t head_dim,
    const std::shared_ptr<const RowMemory>& memory = host_memory());

}  // namespace kvbench
