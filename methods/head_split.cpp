#include "methods/head_split.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "methods/policy.h"

namespace kvbench {

namespace {

// Rows of one head out of rows interleaved by head ([n, n_heads, dim] -> [n, group, dim]
// for heads first.. first + group), and back.
void gather_heads(const float* from, int64_t n, int32_t n_heads, int32_t first, int32_t group,
                  int32_t dim, float* to) {
  const int64_t row = static_cast<int64_t>(group) * dim;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(from + (i * n_heads + first) * dim, row, to + i * row);
  }
}

void scatter_heads(const float* from, int64_t n, int32_t n_heads, int32_t first, int32_t group,
                   int32_t dim, float* to) {
  const int64_t row = static_cast<int64_t>(group) * dim;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(from + i * row, row, to + (i * n_heads + first) * dim);
  }
}

}  // namespace

HeadSplitLayerKv::HeadSplitLayerKv(std::unique_ptr<LayerKv> whole, int32_t n_kv_heads,
                                   int32_t head_dim)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim), whole_(std::move(whole)) {
  if (!whole_->head_store(0)) {
    throw std::invalid_argument("HeadSplitLayerKv: the store cannot hold its heads apart");
  }
}

void HeadSplitLayerKv::reserve(int64_t n_tokens) {
  if (!split()) {
    whole_->reserve(n_tokens);
    return;
  }
  const int64_t more = n_tokens - this->n_tokens();  // as many more as the longest head
  for (auto& head : heads_) head->reserve(head->n_tokens() + more);
}

void HeadSplitLayerKv::append(const float* k, const float* v, const int32_t* positions,
                              int64_t n_new) {
  if (!split()) {
    whole_->append(k, v, positions, n_new);
    return;
  }
  std::vector<float> head_k(static_cast<size_t>(n_new * head_dim_)), head_v(head_k.size());
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    gather_heads(k, n_new, n_kv_heads_, h, 1, head_dim_, head_k.data());
    gather_heads(v, n_new, n_kv_heads_, h, 1, head_dim_, head_v.data());
    heads_[h]->append(head_k.data(), head_v.data(), positions, n_new);
  }
}

int64_t HeadSplitLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  if (!split()) return whole_->attend(query, pages);
  if (pages) throw std::logic_error("HeadSplitLayerKv::attend: pages over heads of their own");
  const int32_t group = query.n_heads / n_kv_heads_;
  const size_t n = static_cast<size_t>(query.n_queries) * group * head_dim_;
  std::vector<float> q(n), out(n);
  int64_t bytes = 0;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    gather_heads(query.q, query.n_queries, query.n_heads, h * group, group, head_dim_, q.data());
    const AttentionQuery one{q.data(), query.q_positions, out.data(), query.n_queries, group,
                             query.scale};
    bytes += heads_[h]->attend(one, nullptr);
    scatter_heads(out.data(), query.n_queries, query.n_heads, h * group, group, head_dim_,
                  query.out);
  }
  return bytes;
}

void HeadSplitLayerKv::retain(RetainPlan& plan) {
  if (!split() && !plan.ragged()) {
    whole_->retain(plan);
    return;
  }
  if (!split()) {  // the first ragged plan: each head into a store of its own
    if (!plan.k.empty()) throw std::invalid_argument("HeadSplitLayerKv::retain: a ragged plan merges");
    for (int32_t h = 0; h < n_kv_heads_; ++h) heads_.push_back(whole_->head_store(h));
    whole_.reset();
  }
  // Each head applies its row as a one-head store does; plan.slots takes each placement.
  std::vector<int32_t> placed;
  placed.reserve(plan.slots.size());
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    RetainPlan one = one_head_plan(plan, h, head_dim_);
    heads_[h]->retain(one);
    placed.insert(placed.end(), one.slots.begin(), one.slots.end());
  }
  plan.slots = std::move(placed);
}

DenseKv HeadSplitLayerKv::view() const {
  if (!split()) return whole_->view();
  return DenseKv{nullptr, nullptr, nullptr, n_kv_heads_, head_dim_, 0, n_tokens()};
}

void HeadSplitLayerKv::settle() {
  if (!split()) {
    whole_->settle();
    return;
  }
  for (auto& head : heads_) head->settle();
}

std::unique_ptr<LayerKv> HeadSplitLayerKv::clone() const {
  if (!split()) return std::make_unique<HeadSplitLayerKv>(whole_->clone(), n_kv_heads_, head_dim_);
  std::unique_ptr<HeadSplitLayerKv> copy(new HeadSplitLayerKv(n_kv_heads_, head_dim_));
  for (const auto& head : heads_) copy->heads_.push_back(head->clone());
  return copy;
}

int64_t HeadSplitLayerKv::n_tokens() const {
  if (!split()) return whole_->n_tokens();
  int64_t most = 0;
  for (const auto& head : heads_) most = std::max(most, head->n_tokens());
  return most;
}

int64_t HeadSplitLayerKv::n_tokens_held() const {
  if (!split()) return whole_->n_tokens_held();
  int64_t most = 0;
  for (const auto& head : heads_) most = std::max(most, head->n_tokens_held());
  return most;
}

int64_t HeadSplitLayerKv::head_tokens(int32_t head) const {
  return split() ? heads_[head]->n_tokens_held() : whole_->head_tokens(head);
}

int64_t HeadSplitLayerKv::bytes_resident() const {
  if (!split()) return whole_->bytes_resident();
  int64_t bytes = 0;
  for (const auto& head : heads_) bytes += head->bytes_resident();
  return bytes;
}

std::vector<std::unique_ptr<LayerKv>> split_heads_on_ragged_plans(
    std::vector<std::unique_ptr<LayerKv>> layers, int32_t n_kv_heads, int32_t head_dim) {
  for (auto& layer : layers) {
    layer = std::make_unique<HeadSplitLayerKv>(std::move(layer), n_kv_heads, head_dim);
  }
  return layers;
}

}  // namespace kvbench
