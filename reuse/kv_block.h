// One prefix block of the model's KV as stored in the tiers: every layer's keys and values
// for block_tokens consecutive tokens, with what they are (key, model, tokens, positions)
// and an XXH3 checksum over everything, so a corrupt, truncated or misplaced block is
// detected and treated as a miss, never served.
//
// Encoded layout (little-endian): header, tokens [n], then per layer K [n, kv_width] and
// V [n, kv_width] in the projection layout LayerKv::append takes, then the checksum.
#pragma once

#include <cstdint>
#include <string>

#include "reuse/tier.h"

namespace kvbench {

struct KvBlockShape {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t kv_width() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
};

// An encoded block being filled: layer by layer, as the model computes the KV.
class KvBlockWriter {
 public:
  KvBlockWriter(const std::string& key, const std::string& model_id, const KvBlockShape& shape,
                const int32_t* tokens, int64_t n_tokens, int32_t first_position);
  float* k(int32_t layer);  // [n_tokens, kv_width]
  float* v(int32_t layer);
  // Seals the checksum; the writer is empty afterwards.
  SharedBytes finish();

 private:
  Bytes bytes_;
  KvBlockShape shape_;
  int64_t n_tokens_ = 0;
};

// A decoded view into an encoded block (no copy): valid while the bytes live.
struct KvBlockView {
  int64_t n_tokens = 0;
  int32_t first_position = 0;
  const int32_t* tokens = nullptr;
  const float* k(int32_t layer) const;
  const float* v(int32_t layer) const;

  KvBlockShape shape;
  const uint8_t* payload = nullptr;  // first layer's K
};

// Checks the block is the one asked for: magic and version, size, checksum, and the
// key, model, shape and tokens expected. Returns "" and fills `view`, or says what is wrong.
std::string decode_kv_block(const Bytes& bytes, const std::string& key, const std::string& model_id,
                            const KvBlockShape& shape, const int32_t* tokens, int64_t n_tokens,
                            KvBlockView* view);

// Bytes of an encoded block.
int64_t kv_block_bytes(const KvBlockShape& shape, int64_t n_tokens);

// Where a block's parts lie, read from its header without knowing its key: what a codec
// (reuse/block_codec.h) needs to re-encode a block and rebuild it. The prefix (header and
// tokens) is [0, payload_offset); K and V follow as KvBlockView reads them.
struct KvBlockLayout {
  KvBlockShape shape;
  int64_t n_tokens = 0;
  int64_t payload_offset = 0;
  int64_t total_bytes = 0;  // kv_block_bytes(shape, n_tokens)
};

// Reads the header of the `n` bytes at `bytes`: magic and a shape within bounds (at most
// 1024 layers, 65536 values per row, 2^24 tokens, so no size overflows), and at least the
// prefix present. Returns "" and fills `layout`, or says what is wrong.
std::string read_kv_block_layout(const uint8_t* bytes, size_t n, KvBlockLayout* layout);
// read_kv_block_layout, then the whole block: its size and checksum.
std::string check_kv_block(const uint8_t* bytes, size_t n, KvBlockLayout* layout);
// Writes the checksum of a block rebuilt in place (`n` = its total bytes).
void seal_kv_block(uint8_t* bytes, size_t n);

}  // namespace kvbench
