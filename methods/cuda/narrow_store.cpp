#include "methods/cuda/narrow_store.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cache/full_cache.h"
#include "cache/plan_helpers.h"
#include "kernels/cpu/narrow.h"
#include "kernels/cuda/attention.h"

namespace kvbench {
namespace {

constexpr const char* kWho = "CudaNarrowLayerKv";

void check(cudaError_t err, const char* what) { cuda_check(err, kWho, what); }

// Buffers are only dropped after this, so no queued copy or kernel still reads them.
void wait_default_stream() { check(cudaStreamSynchronize(nullptr), "synchronize"); }

// The first n_rows rows of `heads` heads, rows of row_bytes, from one per-head layout to
// another: one strided copy.
void copy_head_rows(void* to, int64_t to_capacity, const void* from, int64_t from_capacity,
                    int64_t row_bytes, int64_t n_rows, int32_t heads, const char* what) {
  check(cudaMemcpy2DAsync(to, to_capacity * row_bytes, from, from_capacity * row_bytes,
                          n_rows * row_bytes, heads, cudaMemcpyDeviceToDevice, nullptr),
        what);
}

}  // namespace

CudaNarrowLayerKv::CudaNarrowLayerKv(int32_t n_kv_heads, int32_t head_dim, KvElement element)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      element_(element),
      row_bytes_(static_cast<int64_t>(head_dim) * kv_element_bytes(element)) {}

CudaNarrowLayerKv::Rows CudaNarrowLayerKv::allocate(int64_t capacity) const {
  const int64_t slots = static_cast<int64_t>(n_kv_heads_) * capacity;
  const int64_t scales = element_ == KvElement::F8E4M3 ? slots : 0;
  return Rows{DeviceBuffer<uint8_t>(slots * row_bytes_), DeviceBuffer<uint8_t>(slots * row_bytes_),
              DeviceBuffer<float>(scales), DeviceBuffer<float>(scales),
              DeviceBuffer<int32_t>(slots)};
}

void CudaNarrowLayerKv::copy_rows(const Rows& from, int64_t from_capacity, Rows& to,
                                  int64_t to_capacity, int64_t n_rows) const {
  if (n_rows <= 0 || n_kv_heads_ <= 0) return;
  copy_head_rows(to.k.data(), to_capacity, from.k.data(), from_capacity, row_bytes_, n_rows,
                 n_kv_heads_, "copy keys");
  copy_head_rows(to.v.data(), to_capacity, from.v.data(), from_capacity, row_bytes_, n_rows,
                 n_kv_heads_, "copy values");
  copy_head_rows(to.positions.data(), to_capacity, from.positions.data(), from_capacity,
                 sizeof(int32_t), n_rows, n_kv_heads_, "copy positions");
  if (element_ == KvElement::F8E4M3) {
    copy_head_rows(to.k_scale.data(), to_capacity, from.k_scale.data(), from_capacity,
                   sizeof(float), n_rows, n_kv_heads_, "copy key scales");
    copy_head_rows(to.v_scale.data(), to_capacity, from.v_scale.data(), from_capacity,
                   sizeof(float), n_rows, n_kv_heads_, "copy value scales");
  }
}

void CudaNarrowLayerKv::reallocate(int64_t new_capacity) {
  Rows moved = allocate(new_capacity);
  copy_rows(rows_, capacity_, moved, new_capacity, n_tokens_);
  wait_default_stream();
  rows_ = std::move(moved);
  capacity_ = new_capacity;
}

void CudaNarrowLayerKv::reserve(int64_t n_tokens) {
  if (n_tokens > capacity_) reallocate(n_tokens);
}

NarrowTarget CudaNarrowLayerKv::target() const {
  return NarrowTarget{rows_.k.data(),         rows_.v.data(),   rows_.k_scale.data(),
                      rows_.v_scale.data(),   rows_.positions.data(), element_,
                      n_kv_heads_,            head_dim_,        capacity_};
}

NarrowKv CudaNarrowLayerKv::layout() const {
  return NarrowKv{rows_.k.data(),         rows_.v.data(), rows_.k_scale.data(),
                  rows_.v_scale.data(),   rows_.positions.data(),
                  element_,               n_kv_heads_,    head_dim_,
                  capacity_,              n_tokens_};
}

void CudaNarrowLayerKv::append(const float* k, const float* v, const int32_t* positions,
                               int64_t n_new) {
  if (n_new <= 0) return;
  drop_view();
  const int64_t need = n_tokens_ + n_new;
  // NarrowLayerKv's growth, so both hold the same bytes.
  if (need > capacity_) reallocate(grown_capacity(capacity_, need, evicted_));
  append_narrow_rows_cuda(target(), n_tokens_, k, v, positions, n_new, nullptr);
  n_tokens_ = need;
}

int64_t CudaNarrowLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  const int64_t token_bytes = 2 * narrow_row_bytes(element_, head_dim_) + sizeof(int32_t);
  if (!pages) {
    attention_narrow_cuda(query, layout(), nullptr, nullptr);
    return token_bytes * n_kv_heads_ * n_tokens_;
  }
  // The page ids are few: a host copy lets selected_slots count what NarrowLayerKv counts.
  const int64_t n_ids = static_cast<int64_t>(n_kv_heads_) * std::max(pages->n_selected, 0);
  std::vector<int32_t> host_pages(static_cast<size_t>(n_ids));
  if (n_ids > 0) {
    check(cudaMemcpy(host_pages.data(), pages->pages, n_ids * sizeof(int32_t),
                     cudaMemcpyDeviceToHost),
          "download page ids");
  }
  attention_narrow_cuda(query, layout(), pages, nullptr);
  const PageSelection host_selection{host_pages.data(), pages->n_selected, pages->page_tokens};
  return token_bytes * selected_slots(host_selection, n_kv_heads_, n_tokens_);
}

