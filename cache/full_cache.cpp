#include "cache/full_cache.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/attention.h"

namespace kvbench {

DenseLayerKv::DenseLayerKv(int32_t n_kv_heads, int32_t head_dim) : rows_(n_kv_heads, head_dim) {}

void DenseLayerKv::reserve(int64_t n_tokens) {
  if (!ragged()) {
    if (n_tokens > rows_.capacity) rows_.reallocate(n_tokens);
    return;
  }
  // Room for as many more tokens in every head as the longest head is asked for.
  const int64_t more = n_tokens - this->n_tokens();
  for (HeadRows& head : heads_) {
    if (head.n_tokens + more > head.capacity) head.reallocate(head.n_tokens + more);
  }
}

void DenseLayerKv::append(const float* k, const float* v, const int32_t* positions, int64_t n_new) {
  if (!ragged()) {
    const int64_t need = rows_.n_tokens + n_new;
    if (need > rows_.capacity) rows_.reallocate(grown_capacity(rows_.capacity, need, evicted_));
    rows_.append(k, v, positions, n_new);
    return;
  }
  const int32_t n_heads = static_cast<int32_t>(heads_.size());
  for (int32_t h = 0; h < n_heads; ++h) {
    HeadRows& head = heads_[h];
    const int64_t need = head.n_tokens + n_new;
    if (need > head.capacity) head.reallocate(grown_capacity(head.capacity, need, true));
    head.append(k, v, positions, n_new, h, n_heads);
  }
}

int64_t DenseLayerKv::n_tokens() const {
  if (!ragged()) return rows_.n_tokens;
  int64_t most = 0;
  for (const HeadRows& head : heads_) most = std::max(most, head.n_tokens);
  return most;
}

int64_t DenseLayerKv::head_tokens(int32_t head) const {
  return ragged() ? heads_[head].n_tokens : rows_.n_tokens;
}

int64_t DenseLayerKv::bytes_resident() const {
  int64_t bytes = rows_.bytes();
  for (const HeadRows& head : heads_) bytes += head.bytes();
  return bytes;
}

void DenseLayerKv::split_heads(RetainPlan& plan) {
  const int32_t n_heads = rows_.n_kv_heads, dim = rows_.head_dim;
  const size_t row_bytes = dim * sizeof(float);
  heads_.reserve(n_heads);
  for (int32_t h = 0; h < n_heads; ++h) {
    const int64_t n_keep = plan.kept(h);
    const int32_t* keep = plan.slots.data() + plan.head_offset(h);
    HeadRows head(1, dim);
    head.reallocate(n_keep);
    for (int64_t j = 0; j < n_keep; ++j) {  // in slot order: new slot j holds keep[j]
      assert(keep[j] >= 0 && keep[j] < rows_.n_tokens && (j == 0 || keep[j] > keep[j - 1]));
      const size_t from = static_cast<size_t>(h) * rows_.capacity + keep[j];
      std::memcpy(&head.k[j * dim], &rows_.k[from * dim], row_bytes);
      std::memcpy(&head.v[j * dim], &rows_.v[from * dim], row_bytes);
      head.positions[j] = rows_.positions[from];
    }
    head.n_tokens = n_keep;
    heads_.push_back(std::move(head));
  }
  rows_ = HeadRows(n_heads, dim);  // gives the rectangle's memory back
}

void place_kept_slots(int32_t* keep, int64_t n_keep, int64_t settled) {
  assert(settled <= n_keep);
  const std::vector<int32_t> kept(keep, keep + n_keep);
  // kept[past, n_keep) are the kept slots at or past `settled`: the first of them fill the
  // holes below it, oldest first; the rest follow from `settled` on, in order.
  int64_t below = 0, past = std::lower_bound(kept.begin(), kept.end(), settled) - kept.begin();
  for (int64_t j = 0; j < n_keep; ++j) {
    keep[j] = j < settled && kept[below] == j ? kept[below++] : kept[past++];
  }
}

std::vector<int32_t> kept_slot_order(const RetainPlan& plan, int32_t n_kv_heads, int64_t settled) {
  const int64_t n_keep = plan.n_keep;
  std::vector<int32_t> order(plan.slots.size());
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    const int32_t* keep = plan.slots.data() + h * n_keep;
    std::vector<int32_t> placed(keep, keep + n_keep);
    place_kept_slots(placed.data(), n_keep, settled);
    for (int64_t j = 0; j < n_keep; ++j) {
      const int32_t* at = std::lower_bound(keep, keep + n_keep, placed[j]);
      order[h * n_keep + j] = static_cast<int32_t>(at - keep);
    }
  }
  return order;
}

