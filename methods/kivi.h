// KIVI's store (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
// Cache", ICML 2024): keys quantized per channel and values per token, asymmetric min/max
// in groups of 32, 2 or 4 bits, really packed (kernels/layouts.h, KiviKv). The most recent
// tokens stay in fp32: a block of 32 is packed once `residual` newer tokens follow it, so
// between residual and residual + 31 of the newest tokens are fp32 (KIVI's residual).
//
// Attention reads the packed blocks through the fused kernel (kernels/cpu/kivi_attention).
// A policy in front (snapkv:budget=1024+kivi:bits=2) plans on the fp32 KV of the context
// before anything is packed; later evictions unpack the blocks they touch and pack them
// again, which adds that block's quantization error once more.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "methods/head_rows.h"
#include "methods/kv_cache.h"

namespace kvbench {

struct KiviConfig {
  int32_t bits = 2;
  int32_t group = 32;      // tokens per key group, channels per value group
  int64_t residual = 128;  // newest tokens kept in fp32
};

class KiviLayerKv : public LayerKv {
 public:
  KiviLayerKv(int32_t n_kv_heads, int32_t head_dim, const KiviConfig& config);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;
  void settle() override;
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return n_blocks_ * config_.group + tail_.n_tokens; }
  int64_t bytes_resident() const override;

  KiviKv layout() const;
  int64_t n_blocks() const { return n_blocks_; }

 private:
  // Packs rows [0, group) of each head of k, v ([n_kv_heads, stride, head_dim]) and their
  // positions into block b.
  void pack_block(int64_t b, int32_t head, const float* k, const float* v,
                  const int32_t* positions);
  void resize_blocks(int64_t n_blocks);
  void drop_view() const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  KiviConfig config_;

  // Packed blocks, block-major: block b of KV head h at (b * n_kv_heads + h) * per-block.
  int64_t n_blocks_ = 0;
  int64_t block_capacity_ = 0;
  std::vector<uint8_t> k_codes_, v_codes_;
  std::vector<float> k_scale_, k_min_, v_scale_, v_min_;
  std::vector<int32_t> block_positions_;

  // The fp32 tail: the newest tokens, in DenseKv's layout.
  HeadRows tail_;

  // Everything unpacked, while a policy looks at it (view) until settle().
  mutable std::vector<float> view_k_, view_v_;
  mutable std::vector<int32_t> view_positions_;
};

class MethodParams;

// The store's configuration from a `kivi:` spec's parameters.
KiviConfig kivi_config_from(const MethodParams& params);

// A KIVI store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_kivi_layers(const KvShape& shape,
                                                       const KiviConfig& config);

}  // namespace kvbench
