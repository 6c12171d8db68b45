// KVQuant's storage on the CPU (kernels/layouts.h, KvQuantKv): one token of one KV head
// encoded (its key before RoPE against per-channel ranges, its value per token, outliers
// kept apart in fp16), rows decoded with their keys turned to their positions, and attention
// that decodes one key tile at a time (attention_decoded_cpu), with a reference beside it.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// Doubles RopeAngles::cos_sin holds for n_pairs pairs.
constexpr int64_t rope_angle_table_size(int32_t n_pairs) { return 3LL * 256 * n_pairs * 2; }

// Fills cos_sin [rope_angle_table_size(n_pairs)] for the frequencies inv_freq [n_pairs].
void fill_rope_angles(const float* inv_freq, int32_t n_pairs, double* cos_sin);

// Turns n rows of 2 n_pairs floats (row r at x + r * stride) by angle sign * positions[r] *
// inv_freq[i] per pair (2i, 2i + 1), as rope_interleaved_cpu: sign 1 applies RoPE, -1 takes
// it back. |position| < 2^24.
void rotate_rows(const RopeAngles& rope, float* x, int64_t stride, const int32_t* positions,
                 int64_t n, int32_t sign);

// How one KV head's rows are encoded: keys against the fixed per-channel range [k_min, k_max]
// (outside it a value is an outlier), codes x ~ k_min + code * k_scale; values per token, the
// value_outliers largest and as many smallest of each row kept apart, the rest between their
// own minimum and maximum.
struct KvQuantEncoding {
  const float* k_min;    // [head_dim]
  const float* k_max;    // [head_dim]
  const float* k_scale;  // [head_dim] (k_max - k_min) / (2^bits - 1)
  int32_t head_dim;      // a multiple of 8
  int32_t bits;          // 2, 3 or 4
  int32_t value_outliers;
};

// Encodes one token: k its key before RoPE, v its value [head_dim]; whole keeps every element
// apart (the attention sink). Writes head_dim * bits / 8 bytes of codes to k_codes and
// v_codes, the value's scale and minimum, and its outliers in KvQuantKv's form (channel, fp16
// bits; room for 2 head_dim); returns how many.
int32_t kvquant_encode_row(const KvQuantEncoding& enc, const float* k, const float* v, bool whole,
                           uint8_t* k_codes, uint8_t* v_codes, float* v_scale, float* v_min,
                           uint16_t* channels, uint16_t* values);

// Slots [start, start + n) of KV head kvh in fp32: keys (turned to their positions) and values
// [n, head_dim] back to back, positions [n].
void kvquant_decode_rows(const KvQuantKv& kv, int32_t kvh, int64_t start, int32_t n, float* k,
                         float* v, int32_t* positions);

// Causal attention over the store (pages nullptr: every slot), each key tile decoded by
// kvquant_decode_rows as it is read: bit for bit attention_dense_cpu (attention_pages_cpu)
// over the decoded rows.
void attention_kvquant_cpu(const AttentionQuery& query, const KvQuantKv& kv,
                           const PageSelection* pages);

// Every row decoded first, then the dense (paged) reference: what the kernel is tested against.
void attention_kvquant_reference(const AttentionQuery& query, const KvQuantKv& kv,
                                 const PageSelection* pages);

// Bytes attention reads per slot of one KV head, outliers aside: key and value codes, the
// value's scale and minimum, the position and the slot's start in the outlier rows.
inline int64_t kvquant_slot_bytes(int32_t head_dim, int32_t bits) {
  return 2LL * head_dim * bits / 8 + 2 * 4 + 4 + 4;
}
constexpr int64_t kKvQuantOutlierBytes = 4;  // one outlier: fp16 value and 16-bit channel

}  // namespace kvbench
