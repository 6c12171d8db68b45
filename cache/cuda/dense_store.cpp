#include "cache/cuda/dense_store.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cache/full_cache.h"
#include "cache/plan_helpers.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gather.h"

namespace kvbench {
namespace {

constexpr const char* kWho = "CudaDenseLayerKv";

void check(cudaError_t err, const char* what) { cuda_check(err, kWho, what); }

// Buffers are only dropped after this, so no queued copy or kernel still reads them.
void wait_default_stream() { check(cudaStreamSynchronize(nullptr), "synchronize"); }

}  // namespace

CudaDenseLayerKv::CudaDenseLayerKv(int32_t n_kv_heads, int32_t head_dim)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim) {}

CudaDenseLayerKv::Rows CudaDenseLayerKv::allocate(int64_t capacity) const {
  const int64_t slots = static_cast<int64_t>(n_kv_heads_) * capacity;
  return Rows{DeviceBuffer<float>(slots * head_dim_), DeviceBuffer<float>(slots * head_dim_),
              DeviceBuffer<int32_t>(slots)};
}

void CudaDenseLayerKv::copy_rows(const Rows& from, int64_t from_capacity, Rows& to,
                                 int64_t to_capacity, int64_t n_rows) const {
  if (n_rows <= 0 || n_kv_heads_ <= 0) return;
  // One strided copy per array: a head's rows in use are contiguous in both buffers.
  const size_t row_bytes = static_cast<size_t>(head_dim_) * sizeof(float);
  check(cudaMemcpy2DAsync(to.k.data(), to_capacity * row_bytes, from.k.data(),
                          from_capacity * row_bytes, n_rows * row_bytes, n_kv_heads_,
                          cudaMemcpyDeviceToDevice, nullptr),
        "copy keys");
  check(cudaMemcpy2DAsync(to.v.data(), to_capacity * row_bytes, from.v.data(),
                          from_capacity * row_bytes, n_rows * row_bytes, n_kv_heads_,
                          cudaMemcpyDeviceToDevice, nullptr),
        "copy values");
  check(cudaMemcpy2DAsync(to.positions.data(), to_capacity * sizeof(int32_t), from.positions.data(),
                          from_capacity * sizeof(int32_t), n_rows * sizeof(int32_t), n_kv_heads_,
                          cudaMemcpyDeviceToDevice, nullptr),
        "copy positions");
}

void CudaDenseLayerKv::reallocate(int64_t new_capacity) {
  Rows moved = allocate(new_capacity);
  copy_rows(rows_, capacity_, moved, new_capacity, n_tokens_);
  wait_default_stream();
  rows_ = std::move(moved);
  capacity_ = new_capacity;
}

void CudaDenseLayerKv::reserve(int64_t n_tokens) {
  if (!ragged()) {
    if (n_tokens > capacity_) reallocate(n_tokens);
    return;
  }
  // Room for as many more tokens in every head as the longest head is asked for.
  const int64_t more = n_tokens - this->n_tokens();
  for (auto& head : heads_) head->reserve(head->n_tokens() + more);
}

void CudaDenseLayerKv::append(const float* k, const float* v, const int32_t* positions,
                              int64_t n_new) {
  if (!ragged()) {
    append_heads(k, v, positions, n_new, 0, n_kv_heads_);
    return;
  }
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    heads_[h]->append_heads(k, v, positions, n_new, h, n_kv_heads_);
  }
}

void CudaDenseLayerKv::append_heads(const float* k, const float* v, const int32_t* positions,
                                    int64_t n_new, int32_t first_head, int32_t src_heads) {
  if (n_new <= 0) return;
  const int64_t need = n_tokens_ + n_new;
  if (need > capacity_) {
    // DenseLayerKv's growth, so both stores hold the same bytes for the same tokens.
    reallocate(grown_capacity(capacity_, need, evicted_));
  }
  append_projection_rows(rows_.k.data(), rows_.v.data(), rows_.positions.data(), n_kv_heads_,
                         head_dim_, capacity_, n_tokens_, k, v, positions, n_new, first_head,
                         src_heads);
  n_tokens_ = need;
}

