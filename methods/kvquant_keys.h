// kvquant_keys: KVQuant's store (Hooper et al., "KVQuant: Towards 10 Million Context Length
// LLM Inference with KV Cache Quantization", NeurIPS 2024, arXiv 2401.18079), after the
// authors' simulated quantization (SqueezeAILab/KVQuant, quant/kvquant/simquant_module_
// quantizer.py):
// - keys before RoPE, per channel: the model hands the store rotated keys, which it turns
//   back by their positions (the model's RoPE, KvShape::rope_inv_freq) and holds as codes
//   against one range per channel and KV head; attention turns each decoded key tile to its
//   positions again (kernels/cpu/kvquant.h). Per-channel ranges are what let each token be
//   quantized alone, as it comes, with no fp32 window waiting for a block;
// - dense-and-sparse: a key value outside its channel's range is kept apart in fp16, in
//   sparse rows (the authors' per-channel outlier thresholds); of each value row (one token
//   of one KV head, quantized per token) the largest and smallest are kept apart likewise;
// - the first `sink` positions whole in fp16 (attention-sink-aware quantization, the authors'
//   first_few_fp16).
// kvbench is training-free: the per-channel ranges come from the context itself, the
// `outliers` / 2 and 1 - `outliers` / 2 percentiles of each channel's keys once the context
// has ended (the authors calibrate them offline), the codes are uniform over the range
// (the authors' nuq datatypes and Q-Norm are fitted offline with Fisher information too).
// Until that fit the store holds the fp32 rows, so the context attends over itself in fp32
// (as KIVI's prefill) and a policy in front plans on them (snapkv:ratio=0.25+kvquant_keys).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"
#include "kernels/cpu/kvquant.h"

namespace kvbench {

struct KvQuantConfig {
  int32_t bits = 3;
  double outliers = 0.01;  // share of values kept apart in fp16 (the authors' 1 - sparsity)
  int64_t sink = 1;        // first positions kept whole in fp16
};

// Keys before the fit needs at least this many tokens past the sink per KV head: the
// percentiles of fewer leave every later key outside the ranges.
constexpr int64_t kKvQuantMinFitTokens = 16;

class KvQuantLayerKv : public LayerKv {
 public:
  // rope: the RoPE angle tables of the model (fill_rope_angles), shared by every layer.
  KvQuantLayerKv(int32_t n_kv_heads, int32_t head_dim, const KvQuantConfig& config,
                 std::shared_ptr<const std::vector<double>> rope);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;
  void settle() override;
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return fitted_ ? n_tokens_ : rows_.n_tokens; }
  int64_t bytes_resident() const override;

  bool fitted() const { return fitted_; }
  // The quantized store (after the fit); heads: its rows of outliers, filled here.
  KvQuantKv layout(std::vector<SparseRows>& heads) const;
  // Per KV head, the key ranges fitted: [n_kv_heads, head_dim] each.
  const std::vector<float>& key_min() const { return k_min_; }
  const std::vector<float>& key_max() const { return k_max_; }

 private:
  // One KV head's outliers (SparseRows).
  struct Outliers {
    std::vector<int32_t> start;  // [n_tokens + 1], room for capacity + 1
    std::vector<uint16_t> channel, value;
  };

  RopeAngles rope() const { return RopeAngles{rope_->data(), head_dim_ / 2}; }
  KvQuantEncoding encoding(int32_t head) const;
  int64_t row_bytes() const { return static_cast<int64_t>(head_dim_) * config_.bits / 8; }
  void fit();
  void reallocate(int64_t capacity);
  // Encodes key (before RoPE) and value rows of one head into slot `slot`, its outliers
  // appended to `to` (the slot's row is the last in to.start).
  void encode(int32_t head, int64_t slot, const float* k, const float* v, Outliers& to);
  void drop_view() const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  KvQuantConfig config_;
  int32_t value_outliers_;  // per side of each value row
  std::shared_ptr<const std::vector<double>> rope_;
  bool fitted_ = false;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack

  HeadRows rows_;  // before the fit: the fp32 rows as handed (keys after RoPE)

  // After the fit, KvQuantKv's arrays.
  int64_t capacity_ = 0, n_tokens_ = 0;
  std::vector<uint8_t> k_codes_, v_codes_;      // [n_kv_heads, capacity, row_bytes]
  std::vector<float> v_scale_, v_min_;          // [n_kv_heads, capacity]
  std::vector<int32_t> positions_;              // [n_kv_heads, capacity]
  std::vector<float> k_min_, k_max_, k_scale_;  // [n_kv_heads, head_dim]
  std::vector<Outliers> outliers_;              // [n_kv_heads]

  mutable std::vector<float> view_k_, view_v_;  // rows decoded for a policy, until settle()
};

class MethodParams;

KvQuantConfig kvquant_config_from(const MethodParams& params);

// A KVQuant store per layer, empty. shape.rope_inv_freq must hold head_dim / 2 frequencies.
std::vector<std::unique_ptr<LayerKv>> make_kvquant_layers(const KvShape& shape,
                                                          const KvQuantConfig& config);

}  // namespace kvbench
