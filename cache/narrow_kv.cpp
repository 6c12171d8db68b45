#include "cache/narrow_kv.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "cache/full_cache.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/narrow.h"

namespace kvbench {

NarrowLayerKv::NarrowLayerKv(int32_t n_kv_heads, int32_t head_dim, KvElement element)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      element_(element),
      row_bytes_(static_cast<int64_t>(head_dim) * kv_element_bytes(element)) {}

void NarrowLayerKv::reallocate(int64_t new_capacity) {
  assert(new_capacity >= n_tokens_);
  const bool scaled = element_ == KvElement::F8E4M3;
  std::vector<uint8_t> k(n_kv_heads_ * new_capacity * row_bytes_), v(k.size());
  std::vector<float> k_scale(scaled ? n_kv_heads_ * new_capacity : 0), v_scale(k_scale.size());
  std::vector<int32_t> positions(n_kv_heads_ * new_capacity);
  for (int32_t h = 0; h < n_kv_heads_ && n_tokens_ > 0; ++h) {
    const int64_t from = h * capacity_, to = h * new_capacity;
    std::memcpy(&k[to * row_bytes_], &k_[from * row_bytes_], n_tokens_ * row_bytes_);
    std::memcpy(&v[to * row_bytes_], &v_[from * row_bytes_], n_tokens_ * row_bytes_);
    std::copy_n(&positions_[from], n_tokens_, &positions[to]);
    if (scaled) {
      std::copy_n(&k_scale_[from], n_tokens_, &k_scale[to]);
      std::copy_n(&v_scale_[from], n_tokens_, &v_scale[to]);
    }
  }
  k_.swap(k);
  v_.swap(v);
  k_scale_.swap(k_scale);
  v_scale_.swap(v_scale);
  positions_.swap(positions);
  capacity_ = new_capacity;
}

void NarrowLayerKv::reserve(int64_t n_tokens) {
  if (n_tokens > capacity_) reallocate(n_tokens);
}

void NarrowLayerKv::append(const float* k, const float* v, const int32_t* positions,
                           int64_t n_new) {
  drop_view();
  if (n_new == 0) return;  // no &x[i] into buffers that may still be empty
  const int64_t need = n_tokens_ + n_new;
  if (need > capacity_) reallocate(grown_capacity(capacity_, need, evicted_));
  const bool scaled = element_ == KvElement::F8E4M3;
  const int64_t stride = static_cast<int64_t>(n_kv_heads_) * head_dim_;  // between tokens
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int64_t row = h * capacity_ + n_tokens_;
    encode_kv_rows(element_, k + h * head_dim_, stride, n_new, head_dim_, &k_[row * row_bytes_],
                   scaled ? &k_scale_[row] : nullptr);
    encode_kv_rows(element_, v + h * head_dim_, stride, n_new, head_dim_, &v_[row * row_bytes_],
                   scaled ? &v_scale_[row] : nullptr);
    std::copy_n(positions, n_new, &positions_[row]);
  }
  n_tokens_ = need;
}

NarrowKv NarrowLayerKv::layout() const {
  const bool scaled = element_ == KvElement::F8E4M3;
  return NarrowKv{k_.data(),
                  v_.data(),
                  scaled ? k_scale_.data() : nullptr,
                  scaled ? v_scale_.data() : nullptr,
                  positions_.data(),
                  element_,
                  n_kv_heads_,
                  head_dim_,
                  capacity_,
                  n_tokens_};
}

int64_t NarrowLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  attention_narrow_cpu(query, layout(), pages);
  const int64_t token_bytes = 2 * narrow_row_bytes(element_, head_dim_) + sizeof(int32_t);
  const int64_t slots =
      pages ? selected_slots(*pages, n_kv_heads_, n_tokens_) : n_kv_heads_ * n_tokens_;
  return token_bytes * slots;
}

void NarrowLayerKv::move_row(int32_t h, int64_t from, int64_t to) {
  const int64_t a = h * capacity_ + from, b = h * capacity_ + to;
  std::memcpy(&k_[b * row_bytes_], &k_[a * row_bytes_], row_bytes_);
  std::memcpy(&v_[b * row_bytes_], &v_[a * row_bytes_], row_bytes_);
  positions_[b] = positions_[a];
  if (element_ == KvElement::F8E4M3) {
    k_scale_[b] = k_scale_[a];
    v_scale_[b] = v_scale_[a];
  }
}

