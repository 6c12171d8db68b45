#include "cache/head_split.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cache/policy.h"

namespace kvbench {

namespace {

class HostMemory : public RowMemory {
 public:
  std::shared_ptr<float> floats(int64_t n) const override {
    return std::shared_ptr<float>(new float[static_cast<size_t>(n)],
                                  std::default_delete<float[]>());
  }
  void copy_rows(float* to, int64_t to_stride, const float* from, int64_t from_stride,
                 int64_t width, int64_t n_rows) const override {
    for (int64_t i = 0; i < n_rows; ++i) {
      std::copy_n(from + i * from_stride, width, to + i * to_stride);
    }
  }
};

}  // namespace

const std::shared_ptr<const RowMemory>& host_memory() {
  static const std::shared_ptr<const RowMemory> memory = std::make_shared<HostMemory>();
  return memory;
}

HeadSplitLayerKv::HeadSplitLayerKv(std::unique_ptr<LayerKv> whole, int32_t n_kv_heads,
                                   int32_t head_dim, std::shared_ptr<const RowMemory> memory)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      memory_(std::move(memory)),
      whole_(std::move(whole)) {}

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
  const int64_t row = static_cast<int64_t>(n_kv_heads_) * head_dim_;
  const std::shared_ptr<float> head_k = memory_->floats(n_new * head_dim_);
  const std::shared_ptr<float> head_v = memory_->floats(n_new * head_dim_);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    memory_->copy_rows(head_k.get(), head_dim_, k + h * head_dim_, row, head_dim_, n_new);
    memory_->copy_rows(head_v.get(), head_dim_, v + h * head_dim_, row, head_dim_, n_new);
    heads_[h]->append(head_k.get(), head_v.get(), positions, n_new);
  }
}

int64_t HeadSplitLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  if (!split()) return whole_->attend(query, pages);
  if (pages) throw std::logic_error("HeadSplitLayerKv::attend: pages over heads of their own");
  const int32_t group = query.n_heads / n_kv_heads_;
  const int64_t row = static_cast<int64_t>(query.n_heads) * head_dim_;
  const int64_t group_row = static_cast<int64_t>(group) * head_dim_;
  const std::shared_ptr<float> q = memory_->floats(query.n_queries * group_row);
  const std::shared_ptr<float> out = memory_->floats(query.n_queries * group_row);
  int64_t bytes = 0;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int64_t first = h * group_row;
    memory_->copy_rows(q.get(), group_row, query.q + first, row, group_row, query.n_queries);
    const AttentionQuery one{q.get(), query.q_positions, out.get(), query.n_queries, group,
                             query.scale};
    bytes += heads_[h]->attend(one, nullptr);
    memory_->copy_rows(query.out + first, row, out.get(), group_row, group_row, query.n_queries);
  }
  return bytes;
}

void HeadSplitLayerKv::retain(RetainPlan& plan) {
  if (!split() && !plan.ragged()) {
    whole_->retain(plan);
    return;
  }
  if (!split()) {  // the first ragged plan: each head into a store of its own
    if (!plan.k.empty()) {
      throw std::invalid_argument("HeadSplitLayerKv::retain: a ragged plan merges");
    }
    std::vector<std::unique_ptr<LayerKv>> heads;
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      heads.push_back(whole_->head_store(h));
      if (!heads.back()) {
        throw std::logic_error("HeadSplitLayerKv: the store cannot hold its heads apart");
      }
    }
    heads_ = std::move(heads);
    whole_.reset();
  }
  retain_head_by_head(plan, n_kv_heads_, head_dim_,
                      [&](int32_t h, RetainPlan& one) { heads_[h]->retain(one); });
}

DenseKv HeadSplitLayerKv::view() const {
  if (!split()) return whole_->view();
  return DenseKv{nullptr, nullptr, nullptr, n_kv_heads_, head_dim_, 0, n_tokens()};
}

DenseKv HeadSplitLayerKv::heads_view() const {
  if (!split()) return whole_->heads_view();
  if (std::string(tier()) != "ram") return view();
  std::vector<DenseKv> heads;
  heads.reserve(heads_.size());
  for (const auto& head : heads_) heads.push_back(head->view());
  return ragged_view_.gather(heads);
}

void HeadSplitLayerKv::settle() {
  ragged_view_.clear();
  if (!split()) {
    whole_->settle();
    return;
  }
  for (auto& head : heads_) head->settle();
}

std::unique_ptr<LayerKv> HeadSplitLayerKv::clone() const {
  if (!split()) {
    return std::make_unique<HeadSplitLayerKv>(whole_->clone(), n_kv_heads_, head_dim_, memory_);
  }
  std::unique_ptr<HeadSplitLayerKv> copy(new HeadSplitLayerKv(n_kv_heads_, head_dim_, memory_));
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
    std::vector<std::unique_ptr<LayerKv>> layers, int32_t n_kv_heads, int32_t head_dim,
    const std::shared_ptr<const RowMemory>& memory) {
  for (auto& layer : layers) {
    layer = std::make_unique<HeadSplitLayerKv>(std::move(layer), n_kv_heads, head_dim, memory);
  }
  return layers;
}

}  // namespace kvbench
