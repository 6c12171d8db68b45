// The full dense cache: every token's keys and values in fp32, per KV head. The
// reference every other method is compared with, and the store eviction policies drop
// slots from.
#pragma once

#include <memory>
#include <vector>

#include "methods/kv_cache.h"

namespace kvbench {

// Room an evicting store grows by for the tokens of the next steps. A drop that leaves
// more than twice this idle (or more idle than kept) cuts the buffer to what is kept, so
// bytes resident follow the tokens kept without reallocating at every decode step.
constexpr int64_t kEvictionSlack = 64;

class DenseLayerKv : public LayerKv {
 public:
  DenseLayerKv(int32_t n_kv_heads, int32_t head_dim);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  void attend(const AttentionQuery& query) const override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return n_tokens_; }
  int64_t bytes_resident() const override;

  int64_t capacity() const { return capacity_; }

 private:
  void reallocate(int64_t capacity);

  int32_t n_kv_heads_;
  int32_t head_dim_;
  int64_t capacity_ = 0;
  int64_t n_tokens_ = 0;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack
  std::vector<float> k_;            // [n_kv_heads, capacity, head_dim]
  std::vector<float> v_;            // [n_kv_heads, capacity, head_dim]
  std::vector<int32_t> positions_;  // [n_kv_heads, capacity]
};

// A dense store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_dense_layers(const KvShape& shape);

// Dense stores for every layer and no policy: the plain model path.
KvCache make_full_cache(const KvShape& shape);

}  // namespace kvbench