int64_t CudaDenseLayerKv::n_tokens() const {
  if (!ragged()) return n_tokens_;
  int64_t most = 0;
  for (const auto& head : heads_) most = std::max(most, head->n_tokens());
  return most;
}

int64_t CudaDenseLayerKv::head_tokens(int32_t head) const {
  return ragged() ? heads_[head]->n_tokens() : n_tokens_;
}

DenseKv CudaDenseLayerKv::head_view(int32_t head) const {
  if (ragged()) return heads_[head]->view();
  const int64_t at = static_cast<int64_t>(head) * capacity_;
  return DenseKv{rows_.k.data() + at * head_dim_, rows_.v.data() + at * head_dim_,
                 rows_.positions.data() + at, 1, head_dim_, capacity_, n_tokens_};
}

void CudaDenseLayerKv::split_heads(const RetainPlan& plan) {
  std::vector<std::unique_ptr<CudaDenseLayerKv>> heads;  // heads_ stays empty while head_view reads
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int64_t n_keep = plan.kept(h);
    auto head = std::make_unique<CudaDenseLayerKv>(1, head_dim_);
    head->rows_ = head->allocate(n_keep);
    head->capacity_ = n_keep;
    head->n_tokens_ = n_keep;
    head->evicted_ = true;
    if (n_keep > 0) {  // in slot order: new slot j holds the plan's j-th kept slot
      const DeviceBuffer<int32_t> slots(plan.slots.data() + plan.head_offset(h), n_keep);
      gather_rows_cuda(head_view(h), slots.data(), n_keep,
                       GatherTarget{head->rows_.k.data(), head->rows_.v.data(),
                                    head->rows_.positions.data(), n_keep},
                       nullptr);
      wait_default_stream();  // before `slots` is freed
    }
    heads.push_back(std::move(head));
  }
  heads_ = std::move(heads);
  rows_ = Rows{};  // gives the rectangle's memory back
  capacity_ = 0;
  n_tokens_ = 0;
}

int64_t CudaDenseLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  const int64_t token_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
  if (ragged()) {
    if (pages) throw std::logic_error("CudaDenseLayerKv::attend: pages over heads of their own");
    std::vector<DenseKv> table;
    int64_t slots = 0;
    for (const auto& head : heads_) {
      table.push_back(head->view());
      slots += head->n_tokens();
    }
    // A synchronous upload waits for the work queued before it, so the last step's attention
    // has read the table by the time it is overwritten.
    if (head_table_.size() < n_kv_heads_) head_table_ = DeviceBuffer<DenseKv>(n_kv_heads_);
    head_table_.upload(table.data(), n_kv_heads_);
    attention_ragged_cuda(query, head_table_.data(), n_kv_heads_, head_dim_, n_tokens(), nullptr);
    return token_bytes * slots;
  }
  if (!pages) {
    attention_dense_cuda(query, view(), nullptr);
    return token_bytes * n_kv_heads_ * n_tokens_;
  }
  // The page ids are few ([n_kv_heads, n_selected]): a host copy lets selected_slots count
  // exactly what DenseLayerKv counts (partial last pages included).
  const int64_t n_ids = static_cast<int64_t>(n_kv_heads_) * std::max(pages->n_selected, 0);
  std::vector<int32_t> host_pages(static_cast<size_t>(n_ids));
  if (n_ids > 0) {
    check(cudaMemcpy(host_pages.data(), pages->pages, n_ids * sizeof(int32_t),
                     cudaMemcpyDeviceToHost),
          "download page ids");
  }
  attention_pages_cuda(query, view(), *pages, nullptr);
  const PageSelection host_selection{host_pages.data(), pages->n_selected, pages->page_tokens};
  return token_bytes * selected_slots(host_selection, n_kv_heads_, n_tokens_);
}

