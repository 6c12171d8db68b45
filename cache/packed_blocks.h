// Packed blocks of KV in KiviKv's layout (kernels/layouts.h): blocks of `group` tokens per KV
// head, keys quantized per channel over the block's tokens and values per token in groups of
// `group` channels, 2 or 4 bits, asymmetric min/max (QuantGroups). Block-major, so a block is
// appended without moving the others. KIVI's store packs its oldest tokens here; MiKV's packs
// the tokens its policy demotes. Attention reads them through attention_kivi_cpu.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

class PackedBlocks {
 public:
  PackedBlocks(int32_t n_kv_heads, int32_t head_dim, int32_t group, int32_t bits);

  // Storage for n_blocks: capacity n_blocks plus slack when it must grow, exactly what is
  // used when most of it would sit idle. Blocks below n_blocks keep their contents.
  void resize(int64_t n_blocks);
  // Room for n_blocks allocated now, exactly, and kept however few are used (resize never
  // shrinks below it): a sequence whose length is known packs into it without growing.
  void reserve(int64_t n_blocks);
  // Packs `group` rows of KV head `head` (k, v: rows of head_dim floats, consecutive) and
  // their positions into block b < n_blocks().
  void pack(int64_t b, int32_t head, const float* k, const float* v, const int32_t* positions);
  // Unpacks block b of KV head `head` into `group` consecutive rows.
  void unpack(int64_t b, int32_t head, float* k, float* v, int32_t* positions) const;

  // KV head `head`'s blocks alone (n_kv_heads 1), codes and parameters as they are.
  PackedBlocks head(int32_t head) const;

  // KiviKv with these blocks and `tail` as its fp32 rows.
  KiviKv layout(const DenseKv& tail) const;
  int64_t n_blocks() const { return n_blocks_; }
  int32_t group() const { return group_; }
  int32_t bits() const { return bits_; }
  // Bytes the buffers hold, and bytes one block of one KV head is read as (codes, group
  // parameters and positions).
  int64_t bytes() const;
  int64_t block_read_bytes() const;

 private:
  // The buffers sized for capacity_ blocks, the first `used` blocks' contents kept.
  void fit_buffers(int64_t used);
  QuantGroups key_groups(int64_t unit) const;
  QuantGroups value_groups(int64_t unit) const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  int32_t group_;
  int32_t bits_;
  int64_t n_blocks_ = 0;
  int64_t capacity_ = 0;  // blocks the buffers hold
  int64_t reserved_ = 0;  // capacity_ never shrinks below it (reserve)
  // Block b of KV head h at unit b * n_kv_heads + h.
  std::vector<uint8_t> k_codes_, v_codes_;  // [units, group * head_dim * bits / 8]
  std::vector<float> k_scale_, k_min_;      // [units, head_dim] per channel
  std::vector<float> v_scale_, v_min_;      // [units, group, head_dim / group] per token group
  std::vector<int32_t> positions_;          // [units, group]
};

}  // namespace kvbench
