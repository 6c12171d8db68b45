// CacheGen as a codec of the reuse tiers (CacheGen: KV Cache Compression and Streaming for
// Fast Large Language Model Serving, SIGCOMM'24), following the encoder LMCache ships
// (storage_backend/serde/cachegen_encoder.py, cachegen_basics.py):
//   - K and V of each layer are quantized per token: the row of all KV heads' channels
//     [kv_width] is scaled by its largest magnitude `amax` to `bins` levels,
//     code = round(x * C / amax) + C with C = bins / 2 - 1 (codes 0 .. 2C), decoded as
//     (code - C) * amax / C; the error of a value is at most amax / (2 C) (half a step);
//   - more bins for early layers, as LMCache's CacheGenConfig: keys 32 bins in layers 0-9 and
//     16 after, values 32 in layers 0-1 and 16 after; 32 everywhere below 10 layers;
//   - the codes are laid out per (layer, K or V, channel) over the block's tokens, the streams
//     LMCache's arithmetic coder codes with one CDF each, and the scales kept as fp32.
// Departures (also in `kvbench list methods`):
//   - entropy coding is zstd (one frame over the bins, scales and codes, Huffman-coded
//     literals) instead of LMCache's per-channel arithmetic coder (torchac);
//   - no delta against anchor tokens: the paper encodes each token as its delta from an
//     anchor token of its chunk, LMCache's encoder quantizes the values themselves, as here;
//   - the chunk is the prefix block (prefix:block, 256 by default; LMCache: 256 tokens);
//   - scales are fp32 (LMCache: the KV's dtype, fp16 or bf16).
//
// Encoding: magic "KVBCGEN1", u64 prefix bytes, the block's header and tokens verbatim, one
// zstd frame of [2 * n_layers bins (u8: K then V per layer)][scales f32 [n_layers][2][n_tokens]]
// [codes u8 [n_layers][2][kv_width][n_tokens]], then XXH3-64 of everything before it. The
// decoder checks the checksum, the header, the frame's size and every bin count and code
// before it rebuilds the block (with a fresh block checksum): a corrupt or truncated
// encoding is refused, never decoded into other KV.
#pragma once

#include <cstdint>
#include <vector>

#include "reuse/block_codec.h"

namespace kvbench {

// Bins per layer for keys and values of a model with `n_layers` layers (LMCache's config).
std::vector<int> cachegen_key_bins(int32_t n_layers);
std::vector<int> cachegen_value_bins(int32_t n_layers);

// The largest error of a decoded value in a row whose largest magnitude is `amax`.
inline double cachegen_max_error(double amax, int bins) { return amax / (2.0 * (bins / 2 - 1)); }

std::unique_ptr<BlockCodec> make_cachegen_codec(int zstd_level);

}  // namespace kvbench
