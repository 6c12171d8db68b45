#include "cache/packed_blocks.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "kernels/cpu/kivi_attention.h"
#include "kernels/cpu/quantize.h"

namespace kvbench {

namespace {

// Blocks the buffers grow by past what they need (an eighth, at least one), so decode (one
// new block every 32 tokens) does not reallocate every block.
int64_t block_slack(int64_t n_blocks) { return std::max<int64_t>(1, n_blocks / 8); }

}  // namespace

PackedBlocks::PackedBlocks(int32_t n_kv_heads, int32_t head_dim, int32_t group, int32_t bits)
    : n_kv_heads_(n_kv_heads), head_dim_(head_dim), group_(group), bits_(bits) {
  assert(head_dim % group == 0 && (bits == 2 || bits == 4));
}

void PackedBlocks::resize(int64_t n_blocks) {
  if (n_blocks > capacity_) {
    capacity_ = n_blocks + block_slack(n_blocks);
  } else if (n_blocks + 2 * block_slack(n_blocks) < capacity_) {
    capacity_ = std::max(n_blocks, reserved_);
  }
  fit_buffers(n_blocks);
  n_blocks_ = n_blocks;
}

void PackedBlocks::reserve(int64_t n_blocks) {
  reserved_ = n_blocks;
  if (n_blocks <= capacity_) return;
  capacity_ = n_blocks;
  fit_buffers(n_blocks_);
}

void PackedBlocks::fit_buffers(int64_t used_blocks) {
  const size_t units = static_cast<size_t>(capacity_) * n_kv_heads_;
  const size_t g = group_, d = head_dim_;
  const size_t code_bytes = g * d * bits_ / 8;
  const size_t used = static_cast<size_t>(used_blocks) * n_kv_heads_;
  const auto fit = [&](auto& v, size_t per_unit) {
    if (v.capacity() != units * per_unit) {
      std::remove_reference_t<decltype(v)> copy;
      copy.reserve(units * per_unit);
      copy.assign(v.begin(), v.begin() + std::min(v.size(), used * per_unit));
      v.swap(copy);
    }
    v.resize(used * per_unit);
  };
  fit(k_codes_, code_bytes);
  fit(v_codes_, code_bytes);
  fit(k_scale_, d);
  fit(k_min_, d);
  fit(v_scale_, d);  // group tokens x head_dim / group channel groups = head_dim per block
  fit(v_min_, d);
  fit(positions_, g);
}

PackedBlocks PackedBlocks::head(int32_t head) const {
  PackedBlocks one(1, head_dim_, group_, bits_);
  one.resize(n_blocks_);
  const size_t g = group_, d = head_dim_, code_bytes = g * d * bits_ / 8;
  const auto copy_unit = [&](const auto& from, auto& to, size_t per_unit) {
    for (int64_t b = 0; b < n_blocks_; ++b) {
      const size_t unit = static_cast<size_t>(b) * n_kv_heads_ + head;
      std::copy_n(from.begin() + unit * per_unit, per_unit, to.begin() + b * per_unit);
    }
  };
  copy_unit(k_codes_, one.k_codes_, code_bytes);
  copy_unit(v_codes_, one.v_codes_, code_bytes);
  copy_unit(k_scale_, one.k_scale_, d);
  copy_unit(k_min_, one.k_min_, d);
  copy_unit(v_scale_, one.v_scale_, d);
  copy_unit(v_min_, one.v_min_, d);
  copy_unit(positions_, one.positions_, g);
  return one;
}

// QuantGroups points at mutable memory; unpacking only reads it.
QuantGroups PackedBlocks::key_groups(int64_t unit) const {
  const int64_t d = head_dim_, code_bytes = int64_t{group_} * d * bits_ / 8;
  return QuantGroups{const_cast<uint8_t*>(k_codes_.data()) + unit * code_bytes,
                     const_cast<float*>(k_scale_.data()) + unit * d,
                     const_cast<float*>(k_min_.data()) + unit * d,
                     d,
                     group_,
                     bits_};
}

QuantGroups PackedBlocks::value_groups(int64_t unit) const {
  const int64_t d = head_dim_, code_bytes = int64_t{group_} * d * bits_ / 8;
  return QuantGroups{const_cast<uint8_t*>(v_codes_.data()) + unit * code_bytes,
                     const_cast<float*>(v_scale_.data()) + unit * d,
                     const_cast<float*>(v_min_.data()) + unit * d,
                     d,
                     group_,
                     bits_};
}

void PackedBlocks::pack(int64_t b, int32_t head, const float* k, const float* v,
                        const int32_t* positions) {
  assert(b < n_blocks_);
  const int64_t unit = b * n_kv_heads_ + head, d = head_dim_;
  // Keys: one group per channel over the block's tokens. Values: each token's channels in
  // groups of `group`.
  quantize_groups_cpu(k, 1, d, key_groups(unit));
  quantize_groups_cpu(v, group_, 1, value_groups(unit));
  std::memcpy(positions_.data() + unit * group_, positions, group_ * sizeof(int32_t));
}

void PackedBlocks::unpack(int64_t b, int32_t head, float* k, float* v, int32_t* positions) const {
  const int64_t unit = b * n_kv_heads_ + head;
  dequantize_groups_cpu(key_groups(unit), k, 1, head_dim_);
  dequantize_groups_cpu(value_groups(unit), v, group_, 1);
  std::memcpy(positions, positions_.data() + unit * group_, group_ * sizeof(int32_t));
}

KiviKv PackedBlocks::layout(const DenseKv& tail) const {
  KiviKv kv{};
  kv.k_codes = k_codes_.data();
  kv.k_scale = k_scale_.data();
  kv.k_min = k_min_.data();
  kv.v_codes = v_codes_.data();
  kv.v_scale = v_scale_.data();
  kv.v_min = v_min_.data();
  kv.positions = positions_.data();
  kv.n_blocks = n_blocks_;
  kv.group = group_;
  kv.bits = bits_;
  kv.tail = tail;
  return kv;
}

int64_t PackedBlocks::bytes() const {
  const auto bytes = [](const auto& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(v[0]));
  };
  return bytes(k_codes_) + bytes(v_codes_) + bytes(k_scale_) + bytes(k_min_) + bytes(v_scale_) +
         bytes(v_min_) + bytes(positions_);
}

int64_t PackedBlocks::block_read_bytes() const {
  return kivi_block_bytes(head_dim_, group_, bits_) + int64_t{group_} * sizeof(int32_t);
}

}  // namespace kvbench