// NarrowLayerKv::retain on the device: the placement is decided on the host (the plan is
// there), the few rows it moves are moved in one launch, then merged rows are rounded into the
// slots their tokens now occupy.
void CudaNarrowLayerKv::retain(RetainPlan& plan) {
  check_retain_plan(plan, n_kv_heads_, head_dim_, n_tokens_, kWho);
  drop_view();
  const int64_t n_keep = plan.n_keep;
  const bool merged = !plan.k.empty();
  std::vector<int64_t> from, to;
  std::vector<float> merged_k, merged_v;  // [n_kv_heads, n_keep, head_dim] by new slot
  if (merged) {
    merged_k.resize(plan.k.size());
    merged_v.resize(plan.v.size());
  }
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    int32_t* keep = plan.slots.data() + h * n_keep;
    const std::vector<int32_t> planned(keep, keep + n_keep);  // ascending: plan.k's order
    place_kept_slots(keep, n_keep, n_keep);
    for (int64_t j = 0; j < n_keep; ++j) {
      if (keep[j] != j) {
        from.push_back(h * capacity_ + keep[j]);
        to.push_back(h * capacity_ + j);
      }
      if (merged) {
        const int64_t i = std::lower_bound(planned.begin(), planned.end(), keep[j]) -
                          planned.begin();
        const int64_t src = (h * n_keep + i) * head_dim_, dst = (h * n_keep + j) * head_dim_;
        std::copy_n(&plan.k[src], head_dim_, &merged_k[dst]);
        std::copy_n(&plan.v[src], head_dim_, &merged_v[dst]);
      }
    }
  }
  if (!from.empty()) {
    const DeviceBuffer<int64_t> d_from(from.data(), static_cast<int64_t>(from.size()));
    const DeviceBuffer<int64_t> d_to(to.data(), static_cast<int64_t>(to.size()));
    move_narrow_rows_cuda(target(), d_from.data(), d_to.data(), d_from.size(), nullptr);
    wait_default_stream();
  }
  if (merged && n_keep > 0) {
    const DeviceBuffer<float> d_k(merged_k.data(), static_cast<int64_t>(merged_k.size()));
    const DeviceBuffer<float> d_v(merged_v.data(), static_cast<int64_t>(merged_v.size()));
    const bool scaled = element_ == KvElement::F8E4M3;
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int64_t row = h * capacity_;
      const int64_t src = h * n_keep * head_dim_;
      encode_kv_rows_cuda(element_, d_k.data() + src, head_dim_, n_keep, head_dim_,
                          rows_.k.data() + row * row_bytes_,
                          scaled ? rows_.k_scale.data() + row : nullptr, nullptr);
      encode_kv_rows_cuda(element_, d_v.data() + src, head_dim_, n_keep, head_dim_,
                          rows_.v.data() + row * row_bytes_,
                          scaled ? rows_.v_scale.data() + row : nullptr, nullptr);
    }
    wait_default_stream();
  }
  n_tokens_ = n_keep;
  evicted_ = true;
  if (retain_shrinks(capacity_, n_tokens_)) reallocate(n_tokens_);  // NarrowLayerKv's rule
}

