// pca_kv: keys and values held as low-rank coefficients along head_dim, the basis fitted
// training-free on the context itself. When the context has ended (the store's first
// settle), each KV head's keys and values get their own mean and leading `rank` principal
// directions (kernels/cpu/low_rank.h); every row kept is then stored as `rank` fp32
// coefficients, and later tokens are projected as they arrive. Memory is rank / head_dim of
// the fp32 rows, plus the bases.
//
// Attention never rebuilds the keys: a query is projected onto the key basis (its dot
// product with the mean is the same for every row, so softmax drops it), attends over the
// coefficient rows with the dense kernel, and the output's value coefficients are mapped
// back through the value basis (the weights sum to one, so the mean comes back whole).
// Policies in front (snapkv:ratio=0.5+pca_kv) decide on the fp32 context before it is
// projected, as with KIVI. No authors' code: kvbench's rule for issue 23's "training-free
// low-rank projection of K and V along head_dim".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"
#include "kernels/cpu/low_rank.h"

namespace kvbench {

class PcaLayerKv : public LayerKv {
 public:
  PcaLayerKv(int32_t n_kv_heads, int32_t head_dim, int32_t rank);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;
  void settle() override;
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return fitted_ ? coef_.n_tokens : rows_.n_tokens; }
  int64_t bytes_resident() const override;

  bool fitted() const { return fitted_; }

 private:
  // One KV head's key or value basis.
  struct Basis {
    std::vector<float> mean, basis;  // [head_dim], [rank, head_dim]
  };
  LowRankBasis layout(const Basis& b) const {
    return LowRankBasis{b.mean.data(), b.basis.data(), head_dim_, rank_};
  }
  void fit();
  void grow(HeadRows& rows, int64_t need);
  // k, v [n, n_kv_heads, head_dim] -> coefficients [n, n_kv_heads, rank] each.
  void project(const float* k, const float* v, int64_t n, std::vector<float>& ck,
               std::vector<float>& cv) const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  int32_t rank_;
  bool fitted_ = false;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack

  HeadRows rows_;  // before the fit: fp32 rows
  HeadRows coef_;  // after: keys' and values' coefficients (head_dim = rank)
  std::vector<Basis> key_bases_, value_bases_;  // [n_kv_heads]

  mutable std::vector<float> view_k_, view_v_;  // rows rebuilt for a policy, until settle()
};

std::vector<std::unique_ptr<LayerKv>> make_pca_layers(const KvShape& shape, int32_t rank);

}  // namespace kvbench