// As retain_rows_in_place (cache/full_cache.h) over narrow rows: merged contents are
// rounded into the kept slots, then the holes are filled from the tail.
void NarrowLayerKv::retain(RetainPlan& plan) {
  assert(plan.n_keep <= n_tokens_);
  assert(static_cast<int64_t>(plan.slots.size()) == plan.n_keep * n_kv_heads_);
  drop_view();
  const bool scaled = element_ == KvElement::F8E4M3;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    int32_t* keep = plan.slots.data() + h * plan.n_keep;
    if (!plan.k.empty()) {
      for (int64_t j = 0; j < plan.n_keep; ++j) {
        const int64_t row = h * capacity_ + keep[j];
        const int64_t from = (h * plan.n_keep + j) * head_dim_;
        encode_kv_rows(element_, &plan.k[from], head_dim_, 1, head_dim_, &k_[row * row_bytes_],
                       scaled ? &k_scale_[row] : nullptr);
        encode_kv_rows(element_, &plan.v[from], head_dim_, 1, head_dim_, &v_[row * row_bytes_],
                       scaled ? &v_scale_[row] : nullptr);
      }
    }
    place_kept_slots(keep, plan.n_keep, plan.n_keep);
    for (int64_t j = 0; j < plan.n_keep; ++j) {
      if (keep[j] != j) move_row(h, keep[j], j);
    }
  }
  n_tokens_ = plan.n_keep;
  evicted_ = true;
  if (retain_shrinks(capacity_, n_tokens_)) reallocate(n_tokens_);
}

DenseKv NarrowLayerKv::view() const {
  const int64_t n = n_tokens_;
  if (!view_ready_) {
    const bool scaled = element_ == KvElement::F8E4M3;
    view_k_.resize(n_kv_heads_ * n * head_dim_);
    view_v_.resize(view_k_.size());
    view_positions_.resize(n_kv_heads_ * n);
    for (int32_t h = 0; h < n_kv_heads_ && n > 0; ++h) {  // no &x[i] into empty vectors
      const int64_t row = h * capacity_;
      decode_kv_rows(element_, &k_[row * row_bytes_], scaled ? &k_scale_[row] : nullptr, n,
                     head_dim_, &view_k_[h * n * head_dim_]);
      decode_kv_rows(element_, &v_[row * row_bytes_], scaled ? &v_scale_[row] : nullptr, n,
                     head_dim_, &view_v_[h * n * head_dim_]);
      std::copy_n(&positions_[row], n, &view_positions_[h * n]);
    }
    view_ready_ = true;
  }
  return DenseKv{view_k_.data(), view_v_.data(), view_positions_.data(), n_kv_heads_, head_dim_,
                 n,              n};
}

void NarrowLayerKv::drop_view() const {
  if (!view_ready_ && view_k_.empty()) return;
  view_ready_ = false;
  view_k_ = {};
  view_v_ = {};
  view_positions_ = {};
}

std::unique_ptr<LayerKv> NarrowLayerKv::clone() const {
  auto copy = std::make_unique<NarrowLayerKv>(*this);
  copy->drop_view();
  return copy;
}

std::unique_ptr<LayerKv> NarrowLayerKv::head_store(int32_t head) const {
  auto one = std::make_unique<NarrowLayerKv>(1, head_dim_, element_);
  one->reallocate(n_tokens_);
  const int64_t row = head * capacity_;
  std::copy_n(k_.data() + row * row_bytes_, n_tokens_ * row_bytes_, one->k_.data());
  std::copy_n(v_.data() + row * row_bytes_, n_tokens_ * row_bytes_, one->v_.data());
  std::copy_n(positions_.data() + row, n_tokens_, one->positions_.data());
  if (element_ == KvElement::F8E4M3) {
    std::copy_n(k_scale_.data() + row, n_tokens_, one->k_scale_.data());
    std::copy_n(v_scale_.data() + row, n_tokens_, one->v_scale_.data());
  }
  one->n_tokens_ = n_tokens_;
  one->evicted_ = evicted_;
  return one;
}

int64_t NarrowLayerKv::bytes_resident() const {
  return static_cast<int64_t>(k_.capacity() + v_.capacity()) +
         static_cast<int64_t>(k_scale_.capacity() + v_scale_.capacity()) * sizeof(float) +
         static_cast<int64_t>(positions_.capacity()) * sizeof(int32_t);
}

std::vector<std::unique_ptr<LayerKv>> make_narrow_layers(const KvShape& shape,
                                                         KvElement element) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<NarrowLayerKv>(shape.n_kv_heads, shape.head_dim, element));
  }
  return layers;
}

}  // namespace kvbench
