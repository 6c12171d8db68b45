// Attention over KIVI storage (kernels/layouts.h, KiviKv) on the CPU, reading the packed
// form: each block's keys and values are unpacked into a per-thread tile only when
// attention reaches that block, never the whole cache first. The fp32 tail is read as is.
#pragma once

#include "kernels/layouts.h"

namespace kvbench {

// Causal by position as attention_dense_cpu. pages: nullptr reads every slot; otherwise
// only the selected pages (Quest over KIVI), page boundaries in slot numbers.
void attention_kivi_cpu(const AttentionQuery& query, const KiviKv& kv,
                        const PageSelection* pages = nullptr);

// Whether attention_kivi_cpu reads 4-bit blocks with int8 dot products when the query runs on
// int8 activations (AttentionQuery::rounding): up to 8 rows per KV head (decode), on a build
// with AVX-512 VNNI and VBMI. Elsewhere such queries take the fp32 path.
bool kivi_int8_rows_supported();

// Dequantizes every block with the reference unpacking, then the dense reference: what
// the kernel is tested against.
void attention_kivi_reference(const AttentionQuery& query, const KiviKv& kv,
                              const PageSelection* pages = nullptr);

// Bytes one KV head's block of `group` tokens occupies: key and value codes plus their
// fp32 scales and minimums (positions not included).
inline int64_t kivi_block_bytes(int32_t head_dim, int32_t group, int32_t bits) {
  const int64_t codes = 2LL * group * head_dim * bits / 8;
  const int64_t key_params = 2LL * head_dim * 4;                  // per channel
  const int64_t value_params = 2LL * group * (head_dim / group) * 4;  // per token and group
  return codes + key_params + value_params;
}

}  // namespace kvbench
