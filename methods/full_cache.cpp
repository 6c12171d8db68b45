#include "methods/full_cache.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention.h"

namespace kvbench {

DenseLayerKv::DenseLayerKv(int32_t n_kv_heads, int32_t head_dim)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim) {}

void DenseLayerKv::reserve(int64_t n_tokens) {
  if (n_tokens <= capacity_) return;
  // Re-lay out per head: head h's rows move from h * old_capacity to h * new_capacity.
  std::vector<float> k(static_cast<size_t>(n_kv_heads_) * n_tokens * head_dim_);
  std::vector<float> v(k.size());
  const size_t row_floats = static_cast<size_t>(n_tokens_) * head_dim_;
  for (int32_t h = 0; h < n_kv_heads_ && n_tokens_ > 0; ++h) {
    std::memcpy(k.data() + h * n_tokens * head_dim_, k_.data() + h * capacity_ * head_dim_,
                row_floats * sizeof(float));
    std::memcpy(v.data() + h * n_tokens * head_dim_, v_.data() + h * capacity_ * head_dim_,
                row_floats * sizeof(float));
  }
  k_.swap(k);
  v_.swap(v);
  positions_.resize(n_tokens);
  capacity_ = n_tokens;
}

void DenseLayerKv::append(const float* k, const float* v, const int32_t* positions,
                          int64_t n_new) {
  if (n_tokens_ + n_new > capacity_) {
    // Grow geometrically so token-by-token decode does not copy the cache every step.
    reserve(std::max(n_tokens_ + n_new, capacity_ + capacity_ / 2 + 64));
  }
  for (int64_t t = 0; t < n_new; ++t) {
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const size_t src = (static_cast<size_t>(t) * n_kv_heads_ + h) * head_dim_;
      const size_t dst = (static_cast<size_t>(h) * capacity_ + n_tokens_ + t) * head_dim_;
      std::memcpy(&k_[dst], k + src, head_dim_ * sizeof(float));
      std::memcpy(&v_[dst], v + src, head_dim_ * sizeof(float));
    }
    positions_[n_tokens_ + t] = positions[t];
  }
  n_tokens_ += n_new;
}

DenseKv DenseLayerKv::view() const {
  return DenseKv{k_.data(), v_.data(), positions_.data(), n_kv_heads_, head_dim_, capacity_,
                 n_tokens_};
}

void DenseLayerKv::attend(const AttentionQuery& query) const {
  attention_dense_cpu(query, view());
}

int64_t DenseLayerKv::bytes_resident() const {
  return static_cast<int64_t>(k_.capacity() + v_.capacity()) * sizeof(float) +
         static_cast<int64_t>(positions_.capacity()) * sizeof(int32_t);
}

KvCache make_full_cache(const KvShape& shape) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<DenseLayerKv>(shape.n_kv_heads, shape.head_dim));
  }
  return KvCache(shape, std::move(layers));
}

}  // namespace kvbench