DenseKv CudaNarrowLayerKv::view() const {
  const int64_t n = n_tokens_;
  if (!view_ready_) {
    const bool scaled = element_ == KvElement::F8E4M3;
    view_k_ = DeviceBuffer<float>(n_kv_heads_ * n * head_dim_);
    view_v_ = DeviceBuffer<float>(n_kv_heads_ * n * head_dim_);
    view_positions_ = DeviceBuffer<int32_t>(n_kv_heads_ * n);
    for (int32_t h = 0; h < n_kv_heads_ && n > 0; ++h) {
      const int64_t row = h * capacity_;
      decode_kv_rows_cuda(element_, rows_.k.data() + row * row_bytes_,
                          scaled ? rows_.k_scale.data() + row : nullptr, n, head_dim_,
                          view_k_.data() + h * n * head_dim_, nullptr);
      decode_kv_rows_cuda(element_, rows_.v.data() + row * row_bytes_,
                          scaled ? rows_.v_scale.data() + row : nullptr, n, head_dim_,
                          view_v_.data() + h * n * head_dim_, nullptr);
    }
    if (n > 0 && n_kv_heads_ > 0) {
      copy_head_rows(view_positions_.data(), n, rows_.positions.data(), capacity_,
                     sizeof(int32_t), n, n_kv_heads_, "copy positions to the view");
    }
    view_ready_ = true;
  }
  return DenseKv{view_k_.data(), view_v_.data(), view_positions_.data(), n_kv_heads_, head_dim_,
                 n,              n};
}

void CudaNarrowLayerKv::drop_view() const {
  if (!view_ready_ && view_k_.size() == 0 && view_positions_.size() == 0) return;
  wait_default_stream();  // a kernel may still read the view
  view_ready_ = false;
  view_k_ = DeviceBuffer<float>();
  view_v_ = DeviceBuffer<float>();
  view_positions_ = DeviceBuffer<int32_t>();
}

std::unique_ptr<LayerKv> CudaNarrowLayerKv::clone() const {
  auto copy = std::make_unique<CudaNarrowLayerKv>(n_kv_heads_, head_dim_, element_);
  copy->rows_ = allocate(capacity_);
  copy_rows(rows_, capacity_, copy->rows_, capacity_, n_tokens_);
  wait_default_stream();
  copy->capacity_ = capacity_;
  copy->n_tokens_ = n_tokens_;
  copy->evicted_ = evicted_;
  return copy;
}

std::unique_ptr<LayerKv> CudaNarrowLayerKv::head_store(int32_t head) const {
  auto one = std::make_unique<CudaNarrowLayerKv>(1, head_dim_, element_);
  one->rows_ = one->allocate(n_tokens_);
  one->capacity_ = n_tokens_;
  one->n_tokens_ = n_tokens_;
  one->evicted_ = evicted_;
  if (n_tokens_ == 0) return one;
  const int64_t at = static_cast<int64_t>(head) * capacity_;  // the head's first row
  const auto copy = [&](auto* to, const auto* from, int64_t row_bytes, const char* what) {
    check(cudaMemcpyAsync(to, reinterpret_cast<const uint8_t*>(from) + at * row_bytes,
                          n_tokens_ * row_bytes, cudaMemcpyDeviceToDevice, nullptr),
          what);
  };
  copy(one->rows_.k.data(), rows_.k.data(), row_bytes_, "copy a head's keys");
  copy(one->rows_.v.data(), rows_.v.data(), row_bytes_, "copy a head's values");
  copy(one->rows_.positions.data(), rows_.positions.data(), sizeof(int32_t),
       "copy a head's positions");
  if (element_ == KvElement::F8E4M3) {
    copy(one->rows_.k_scale.data(), rows_.k_scale.data(), sizeof(float),
         "copy a head's key scales");
    copy(one->rows_.v_scale.data(), rows_.v_scale.data(), sizeof(float),
         "copy a head's value scales");
  }
  wait_default_stream();
  return one;
}

int64_t CudaNarrowLayerKv::bytes_resident() const {
  return rows_.k.bytes() + rows_.v.bytes() + rows_.k_scale.bytes() + rows_.v_scale.bytes() +
         rows_.positions.bytes();
}

std::vector<std::unique_ptr<LayerKv>> make_cuda_narrow_layers(const KvShape& shape,
                                                              KvElement element) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(
        std::make_unique<CudaNarrowLayerKv>(shape.n_kv_heads, shape.head_dim, element));
  }
  return layers;
}

}  // namespace kvbench
