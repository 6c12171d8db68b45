// ZipCache (He et al., "ZipCache: Accurate and Efficient KV Cache Quantization with Salient
// Token Identification", NeurIPS 2024, arXiv 2405.14256; code ThisisBillhe/ZipCache,
// zipcache/models/modeling_llama.py and CompressUtils/): every token is quantized, the
// salient ones to 4 bits and the rest (k_unimportant_ratio 0.4) to 2 bits.
//
// Saliency is normalized attention: the attention a token receives, summed over the GQA
// group's query heads and over queries, divided by the number of queries that can see it
// (the authors' code sums the softmax rows of probe queries, the last 5% of the prompt plus
// a random 5%, and divides by L - j). Layouts, as `mixed_channelwiseQ` (keys) and
// `channel_separate_mixed_tokenwiseQ` (values) in the authors' code:
// - keys: per channel, min and step over the tokens of one precision class;
// - values: each channel divided by sqrt(max |v|) over the tokens, then per token min and
//   step over its channels.
//
// kvbench's choices (`kvbench list methods` prints them):
// - saliency from every query of the context rather than probes (what the probes estimate;
//   no random draw);
// - groups are per KV head (the authors' code flattens heads into one channel axis: per-token
//   value groups span every KV head there);
// - tokens after the context wait in fp32 until `gap` (100, the code's streaming_gap) have
//   gathered, then are scored the same way and quantized as a batch of their own; the code
//   re-quantizes the whole cache every streaming_gap steps instead, scoring the new tokens by
//   the current query's attention alone. Each batch has its own key channel ranges;
// - attention widens every batch into a scratch held for that call only, then runs the dense
//   kernel (the authors' code decompresses the whole cache before flash attention too).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"

namespace kvbench {

struct ZipCacheConfig {
  int32_t high_bits = 4;   // salient tokens
  int32_t low_bits = 2;    // the rest
  double low_ratio = 0.4;  // share of each batch's tokens at low_bits (rounded down)
  int64_t gap = 100;       // tokens after the context quantized together
};

// One layer: quantized batches, then the fp32 rows waiting for theirs. The precision
// policy (zipcache.cpp) sees and plans over the waiting rows only (view()); a plan puts the
// kept rows at high_bits and the others at low_bits, and every waiting row leaves fp32.
class ZipCacheLayerKv : public LayerKv {
 public:
  ZipCacheLayerKv(int32_t n_kv_heads, int32_t head_dim, const ZipCacheConfig& config);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  void retain(RetainPlan& plan) override;
  DenseKv view() const override { return waiting_.view(); }
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return waiting_.n_tokens; }
  int64_t n_tokens_held() const override;
  int64_t bytes_resident() const override;

  // Every held row in fp32: the batches dequantized in order (salient rows first in each),
  // then the waiting rows. Returns the layout over the given buffers.
  DenseKv widen(std::vector<float>& k, std::vector<float>& v,
                std::vector<int32_t>& positions) const;
  int64_t n_batches() const { return static_cast<int64_t>(batches_.size()); }

 private:
  // One quantization batch, per KV head: n_high salient rows at high_bits, then n_low rows at
  // low_bits; a row's codes pack head_dim values low bits first (QuantGroups' packing).
  struct Batch {
    int64_t n_high = 0, n_low = 0;
    std::vector<uint8_t> k_codes, v_codes;  // [n_kv_heads, row codes of every row]
    std::vector<float> k_min, k_step;       // [n_kv_heads, 2 classes, head_dim]
    std::vector<float> v_scale;             // [n_kv_heads, head_dim]: sqrt(max |v|)
    std::vector<float> v_min, v_step;       // [n_kv_heads, rows]
    std::vector<int32_t> positions;         // [n_kv_heads, rows]
    int64_t rows() const { return n_high + n_low; }
    int64_t bytes() const;
  };
  int64_t head_code_bytes(const Batch& b) const;
  int64_t row_code_offset(const Batch& b, int64_t row) const;  // within a head
  int32_t row_bits(const Batch& b, int64_t row) const;
  void widen_batch(const Batch& b, int32_t head, float* k, float* v, int32_t* positions) const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  ZipCacheConfig config_;
  std::vector<Batch> batches_;
  HeadRows waiting_;  // fp32 rows not yet quantized
};

}  // namespace kvbench
