#include "methods/pca_kv.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/low_rank.h"

namespace kvbench {

PcaLayerKv::PcaLayerKv(int32_t n_kv_heads, int32_t head_dim, int32_t rank)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      rank_(rank),
      rows_(n_kv_heads, head_dim),
      coef_(n_kv_heads, rank) {}

void PcaLayerKv::grow(HeadRows& rows, int64_t need) {
  if (need > rows.capacity) rows.reallocate(grown_capacity(rows.capacity, need, evicted_));
}

void PcaLayerKv::reserve(int64_t n_tokens) {
  HeadRows& rows = fitted_ ? coef_ : rows_;
  if (n_tokens > rows.capacity) rows.reallocate(n_tokens);
}

void PcaLayerKv::project(const float* k, const float* v, int64_t n, std::vector<float>& ck,
                         std::vector<float>& cv) const {
  ck.resize(n * n_kv_heads_ * rank_);
  cv.resize(ck.size());
  const int64_t stride = static_cast<int64_t>(n_kv_heads_) * head_dim_;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const LowRankBasis kb = layout(key_bases_[h]);
    const LowRankBasis vb = layout(value_bases_[h]);
    // Row t of head h goes to [t, h, :] of the coefficient chunk.
    std::vector<float> ch(n * rank_), vh(n * rank_);
    project_rows(kb, k + h * head_dim_, stride, n, ch.data());
    project_rows(vb, v + h * head_dim_, stride, n, vh.data());
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(&ch[t * rank_], rank_, &ck[(t * n_kv_heads_ + h) * rank_]);
      std::copy_n(&vh[t * rank_], rank_, &cv[(t * n_kv_heads_ + h) * rank_]);
    }
  }
}

void PcaLayerKv::append(const float* k, const float* v, const int32_t* positions,
                        int64_t n_new) {
  view_k_ = {};
  view_v_ = {};
  if (!fitted_) {
    grow(rows_, rows_.n_tokens + n_new);
    rows_.append(k, v, positions, n_new);
    return;
  }
  std::vector<float> ck, cv;
  project(k, v, n_new, ck, cv);
  grow(coef_, coef_.n_tokens + n_new);
  coef_.append(ck.data(), cv.data(), positions, n_new);
}

int64_t PcaLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  if (!fitted_) {
    pages ? attention_pages_cpu(query, rows_.view(), *pages)
          : attention_dense_cpu(query, rows_.view());
    const int64_t token_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
    return token_bytes * (pages ? selected_slots(*pages, n_kv_heads_, rows_.n_tokens)
                                : n_kv_heads_ * rows_.n_tokens);
  }
  // Queries onto each KV head's key basis, attention over the coefficients, outputs back
  // through the value basis.
  const int32_t group = query.n_heads / n_kv_heads_;
  const int64_t n_rows = static_cast<int64_t>(query.n_queries) * query.n_heads;
  std::vector<float> q(n_rows * rank_), out(n_rows * rank_);
  for (int32_t h = 0; h < query.n_heads; ++h) {
    const Basis& b = key_bases_[h / group];
    const LowRankBasis kb = layout(b);
    for (int32_t i = 0; i < query.n_queries; ++i) {
      const int64_t row = static_cast<int64_t>(i) * query.n_heads + h;
      project_queries(kb, query.q + row * head_dim_, head_dim_, 1, &q[row * rank_]);
    }
  }
  const AttentionQuery projected{q.data(), query.q_positions, out.data(), query.n_queries,
                                 query.n_heads, query.scale};
  pages ? attention_pages_cpu(projected, coef_.view(), *pages)
        : attention_dense_cpu(projected, coef_.view());
  for (int32_t h = 0; h < query.n_heads; ++h) {
    const Basis& b = value_bases_[h / group];
    const LowRankBasis vb = layout(b);
    for (int32_t i = 0; i < query.n_queries; ++i) {
      const int64_t row = static_cast<int64_t>(i) * query.n_heads + h;
      reconstruct_rows(vb, &out[row * rank_], 1, query.out + row * head_dim_, head_dim_);
    }
  }
  const int64_t token_bytes = 2LL * rank_ * sizeof(float) + sizeof(int32_t);
  return token_bytes * (pages ? selected_slots(*pages, n_kv_heads_, coef_.n_tokens)
                              : n_kv_heads_ * coef_.n_tokens);
}

void PcaLayerKv::retain(RetainPlan& plan) {
  view_k_ = {};
  view_v_ = {};
  HeadRows& rows = fitted_ ? coef_ : rows_;
  if (fitted_ && !plan.k.empty()) {
    // Merged contents arrive as rows [n_kv_heads, n_keep, head_dim]: stored as coefficients.
    std::vector<float> ck(plan.k.size() / head_dim_ * rank_), cv(ck.size());
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int64_t at = static_cast<int64_t>(h) * plan.n_keep;
      const LowRankBasis kb = layout(key_bases_[h]);
      const LowRankBasis vb = layout(value_bases_[h]);
      project_rows(kb, &plan.k[at * head_dim_], head_dim_, plan.n_keep, &ck[at * rank_]);
      project_rows(vb, &plan.v[at * head_dim_], head_dim_, plan.n_keep, &cv[at * rank_]);
    }
    plan.k.swap(ck);
    plan.v.swap(cv);
  }
  retain_rows_in_place(rows.k.data(), rows.v.data(), rows.positions.data(), n_kv_heads_,
                       rows.head_dim, rows.capacity, rows.n_tokens, plan);
  rows.n_tokens = plan.n_keep;
  evicted_ = true;
  if (retain_shrinks(rows.capacity, rows.n_tokens)) rows.reallocate(rows.n_tokens);
}