void CudaDenseLayerKv::retain(RetainPlan& plan) {
  if (plan.ragged() || ragged()) {
    retain_per_head(plan);
    return;
  }
  check_retain_plan(plan, n_kv_heads_, head_dim_, n_tokens_, kWho);
  const int64_t n_keep = plan.n_keep;
  // DenseLayerKv's placement (every hole filled from the tail) and its sizing: a compression
  // gives its memory back, a decode-step eviction keeps the capacity.
  const std::vector<int32_t> order = kept_slot_order(plan, n_kv_heads_, n_keep);
  const std::vector<int32_t> planned = plan.slots;
  std::vector<int64_t> from, to;  // the rows that move, numbered across heads
  for (int64_t i = 0; i < static_cast<int64_t>(order.size()); ++i) {
    const int64_t h = i / n_keep, j = i % n_keep;
    plan.slots[i] = planned[h * n_keep + order[i]];
    if (plan.slots[i] != j) {
      from.push_back(h * capacity_ + plan.slots[i]);
      to.push_back(h * capacity_ + j);
    }
  }
  const bool shrink = retain_shrinks(capacity_, n_keep);
  if (!shrink) {
    // In place whenever the capacity stays. Then at most idle <= 2 * kEvictionSlack slots were
    // dropped per head, so at most that many rows move (a decode-step eviction: one), never
    // more than a gather would copy (n_keep), and nothing is allocated. The moves are
    // disjoint: a hole j lies below n_keep and the row that fills it at or past it.
    move_in_place(from, to);
    n_tokens_ = n_keep;
  } else if (from.empty()) {  // each head keeps its first slots
    n_tokens_ = n_keep;
    reallocate(n_keep);
  } else {  // a compression: the kept rows gathered, in place order, into buffers of n_keep
    const DeviceBuffer<int32_t> slots(plan.slots.data(), static_cast<int64_t>(plan.slots.size()));
    Rows kept = allocate(n_keep);
    gather_rows_cuda(view(), slots.data(), n_keep,
                     GatherTarget{kept.k.data(), kept.v.data(), kept.positions.data(), n_keep},
                     nullptr);
    wait_default_stream();
    rows_ = std::move(kept);
    capacity_ = n_keep;
    n_tokens_ = n_keep;
  }
  // Kept slot j now sits at row j: merged rows, placed as their slots, go in as one strided
  // copy (after the moves, in stream order).
  if (!plan.k.empty() && n_keep > 0) {
    const int64_t d = head_dim_;
    std::vector<float> merged_k(plan.k.size()), merged_v(plan.v.size());
    for (int64_t i = 0; i < static_cast<int64_t>(order.size()); ++i) {
      const int64_t from_row = i / n_keep * n_keep + order[i];
      std::copy_n(plan.k.begin() + from_row * d, d, merged_k.begin() + i * d);
      std::copy_n(plan.v.begin() + from_row * d, d, merged_v.begin() + i * d);
    }
    const size_t row_bytes = static_cast<size_t>(d) * sizeof(float);
    check(cudaMemcpy2D(rows_.k.data(), capacity_ * row_bytes, merged_k.data(), n_keep * row_bytes,
                       n_keep * row_bytes, n_kv_heads_, cudaMemcpyHostToDevice),
          "upload merged keys");
    check(cudaMemcpy2D(rows_.v.data(), capacity_ * row_bytes, merged_v.data(), n_keep * row_bytes,
                       n_keep * row_bytes, n_kv_heads_, cudaMemcpyHostToDevice),
          "upload merged values");
  }
  evicted_ = true;
}

void CudaDenseLayerKv::retain_per_head(RetainPlan& plan) {
  if (!ragged()) {  // the first ragged plan
    if (!plan.k.empty()) throw std::invalid_argument(std::string(kWho) + ": a ragged plan merges");
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int32_t* keep = plan.slots.data() + plan.head_offset(h);
      for (int64_t j = 0; j < plan.kept(h); ++j) {
        if (keep[j] < 0 || keep[j] >= n_tokens_ || (j > 0 && keep[j] <= keep[j - 1])) {
          throw std::invalid_argument(std::string(kWho) + ": a ragged plan's slots of head " +
                                      std::to_string(h) + " are not ascending stored slots");
        }
      }
    }
    evicted_ = true;
    split_heads(plan);
    return;
  }
  // Heads of their own: each applies its row of the plan as a one-head store would, and
  // plan.slots takes each head's placement (DenseLayerKv::retain's ragged branch).
  retain_head_by_head(plan, n_kv_heads_, head_dim_,
                      [&](int32_t h, RetainPlan& one) { heads_[h]->retain(one); });
}

