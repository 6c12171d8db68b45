// KIVI's store (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
// Cache", ICML 2024): keys quantized per channel and values per token, asymmetric min/max
// in groups of 32, 2 or 4 bits, really packed (kernels/layouts.h, KiviKv), the newest
// tokens in fp32 (KIVI's residual R).
//
// Which tokens are quantized (`tail`):
// - kivi (default, KIVI's code): keys wait in fp32 until R have gathered, then go to 2/4
//   bits together (0 to R - 1 fp32 keys); exactly the newest R values stay fp32. The packed
//   layout holds a block of 32 only when both its keys and values are quantized, so the
//   rows between hold their quantized values rounded back to fp32 ("rounded" rows): the
//   numbers attention sees are KIVI's, the bytes count up to R + 31 fp32 rows.
// - block: keys and values of the newest R to R + 31 tokens stay fp32, a block of 32
//   packed once R newer tokens follow it (kvbench's rule before; kinder to accuracy).
//
// Attention reads the packed blocks through the fused kernel (kernels/cpu/kivi_attention).
// The context attends over itself in fp32 (KvCache settles the stores once it has ended,
// as KIVI's prefill attention is full precision). A policy in front
// (snapkv:budget=1024+kivi:bits=2) plans on the fp32 KV of the context before anything is
// packed; later evictions unpack the blocks they touch and pack them again, which adds
// that block's quantization error once more. Slots stay in position order past the packed
// blocks, so the newest tokens are the fp32 ones under any eviction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"
#include "cache/packed_blocks.h"

namespace kvbench {

// Which of the newest tokens stay fp32 (see above).
enum class KiviTail { Kivi, Block };

struct KiviConfig {
  int32_t bits = 2;
  int32_t group = 32;      // tokens per key group, channels per value group
  int64_t residual = 128;  // KIVI's residual length R
  KiviTail tail = KiviTail::Kivi;
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
  bool settle_each_chunk() override {
    each_chunk_ = true;
    return true;
  }
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return blocks_.n_blocks() * config_.group + tail_.n_tokens; }
  int64_t bytes_resident() const override;
  std::unique_ptr<LayerKv> head_store(int32_t head) const override;

  KiviKv layout() const;
  int64_t n_blocks() const { return blocks_.n_blocks(); }

 private:
  void drop_view() const;
  // KiviTail::Kivi: rounds the tail rows whose keys or values KIVI has quantized by now.
  void round_quantized_rows();

  int32_t n_kv_heads_;
  int32_t head_dim_;
  KiviConfig config_;
  bool each_chunk_ = false;  // settles after every context chunk (settle_each_chunk)

  PackedBlocks blocks_;  // the oldest tokens, packed

  // The fp32 tail: the newest tokens, in position order, in DenseKv's layout.
  HeadRows tail_;
  // Per KV head, the leading tail rows whose keys (values) hold their quantized values
  // rounded to fp32 (KiviTail::Kivi).
  std::vector<int64_t> keys_rounded_, values_rounded_;

  // Everything unpacked, while a policy looks at it (view) until settle().
  mutable std::vector<float> view_k_, view_v_;
  mutable std::vector<int32_t> view_positions_;
};

// Of n_tokens stored, how many KIVI's code holds with quantized keys: whole groups of
// `residual`, the rest waiting in fp32 (all of them when residual is 0).
inline int64_t kivi_keys_quantized(int64_t residual, int64_t n_tokens) {
  return residual > 0 ? n_tokens - n_tokens % residual : n_tokens;
}

// Slots [0, kivi_quantized_slots(...)) of n_tokens have both keys and values quantized
// (whole blocks of them are packed): under KiviTail::Block all but the newest `residual`.
inline int64_t kivi_quantized_slots(const KiviConfig& config, int64_t n_tokens) {
  const int64_t r = config.residual;
  if (config.tail == KiviTail::Block) return n_tokens - r;
  return std::min(kivi_keys_quantized(r, n_tokens), n_tokens - r);
}

// The tail rows of one KV head a KiviTail::Kivi store rounds at settle: keys in groups of
// `group` rows [keys_from, keys_to), values row by row [values_from, values_to). A group an
// eviction left partly rounded is rounded whole again.
struct TailRounding {
  int64_t keys_from = 0, keys_to = 0;
  int64_t values_from = 0, values_to = 0;
};
// For a store of n_tokens whose first `packed` are packed, the rest its tail, and whose
// tail's first keys_rounded (values_rounded) rows are rounded already.
TailRounding kivi_tail_rounding(const KiviConfig& config, int64_t n_tokens, int64_t packed,
                                int64_t keys_rounded, int64_t values_rounded);

// After a retain placed `plan` (plan.slots: the old slot at each new slot), the leading
// rows of each head's new tail that are rounded: those from the old packed blocks and from
// the old tail's rounded rows (merged contents are fresh, so none). old_packed, new_packed:
// the packed slots before and after; rounded: [n_kv_heads], updated in place.
void kivi_rounded_after_retain(const RetainPlan& plan, int32_t n_kv_heads, int64_t old_packed,
                               int64_t new_packed, std::vector<int64_t>& rounded);

class MethodParams;

// The store's configuration from a `kivi:` spec's parameters.
KiviConfig kivi_config_from(const MethodParams& params);

// A KIVI store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_kivi_layers(const KvShape& shape,
                                                       const KiviConfig& config);

}  // namespace kvbench