void retain_rows_in_place(float* k, float* v, int32_t* positions, int32_t n_kv_heads,
                          int32_t head_dim, int64_t capacity,
                          [[maybe_unused]] int64_t n_tokens, RetainPlan& plan, int64_t settled) {
  assert(plan.n_keep <= n_tokens);
  assert(static_cast<int64_t>(plan.slots.size()) == plan.n_keep * n_kv_heads);
  assert(plan.k.empty() || plan.k.size() == plan.slots.size() * head_dim);
  if (settled < 0) settled = plan.n_keep;
  const size_t row_bytes = head_dim * sizeof(float);
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    int32_t* keep = plan.slots.data() + h * plan.n_keep;
    const size_t head = static_cast<size_t>(h) * capacity;
    for (int64_t j = 0; j < plan.n_keep; ++j) {
      assert(keep[j] >= 0 && keep[j] < n_tokens && (j == 0 || keep[j] > keep[j - 1]));
    }
    if (!plan.k.empty()) {  // merged contents go to the kept slots before they move
      for (int64_t j = 0; j < plan.n_keep; ++j) {
        const size_t from = (static_cast<size_t>(h) * plan.n_keep + j) * head_dim;
        std::memcpy(k + (head + keep[j]) * head_dim, &plan.k[from], row_bytes);
        std::memcpy(v + (head + keep[j]) * head_dim, &plan.v[from], row_bytes);
      }
    }
    place_kept_slots(keep, plan.n_keep, settled);
    // Ascending j: a row is read before any write reaches it (keep[j] >= j, and the rows
    // the holes take lie past `settled`, where writes start only after the holes are filled).
    for (int64_t j = 0; j < plan.n_keep; ++j) {
      const int32_t from = keep[j];
      if (from == j) continue;
      std::memcpy(k + (head + j) * head_dim, k + (head + from) * head_dim, row_bytes);
      std::memcpy(v + (head + j) * head_dim, v + (head + from) * head_dim, row_bytes);
      positions[head + j] = positions[head + from];
    }
  }
}

void DenseLayerKv::retain(RetainPlan& plan) {
  evicted_ = true;
  if (plan.ragged() && !ragged()) {
    if (!plan.k.empty()) throw std::invalid_argument("DenseLayerKv::retain: a ragged plan merges");
    split_heads(plan);
    return;
  }
  if (!ragged()) {
    retain_rows_in_place(rows_.k.data(), rows_.v.data(), rows_.positions.data(), rows_.n_kv_heads,
                         rows_.head_dim, rows_.capacity, rows_.n_tokens, plan);
    rows_.n_tokens = plan.n_keep;
    if (retain_shrinks(rows_.capacity, rows_.n_tokens)) rows_.reallocate(rows_.n_tokens);
    return;
  }
  // Heads of their own: each applies its row of the plan as a one-head store would, and
  // plan.slots takes each head's placement.
  const auto n_heads = static_cast<int32_t>(heads_.size());
  retain_head_by_head(plan, n_heads, rows_.head_dim, [&](int32_t h, RetainPlan& one) {
    HeadRows& head = heads_[h];
    retain_rows_in_place(head.k.data(), head.v.data(), head.positions.data(), 1, head.head_dim,
                         head.capacity, head.n_tokens, one);
    head.n_tokens = one.n_keep;
    if (retain_shrinks(head.capacity, head.n_tokens)) head.reallocate(head.n_tokens);
  });
}

DenseKv DenseLayerKv::view() const {
  if (ragged()) {
    return DenseKv{nullptr, nullptr, nullptr, rows_.n_kv_heads, rows_.head_dim, 0, n_tokens()};
  }
  return rows_.view();
}

DenseKv DenseLayerKv::heads_view() const {
  if (!ragged()) return view();
  std::vector<DenseKv> heads;
  heads.reserve(heads_.size());
  for (const HeadRows& head : heads_) heads.push_back(head.view());
  return ragged_view_.gather(heads);
}

std::unique_ptr<LayerKv> DenseLayerKv::clone() const {
  return std::make_unique<DenseLayerKv>(*this);
}

DenseKv DenseLayerKv::head_view(int32_t head) const {
  if (ragged()) return heads_[head].view();
  const int64_t at = static_cast<int64_t>(head) * rows_.capacity;
  return DenseKv{rows_.k.data() + at * rows_.head_dim, rows_.v.data() + at * rows_.head_dim,
                 rows_.positions.data() + at, 1, rows_.head_dim, rows_.capacity, rows_.n_tokens};
}

namespace {
// Bytes attention reads per stored token of one KV head: its key, value and position.
int64_t token_bytes(int32_t head_dim) { return 2LL * head_dim * sizeof(float) + sizeof(int32_t); }
}  // namespace

int64_t DenseLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  const int64_t token_bytes = kvbench::token_bytes(rows_.head_dim);
  if (ragged()) {
    if (pages) throw std::logic_error("DenseLayerKv::attend: pages over heads of their own");
    std::vector<DenseKv> heads;
    int64_t slots = 0;
    for (const HeadRows& head : heads_) {
      heads.push_back(head.view());
      slots += head.n_tokens;
    }
    attention_ragged_cpu(query, heads.data(), static_cast<int32_t>(heads.size()));
    return token_bytes * slots;
  }
  if (!pages) {
    attention_dense_cpu(query, view());
    return token_bytes * rows_.n_kv_heads * rows_.n_tokens;
  }
  attention_pages_cpu(query, view(), *pages);
  return token_bytes * selected_slots(*pages, rows_.n_kv_heads, rows_.n_tokens);
}

int64_t DenseLayerKv::attend_scored(const AttentionQuery& query, float* scores) const {
  if (ragged()) return -1;
  attention_dense_scored_cpu(query, view(), scores);
  return token_bytes(rows_.head_dim) * rows_.n_kv_heads * rows_.n_tokens;
}

int64_t selected_slots(const PageSelection& pages, int32_t n_kv_heads, int64_t n_tokens) {
  int64_t slots = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(n_kv_heads) * pages.n_selected; ++i) {
    const int64_t first = static_cast<int64_t>(pages.pages[i]) * pages.page_tokens;
    slots += std::min<int64_t>(pages.page_tokens, n_tokens - first);
  }
  return slots;
}

std::vector<std::unique_ptr<LayerKv>> make_dense_layers(const KvShape& shape) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<DenseLayerKv>(shape.n_kv_heads, shape.head_dim));
  }
  return layers;
}

KvCache make_full_cache(const KvShape& shape) { return KvCache(shape, make_dense_layers(shape)); }

}  // namespace kvbench
