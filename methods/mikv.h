// MiKV's store (Yang et al., "No Token Left Behind: Reliable KV Cache Compression via
// Importance-Aware Mixed Precision Quantization", arXiv 2402.18096): the tokens an eviction
// policy in front would drop are kept at low precision instead, so no token leaves the
// cache; the tokens it keeps stay at high precision. Any eviction policy decides
// (snapkv:ratio=0.25+mikv:bits=2, h2o:...+mikv).
//
// No authors' code is public; the paper's rule and kvbench's choices:
// - the important set stays fp32 (kvbench's full cache; MiKV holds it in the model's fp16);
// - demoted tokens are packed as KIVI packs (cache/packed_blocks.h): keys per channel over
//   blocks of 32 demoted tokens, values per token in groups of 32 channels, 2 or 4 bits,
//   asymmetric min/max. MiKV quantizes keys per token and evens out outlier channels with a
//   balancer sqrt(max|q_c| / max|k_c|) from the prefill's queries; per-channel key groups
//   handle the same outlier channels without the queries (a store never sees them);
// - demoted rows wait in fp32 until 32 of a KV head have gathered, then pack together (up
//   to 31 fp32 rows per head and layer, counted in the bytes).
//
// The policy sees and plans over the important set only (view()); attention reads both, the
// packed blocks through the fused KIVI kernel (kernels/cpu/kivi_attention.h). Causality is by
// position, so demoted tokens need no order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"
#include "cache/packed_blocks.h"

namespace kvbench {

class MikvLayerKv : public LayerKv {
 public:
  MikvLayerKv(int32_t n_kv_heads, int32_t head_dim, int32_t bits);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  // Keeps the planned slots at high precision and demotes the others (their rows wait in
  // fp32 for a whole block of 32, then pack). Kept slots keep their order, so
  // plan.slots[h * n_keep + j] is the old slot now at j, as planned.
  void retain(RetainPlan& plan) override;
  DenseKv view() const override;  // the important set, in fp32
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return rows_.n_tokens - n_pending_; }
  int64_t n_tokens_held() const override { return low_.n_blocks() * low_.group() + rows_.n_tokens; }
  int64_t bytes_resident() const override { return low_.bytes() + rows_.bytes(); }

  // The packed blocks and every fp32 row (pending, then important), as attention reads them.
  KiviKv layout() const { return low_.layout(rows_.view()); }
  int64_t n_pending() const { return n_pending_; }
  int64_t n_blocks() const { return low_.n_blocks(); }

 private:
  int32_t n_kv_heads_;
  int32_t head_dim_;
  PackedBlocks low_;       // demoted tokens, packed
  HeadRows rows_;          // per KV head: n_pending_ demoted rows, then the important set
  int64_t n_pending_ = 0;  // demoted rows per head waiting for a whole block
};

// A MiKV store per layer, empty; bits: 2 or 4 for the demoted tokens.
std::vector<std::unique_ptr<LayerKv>> make_mikv_layers(const KvShape& shape, int32_t bits);

}  // namespace kvbench