void CudaDenseLayerKv::move_in_place(const std::vector<int64_t>& from,
                                     const std::vector<int64_t>& to) {
  const int64_t n_moves = static_cast<int64_t>(from.size());
  if (n_moves == 0) return;
  if (moves_.size() < 2 * n_moves) {
    wait_default_stream();  // a queued move may still read the old list
    moves_ = DeviceBuffer<int64_t>(2 * n_moves);
  }
  // A synchronous upload from pageable memory waits for the work queued before it, so the
  // previous retain's moves have read the list by the time it is overwritten.
  moves_.upload(from.data(), n_moves);
  moves_.upload(to.data(), n_moves, n_moves);
  move_rows_cuda(GatherTarget{rows_.k.data(), rows_.v.data(), rows_.positions.data(), capacity_},
                 n_kv_heads_, head_dim_, moves_.data(), moves_.data() + n_moves, n_moves, nullptr);
}

DenseKv CudaDenseLayerKv::view() const {
  if (ragged()) return DenseKv{nullptr, nullptr, nullptr, n_kv_heads_, head_dim_, 0, n_tokens()};
  return DenseKv{rows_.k.data(), rows_.v.data(), rows_.positions.data(), n_kv_heads_, head_dim_,
                 capacity_,      n_tokens_};
}

std::unique_ptr<LayerKv> CudaDenseLayerKv::clone() const {
  auto copy = std::make_unique<CudaDenseLayerKv>(n_kv_heads_, head_dim_);
  copy->rows_ = allocate(capacity_);
  copy_rows(rows_, capacity_, copy->rows_, capacity_, n_tokens_);
  wait_default_stream();
  copy->capacity_ = capacity_;
  copy->n_tokens_ = n_tokens_;
  copy->evicted_ = evicted_;
  for (const auto& head : heads_) {
    copy->heads_.push_back(std::unique_ptr<CudaDenseLayerKv>(
        static_cast<CudaDenseLayerKv*>(head->clone().release())));
  }
  return copy;
}

int64_t CudaDenseLayerKv::bytes_resident() const {
  int64_t bytes = rows_.k.bytes() + rows_.v.bytes() + rows_.positions.bytes();
  for (const auto& head : heads_) bytes += head->bytes_resident();
  return bytes;
}

void append_projection_rows(float* k_rows, float* v_rows, int32_t* position_rows,
                            int32_t n_kv_heads, int32_t head_dim, int64_t capacity,
                            int64_t n_tokens, const float* k, const float* v,
                            const int32_t* positions, int64_t n_new, int32_t first_head,
                            int32_t src_heads) {
  if (src_heads == 0) src_heads = n_kv_heads;
  // For head h, a row every src_heads rows of the input: one strided copy per head.
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    const int64_t first = static_cast<int64_t>(h) * capacity + n_tokens;
    const int64_t column = static_cast<int64_t>(first_head + h) * head_dim;
    cuda_check(cudaMemcpy2DAsync(k_rows + first * head_dim, row_bytes, k + column,
                            src_heads * row_bytes, row_bytes, n_new, cudaMemcpyDeviceToDevice,
                            nullptr),
          "append_projection_rows", "keys");
    cuda_check(cudaMemcpy2DAsync(v_rows + first * head_dim, row_bytes, v + column,
                            src_heads * row_bytes, row_bytes, n_new, cudaMemcpyDeviceToDevice,
                            nullptr),
          "append_projection_rows", "values");
    cuda_check(cudaMemcpyAsync(position_rows + first, positions, n_new * sizeof(int32_t),
                          cudaMemcpyDeviceToDevice, nullptr),
          "append_projection_rows", "positions");
  }
}

std::vector<std::unique_ptr<LayerKv>> make_cuda_dense_layers(const KvShape& shape) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<CudaDenseLayerKv>(shape.n_kv_heads, shape.head_dim));
  }
  return layers;
}

KvCache make_cuda_full_cache(const KvShape& shape) {
  return KvCache(shape, make_cuda_dense_layers(shape));
}

}  // namespace kvbench