DenseKv PcaLayerKv::view() const {
  if (!fitted_) return rows_.view();
  // Rebuilt at the coefficients' capacity, so the positions are read in place.
  const int64_t n = coef_.n_tokens, capacity = coef_.capacity;
  if (view_k_.empty() && n > 0) {
    view_k_.resize(n_kv_heads_ * capacity * head_dim_);
    view_v_.resize(view_k_.size());
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int64_t row = h * capacity;
      const LowRankBasis kb = layout(key_bases_[h]);
      const LowRankBasis vb = layout(value_bases_[h]);
      reconstruct_rows(kb, &coef_.k[row * rank_], n, &view_k_[row * head_dim_], head_dim_);
      reconstruct_rows(vb, &coef_.v[row * rank_], n, &view_v_[row * head_dim_], head_dim_);
    }
  }
  return DenseKv{view_k_.data(), view_v_.data(), coef_.positions.data(), n_kv_heads_, head_dim_,
                 capacity,       n};
}

void PcaLayerKv::fit() {
  key_bases_.assign(n_kv_heads_, Basis{});
  value_bases_.assign(n_kv_heads_, Basis{});
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    for (auto* bases : {&key_bases_, &value_bases_}) {
      Basis& b = (*bases)[h];
      b.mean.resize(head_dim_);
      b.basis.resize(static_cast<size_t>(rank_) * head_dim_);
      const std::vector<float>& x = bases == &key_bases_ ? rows_.k : rows_.v;
      fit_low_rank_basis(x.data() + h * rows_.capacity * head_dim_, head_dim_, rows_.n_tokens,
                         head_dim_, rank_, b.mean.data(), b.basis.data());
    }
  }
  // The rows held so far become coefficients, in the same slots.
  coef_.reallocate(rows_.n_tokens);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int64_t from = h * rows_.capacity, to = h * coef_.capacity;
    const LowRankBasis kb = layout(key_bases_[h]);
    const LowRankBasis vb = layout(value_bases_[h]);
    // data() + offset: the buffers are empty when the context was (no &x[i] into them).
    project_rows(kb, rows_.k.data() + from * head_dim_, head_dim_, rows_.n_tokens,
                 coef_.k.data() + to * rank_);
    project_rows(vb, rows_.v.data() + from * head_dim_, head_dim_, rows_.n_tokens,
                 coef_.v.data() + to * rank_);
    std::copy_n(rows_.positions.data() + from, rows_.n_tokens, coef_.positions.data() + to);
  }
  coef_.n_tokens = rows_.n_tokens;
  rows_ = HeadRows(n_kv_heads_, head_dim_);
  fitted_ = true;
}

void PcaLayerKv::settle() {
  view_k_ = {};
  view_v_ = {};
  if (!fitted_) fit();
}

std::unique_ptr<LayerKv> PcaLayerKv::clone() const {
  auto copy = std::make_unique<PcaLayerKv>(*this);
  copy->view_k_ = {};
  copy->view_v_ = {};
  return copy;
}

int64_t PcaLayerKv::bytes_resident() const {
  int64_t bases = 0;
  for (const auto* list : {&key_bases_, &value_bases_}) {
    for (const Basis& b : *list) {
      bases += static_cast<int64_t>(b.mean.capacity() + b.basis.capacity()) * sizeof(float);
    }
  }
  return rows_.bytes() + coef_.bytes() + bases;
}

std::vector<std::unique_ptr<LayerKv>> make_pca_layers(const KvShape& shape, int32_t rank) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<PcaLayerKv>(shape.n_kv_heads, shape.head_dim, rank));
  }
  return layers;
}

// Registered as `pca_kv` (methods/method_list.cpp).
MethodInfo pca_kv_method() {
  MethodInfo info;
  info.name = "pca_kv";
  info.kind = MethodKind::Storage;
  info.stage = "2 storage (projects once the context is in) + 3 (attends in coefficient space)";
  info.summary =
      "keys and values as `rank` fp32 coefficients on a per-head PCA basis fitted on the "
      "context itself (training-free); attention runs on the coefficients";
  info.paper = "- (no authors' code: kvbench's training-free low-rank projection, issue 23)";
  info.choices = {
      "one basis per layer and KV head for keys (after RoPE, as stored) and one for values: "
      "the mean and leading principal directions of the context's rows, fitted once when the "
      "context ends; tokens after it are projected onto that basis, never refitted",
      "the context attends over itself in fp32 before the projection, as KIVI's prefill",
      "coefficients are fp32 (a 16-bit store does not compose with it: one storage method), "
      "so below rank head_dim/2 only does it hold less than the bf16 cache",
      "keys are projected after RoPE, which spreads their energy over all of head_dim: on "
      "Qwen2.5-0.5B at 512 tokens rank 32 of 64 loses Retr.KV entirely (first-token KL 13-29) "
      "and rank 48 still fails it (KL 0.13); a pre-RoPE key basis is not done",
  };
  info.params = {int_param("rank", 32, 1, 1024,
                           "coefficients per key and per value (at most head_dim)")};
  info.make_layers = [](const MethodParams& params, const KvShape& shape) {
    const int64_t rank = params.get_int("rank");
    if (rank > shape.head_dim) {
      throw InputError("pca_kv: rank=" + std::to_string(rank) + " exceeds head_dim " +
                       std::to_string(shape.head_dim));
    }
    return make_pca_layers(shape, static_cast<int32_t>(rank));
  };
  return info;
}

}  // namespace kvbench
