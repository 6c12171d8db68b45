#include "methods/cuda/kivi_store.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cache/cuda/dense_store.h"  // append_projection_rows
#include "cache/full_cache.h"        // selected_slots, kept_slot_order
#include "cache/plan_helpers.h"
#include "kernels/cpu/kivi_attention.h"  // kivi_block_bytes
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/kivi_attention.h"
#include "kernels/cuda/quantize.h"

namespace kvbench {
namespace {

constexpr const char* kWho = "CudaKiviLayerKv";

void check(cudaError_t err, const char* what) { cuda_check(err, kWho, what); }

// Buffers are only dropped after this, so no queued copy or kernel still reads them.
void wait_default_stream() { check(cudaStreamSynchronize(nullptr), "synchronize"); }

// KiviLayerKv's growth: blocks past what is needed (an eighth, at least one).
int64_t block_slack(int64_t n_blocks) { return std::max<int64_t>(1, n_blocks / 8); }

// Each group replaced with its quantized values rounded back to fp32 (KiviLayerKv's
// round_groups); enqueued. The codes and parameters go to `scratch`, grown when too small.
void round_groups_cuda(float* x, int64_t group_stride, int64_t element_stride, int64_t n_groups,
                       int32_t group, int32_t bits, RoundingScratch& scratch) {
  if (scratch.scale.size() < n_groups) {
    wait_default_stream();  // a queued rounding may still use the old scratch
    scratch.codes = DeviceBuffer<uint8_t>(n_groups * group * bits / 8);
    scratch.scale = DeviceBuffer<float>(n_groups);
    scratch.min = DeviceBuffer<float>(n_groups);
  }
  const QuantGroups q{
      scratch.codes.data(), scratch.scale.data(), scratch.min.data(), n_groups, group, bits};
  quantize_groups_cuda(x, group_stride, element_stride, q, nullptr);
  dequantize_groups_cuda(q, x, group_stride, element_stride, nullptr);
}

// Copies slots [h * n_keep + j] of `from` (device rows) to rows [0, n_keep) of each head of
// the target; synchronous (the uploaded slot list is freed on return).
void gather_kept(const DenseKv& from, const std::vector<int32_t>& slots, int64_t n_keep,
                 const GatherTarget& to) {
  if (n_keep == 0) return;
  const DeviceBuffer<int32_t> device_slots(slots.data(), static_cast<int64_t>(slots.size()));
  gather_rows_cuda(from, device_slots.data(), n_keep, to, nullptr);
  wait_default_stream();
}

}  // namespace

CudaKiviLayerKv::CudaKiviLayerKv(int32_t n_kv_heads, int32_t head_dim, const KiviConfig& config)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      config_(config),
      keys_rounded_(n_kv_heads, 0),
      values_rounded_(n_kv_heads, 0) {
  if ((config.bits != 2 && config.bits != 4) || config.group <= 0 ||
      head_dim % config.group != 0) {
    throw std::invalid_argument(std::string(kWho) + ": bits must be 2 or 4 and head_dim (" +
                                std::to_string(head_dim) + ") a multiple of the group (" +
                                std::to_string(config.group) + ")");
  }
}

CudaKiviLayerKv::Blocks CudaKiviLayerKv::allocate_blocks(int64_t units) const {
  const int64_t code_bytes = int64_t{config_.group} * head_dim_ * config_.bits / 8;
  Blocks blocks;
  blocks.k_codes = DeviceBuffer<uint8_t>(units * code_bytes);
  blocks.v_codes = DeviceBuffer<uint8_t>(units * code_bytes);
  blocks.k_scale = DeviceBuffer<float>(units * head_dim_);
  blocks.k_min = DeviceBuffer<float>(units * head_dim_);
  // A block's values: group tokens x head_dim / group channel groups = head_dim parameters.
  blocks.v_scale = DeviceBuffer<float>(units * head_dim_);
  blocks.v_min = DeviceBuffer<float>(units * head_dim_);
  blocks.positions = DeviceBuffer<int32_t>(units * config_.group);
  blocks.units = units;
  return blocks;
}

CudaKiviLayerKv::Rows CudaKiviLayerKv::allocate_rows(int64_t capacity) const {
  const int64_t slots = static_cast<int64_t>(n_kv_heads_) * capacity;
  return Rows{DeviceBuffer<float>(slots * head_dim_), DeviceBuffer<float>(slots * head_dim_),
              DeviceBuffer<int32_t>(slots)};
}

void CudaKiviLayerKv::copy_units(const Blocks& from, Blocks& to, int64_t n_units) const {
  if (n_units <= 0) return;
  const auto copy = [&](auto* dst, const auto* src, int64_t per_unit, const char* what) {
    check(cudaMemcpyAsync(dst, src, n_units * per_unit * sizeof(*src), cudaMemcpyDeviceToDevice,
                          nullptr),
          what);
  };
  const int64_t code_bytes = int64_t{config_.group} * head_dim_ * config_.bits / 8;
  copy(to.k_codes.data(), from.k_codes.data(), code_bytes, "copy key codes");
  copy(to.v_codes.data(), from.v_codes.data(), code_bytes, "copy value codes");
  copy(to.k_scale.data(), from.k_scale.data(), head_dim_, "copy key scales");
  copy(to.k_min.data(), from.k_min.data(), head_dim_, "copy key minimums");
  copy(to.v_scale.data(), from.v_scale.data(), head_dim_, "copy value scales");
  copy(to.v_min.data(), from.v_min.data(), head_dim_, "copy value minimums");
  copy(to.positions.data(), from.positions.data(), config_.group, "copy block positions");
}

void CudaKiviLayerKv::copy_rows(const Rows& from, int64_t from_capacity, int64_t first_row,
                                Rows& to, int64_t to_capacity, int64_t n_rows) const {
  if (n_rows <= 0 || n_kv_heads_ <= 0) return;
  // One strided copy per array: a head's rows are contiguous in both buffers.
  const size_t row_bytes = static_cast<size_t>(head_dim_) * sizeof(float);
  check(cudaMemcpy2DAsync(to.k.data(), to_capacity * row_bytes,
                          from.k.data() + first_row * head_dim_, from_capacity * row_bytes,
                          n_rows * row_bytes, n_kv_heads_, cudaMemcpyDeviceToDevice, nullptr),
        "copy keys");
  check(cudaMemcpy2DAsync(to.v.data(), to_capacity * row_bytes,
                          from.v.data() + first_row * head_dim_, from_capacity * row_bytes,
                          n_rows * row_bytes, n_kv_heads_, cudaMemcpyDeviceToDevice, nullptr),
        "copy values");
  check(cudaMemcpy2DAsync(to.positions.data(), to_capacity * sizeof(int32_t),
                          from.positions.data() + first_row, from_capacity * sizeof(int32_t),
                          n_rows * sizeof(int32_t), n_kv_heads_, cudaMemcpyDeviceToDevice,
                          nullptr),
        "copy positions");
}

KiviKv CudaKiviLayerKv::layout() const {
  KiviKv kv{};
  kv.k_codes = blocks_.k_codes.data();
  kv.k_scale = blocks_.k_scale.data();
  kv.k_min = blocks_.k_min.data();
  kv.v_codes = blocks_.v_codes.data();
  kv.v_scale = blocks_.v_scale.data();
  kv.v_min = blocks_.v_min.data();
  kv.positions = blocks_.positions.data();
  kv.n_blocks = n_blocks_;
  kv.group = config_.group;
  kv.bits = config_.bits;
  kv.tail = DenseKv{tail_.k.data(), tail_.v.data(), tail_.positions.data(), n_kv_heads_,
                    head_dim_,      tail_capacity_, tail_tokens_};
  return kv;
}

void CudaKiviLayerKv::resize_blocks(int64_t n_blocks) {
  if (n_blocks > block_capacity_ || n_blocks + 2 * block_slack(n_blocks) < block_capacity_) {
    block_capacity_ = n_blocks > block_capacity_ ? n_blocks + block_slack(n_blocks) : n_blocks;
  }
  // Compared with what is allocated, not with the old capacity: a clone holds only the
  // blocks in use (as KiviLayerKv's copy does) and takes its room back here.
  const int64_t units = block_capacity_ * n_kv_heads_;
  if (blocks_.units != units) {
    Blocks resized = allocate_blocks(units);
    copy_units(blocks_, resized, std::min(n_blocks_, n_blocks) * n_kv_heads_);
    wait_default_stream();
    blocks_ = std::move(resized);
  }
  n_blocks_ = n_blocks;
}

void CudaKiviLayerKv::reallocate_tail(int64_t capacity) {
  Rows moved = allocate_rows(capacity);
  copy_rows(tail_, tail_capacity_, 0, moved, capacity, tail_tokens_);
  wait_default_stream();
  tail_ = std::move(moved);
  tail_capacity_ = capacity;
}

void CudaKiviLayerKv::pack_units(const float* k, const float* v, const int32_t* positions,
                                 int64_t n_rows, const std::vector<UnitRun>& runs,
                                 const std::vector<int32_t>& rows) {
  const int64_t g = config_.group, d = head_dim_;
  const int64_t code_bytes = g * d * config_.bits / 8;
  int64_t largest = 0;
  for (const UnitRun& run : runs) largest = std::max(largest, run.n_units);
  if (largest == 0) return;
  // quantize_groups_cuda reads group i at i * group_stride, so each run is first gathered into
  // the row order its groups need: keys (a channel over a block's tokens) by token, then
  // unit ([group, n_units, head_dim]: channel c of unit u is group u * head_dim + c, its
  // tokens n_units * head_dim apart); values (a run of one token's channels) by unit, then
  // token ([n_units, group, head_dim]: group i at i * group), which is also how the block
  // positions are laid out. Both row lists go up in one copy.
  const int64_t n_listed = static_cast<int64_t>(rows.size());
  std::vector<int32_t> orders(2 * rows.size());
  int32_t* by_token = orders.data();
  int32_t* by_unit = orders.data() + n_listed;
  int64_t offset = 0;
  for (const UnitRun& run : runs) {
    for (int64_t u = 0; u < run.n_units; ++u) {
      for (int64_t t = 0; t < g; ++t) {
        const int32_t row = rows[offset + u * g + t];
        by_token[offset + t * run.n_units + u] = row;
        by_unit[offset + u * g + t] = row;
      }
    }
    offset += run.n_units * g;
  }
  const DeviceBuffer<int32_t> slots(orders.data(), static_cast<int64_t>(orders.size()));
  DeviceBuffer<float> keys(largest * g * d), values(largest * g * d);
  DeviceBuffer<int32_t> unused_positions(largest * g);
  // One source "head" with absolute row numbers (capacity 0: a slot is a row of the buffer).
  const DenseKv source{k, v, positions, 1, head_dim_, 0, n_rows};
  offset = 0;
  for (const UnitRun& run : runs) {
    const int64_t n = run.n_units * g;  // rows the run packs
    const int64_t u0 = run.first_unit;
    // Each gather also copies what the other order needs into the other staging buffer; the
    // kernels run in stream order, so that is overwritten only after it was read.
    gather_rows_cuda(source, slots.data() + offset, n,
                     GatherTarget{keys.data(), values.data(), unused_positions.data(), n}, nullptr);
    quantize_groups_cuda(keys.data(), 1, run.n_units * d,
                         QuantGroups{blocks_.k_codes.data() + u0 * code_bytes,
                                     blocks_.k_scale.data() + u0 * d, blocks_.k_min.data() + u0 * d,
                                     run.n_units * d, config_.group, config_.bits},
                         nullptr);
    gather_rows_cuda(source, slots.data() + n_listed + offset, n,
                     GatherTarget{keys.data(), values.data(), blocks_.positions.data() + u0 * g, n},
                     nullptr);
    quantize_groups_cuda(values.data(), g, 1,
                         QuantGroups{blocks_.v_codes.data() + u0 * code_bytes,
                                     blocks_.v_scale.data() + u0 * d, blocks_.v_min.data() + u0 * d,
                                     run.n_units * d, config_.group, config_.bits},
                         nullptr);
    offset += n;
  }
  wait_default_stream();
}

void CudaKiviLayerKv::reserve(int64_t n_tokens) {
  const int64_t tail = n_tokens - n_blocks_ * config_.group;
  if (tail > tail_capacity_) reallocate_tail(tail);
}

void CudaKiviLayerKv::append(const float* k, const float* v, const int32_t* positions,
                             int64_t n_new) {
  drop_view();
  if (n_new <= 0) return;
  if (tail_tokens_ + n_new > tail_capacity_) {
    reallocate_tail(std::max(tail_tokens_ + n_new, tail_capacity_ + tail_capacity_ / 2 + 64));
  }
  append_projection_rows(tail_.k.data(), tail_.v.data(), tail_.positions.data(), n_kv_heads_,
                         head_dim_, tail_capacity_, tail_tokens_, k, v, positions, n_new);
  tail_tokens_ += n_new;
}

// KiviLayerKv::settle: packs the tail's whole blocks of quantized slots, then rounds.
void CudaKiviLayerKv::settle() {
  drop_view();
  const int64_t g = config_.group;
  const int64_t n_pack =
      std::max<int64_t>(0, (kivi_quantized_slots(config_, n_tokens()) - n_blocks_ * g) / g);
  if (n_pack > 0) {
    const int64_t first_unit = n_blocks_ * n_kv_heads_;
    resize_blocks(n_blocks_ + n_pack);
    // Unit first_unit + b * n_kv_heads + h, token t: tail row h * capacity + b * group + t.
    std::vector<int32_t> rows;
    rows.reserve(static_cast<size_t>(n_pack * n_kv_heads_ * g));
    for (int64_t b = 0; b < n_pack; ++b) {
      for (int32_t h = 0; h < n_kv_heads_; ++h) {
        for (int64_t t = 0; t < g; ++t) {
          rows.push_back(static_cast<int32_t>(h * tail_capacity_ + b * g + t));
        }
      }
    }
    pack_units(tail_.k.data(), tail_.v.data(), tail_.positions.data(),
               n_kv_heads_ * tail_capacity_, {UnitRun{first_unit, n_pack * n_kv_heads_}}, rows);
  }
  // The rows left move to the front, and between forwards the tail holds fewer than
  // residual + group tokens (a decode step adds one): the room a longer forward needed goes
  // back. Fresh buffers either way: device copies must not overlap.
  const int64_t moved = n_pack * g, left = tail_tokens_ - moved;
  const int64_t steady = config_.residual + g;
  const int64_t capacity = tail_capacity_ > steady && left <= steady ? steady : tail_capacity_;
  if (moved > 0 || capacity != tail_capacity_) {
    Rows front = allocate_rows(capacity);
    copy_rows(tail_, tail_capacity_, moved, front, capacity, left);
    wait_default_stream();
    tail_ = std::move(front);
    tail_capacity_ = capacity;
  }
  tail_tokens_ = left;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    keys_rounded_[h] = std::max<int64_t>(0, keys_rounded_[h] - moved);
    values_rounded_[h] = std::max<int64_t>(0, values_rounded_[h] - moved);
  }
  if (config_.tail == KiviTail::Kivi) round_quantized_rows();
}

void CudaKiviLayerKv::round_quantized_rows() {
  const int64_t d = head_dim_;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int64_t head = h * tail_capacity_;
    const TailRounding r = kivi_tail_rounding(config_, n_tokens(), n_blocks_ * config_.group,
                                              keys_rounded_[h], values_rounded_[h]);
    for (int64_t a = r.keys_from; a < r.keys_to; a += config_.group) {  // per channel
      round_groups_cuda(tail_.k.data() + (head + a) * d, 1, d, d, config_.group, config_.bits,
                        rounding_);
    }
    if (r.values_from < r.values_to) {  // per token, in groups of `group` channels
      round_groups_cuda(tail_.v.data() + (head + r.values_from) * d, config_.group, 1,
                        (r.values_to - r.values_from) * d / config_.group, config_.group,
                        config_.bits, rounding_);
    }
    keys_rounded_[h] = std::max(keys_rounded_[h], r.keys_to);
    values_rounded_[h] = std::max(values_rounded_[h], r.values_to);
  }
}

int64_t CudaKiviLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  const int64_t g = config_.group;
  const int64_t block_bytes =
      kivi_block_bytes(head_dim_, config_.group, config_.bits) + g * sizeof(int32_t);
  const int64_t tail_token_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
  // The page ids are few ([n_kv_heads, n_selected]): a host copy, taken before the attention
  // is enqueued, counts exactly what KiviLayerKv counts.
  std::vector<int32_t> host_pages;
  PageSelection host_selection{};
  if (pages) {
    const int64_t n_ids = static_cast<int64_t>(n_kv_heads_) * std::max(pages->n_selected, 0);
    host_pages.resize(static_cast<size_t>(n_ids));
    if (n_ids > 0) {
      check(cudaMemcpy(host_pages.data(), pages->pages, n_ids * sizeof(int32_t),
                       cudaMemcpyDeviceToHost),
            "download page ids");
    }
    host_selection = PageSelection{host_pages.data(), pages->n_selected, pages->page_tokens};
  }
  const KiviKv kv = layout();
  if (n_blocks_ == 0) {  // all fp32 (a prefill before the first pack): the dense kernels
    if (pages) {
      attention_pages_cuda(query, kv.tail, *pages, nullptr);
      return tail_token_bytes * selected_slots(host_selection, n_kv_heads_, tail_tokens_);
    }
    attention_dense_cuda(query, kv.tail, nullptr);
    return tail_token_bytes * n_kv_heads_ * tail_tokens_;
  }
  attention_kivi_cuda(query, kv, pages, nullptr);
  if (!pages) {
    return n_kv_heads_ * (n_blocks_ * block_bytes + tail_tokens_ * tail_token_bytes);
  }
  // Packed slots are charged their share of the block (codes and group parameters).
  const int64_t packed = n_blocks_ * g, total = n_tokens();
  int64_t bytes = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(host_pages.size()); ++i) {
    const int64_t first = static_cast<int64_t>(host_pages[i]) * pages->page_tokens;
    const int64_t last = std::min(total, first + pages->page_tokens);
    const int64_t in_blocks = std::max<int64_t>(0, std::min(last, packed) - first);
    bytes += in_blocks * block_bytes / g + (last - first - in_blocks) * tail_token_bytes;
  }
  return bytes;
}

DenseKv CudaKiviLayerKv::view() const {
  if (n_blocks_ == 0) return layout().tail;
  const int64_t total = n_tokens();
  if (view_positions_.size() == 0) unpack_view();
  return DenseKv{view_k_.data(), view_v_.data(), view_positions_.data(), n_kv_heads_, head_dim_,
                 total,          total};
}

void CudaKiviLayerKv::unpack_view() const {
  const int64_t g = config_.group, d = head_dim_, total = n_tokens();
  const int64_t units = n_blocks_ * n_kv_heads_, packed = n_blocks_ * g;  // packed: per head
  view_k_ = DeviceBuffer<float>(n_kv_heads_ * total * d);
  view_v_ = DeviceBuffer<float>(n_kv_heads_ * total * d);
  view_positions_ = DeviceBuffer<int32_t>(n_kv_heads_ * total);
  // Unpacked in the orders the groups fill at fixed strides (pack_units' staging: keys
  // [group, units, head_dim], values [units, group, head_dim]), then gathered per head into
  // the view. `keys` is view-sized: it also takes the keys the second gather has no use for.
  DeviceBuffer<float> keys(n_kv_heads_ * total * d), values(units * g * d);
  dequantize_groups_cuda(QuantGroups{blocks_.k_codes.data(), blocks_.k_scale.data(),
                                     blocks_.k_min.data(), units * d, config_.group, config_.bits},
                         keys.data(), 1, units * d, nullptr);
  dequantize_groups_cuda(QuantGroups{blocks_.v_codes.data(), blocks_.v_scale.data(),
                                     blocks_.v_min.data(), units * d, config_.group, config_.bits},
                         values.data(), g, 1, nullptr);
  // View slot b * group + t of head h is unit b * n_kv_heads + h's token t.
  std::vector<int32_t> orders(2 * static_cast<size_t>(n_kv_heads_ * packed));
  int32_t* key_rows = orders.data();
  int32_t* value_rows = orders.data() + n_kv_heads_ * packed;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    for (int64_t b = 0; b < n_blocks_; ++b) {
      const int64_t unit = b * n_kv_heads_ + h;
      for (int64_t t = 0; t < g; ++t) {
        key_rows[h * packed + b * g + t] = static_cast<int32_t>(t * units + unit);
        value_rows[h * packed + b * g + t] = static_cast<int32_t>(unit * g + t);
      }
    }
  }
  const DeviceBuffer<int32_t> slots(orders.data(), static_cast<int64_t>(orders.size()));
  // Capacity 0: every head's slots are absolute rows of the staging buffer. The block
  // positions share the values' order; the first gather's values and positions are
  // overwritten by the second.
  gather_rows_cuda(
      DenseKv{keys.data(), keys.data(), blocks_.positions.data(), n_kv_heads_, head_dim_, 0,
              units * g},
      slots.data(), packed,
      GatherTarget{view_k_.data(), view_v_.data(), view_positions_.data(), total}, nullptr);
  gather_rows_cuda(
      DenseKv{values.data(), values.data(), blocks_.positions.data(), n_kv_heads_, head_dim_, 0,
              units * g},
      slots.data() + n_kv_heads_ * packed, packed,
      GatherTarget{keys.data(), view_v_.data(), view_positions_.data(), total}, nullptr);
  if (tail_tokens_ > 0) {  // the fp32 tail after the blocks
    const size_t row_bytes = static_cast<size_t>(d) * sizeof(float);
    check(cudaMemcpy2DAsync(view_k_.data() + packed * d, total * row_bytes, tail_.k.data(),
                            tail_capacity_ * row_bytes, tail_tokens_ * row_bytes, n_kv_heads_,
                            cudaMemcpyDeviceToDevice, nullptr),
          "copy tail keys");
    check(cudaMemcpy2DAsync(view_v_.data() + packed * d, total * row_bytes, tail_.v.data(),
                            tail_capacity_ * row_bytes, tail_tokens_ * row_bytes, n_kv_heads_,
                            cudaMemcpyDeviceToDevice, nullptr),
          "copy tail values");
    check(cudaMemcpy2DAsync(view_positions_.data() + packed, total * sizeof(int32_t),
                            tail_.positions.data(), tail_capacity_ * sizeof(int32_t),
                            tail_tokens_ * sizeof(int32_t), n_kv_heads_,
                            cudaMemcpyDeviceToDevice, nullptr),
          "copy tail positions");
  }
  wait_default_stream();
}

void CudaKiviLayerKv::drop_view() const {
  if (view_k_.size() == 0 && view_v_.size() == 0 && view_positions_.size() == 0) return;
  wait_default_stream();  // a caller's kernel may still read the view
  view_k_ = DeviceBuffer<float>();
  view_v_ = DeviceBuffer<float>();
  view_positions_ = DeviceBuffer<int32_t>();
}

// KiviLayerKv::retain on the device: the plan is placed as the CPU places it, the kept rows
// gathered from the unpacked view (the tail itself while nothing is packed), the blocks whose
// tokens or contents changed packed again, and the kept rows past the last whole block that
// was packed before become the new tail.
void CudaKiviLayerKv::retain(RetainPlan& plan) {
  check_retain_plan(plan, n_kv_heads_, head_dim_, n_tokens(), kWho);
  const int64_t g = config_.group, d = head_dim_, n_keep = plan.n_keep;
  const bool merged = !plan.k.empty();
  const int64_t n_blocks = std::min(n_blocks_, n_keep / g);
  // KiviLayerKv's placement (the packed blocks that remain settled): the same blocks change,
  // so the same blocks are packed again.
  const std::vector<int32_t> order = kept_slot_order(plan, n_kv_heads_, n_blocks * g);
  const std::vector<int32_t> planned = plan.slots;
  bool moves = false;
  for (int64_t i = 0; i < static_cast<int64_t>(order.size()); ++i) {
    const int64_t head_row = i / n_keep * n_keep;
    plan.slots[i] = planned[head_row + order[i]];
    moves = moves || plan.slots[i] != i - head_row;
  }
  kivi_rounded_after_retain(plan, n_kv_heads_, n_blocks_ * g, n_blocks * g, keys_rounded_);
  kivi_rounded_after_retain(plan, n_kv_heads_, n_blocks_ * g, n_blocks * g, values_rounded_);
  // Merged contents follow their slots to the new places.
  std::vector<float> merged_k, merged_v;
  if (merged) {
    merged_k.resize(plan.k.size());
    merged_v.resize(plan.v.size());
    for (int64_t i = 0; i < static_cast<int64_t>(order.size()); ++i) {
      const int64_t from = (i / n_keep * n_keep + order[i]) * d;
      std::copy_n(plan.k.begin() + from, d, merged_k.begin() + i * d);
      std::copy_n(plan.v.begin() + from, d, merged_v.begin() + i * d);
    }
  }
  const auto upload_merged = [&](Rows& rows, int64_t capacity) {
    if (!merged || n_keep == 0) return;
    const size_t row_bytes = static_cast<size_t>(d) * sizeof(float);
    check(cudaMemcpy2D(rows.k.data(), capacity * row_bytes, merged_k.data(), n_keep * row_bytes,
                       n_keep * row_bytes, n_kv_heads_, cudaMemcpyHostToDevice),
          "upload merged keys");
    check(cudaMemcpy2D(rows.v.data(), capacity * row_bytes, merged_v.data(), n_keep * row_bytes,
                       n_keep * row_bytes, n_kv_heads_, cudaMemcpyHostToDevice),
          "upload merged values");
  };

  if (n_blocks_ == 0) {
    // KiviLayerKv's sizing: a compression gives the room back, down to residual + group.
    const int64_t floor = config_.residual + g;
    const int64_t capacity = tail_capacity_ > std::max(2 * n_keep, floor)
                                 ? std::max(n_keep, floor)
                                 : tail_capacity_;
    if (!moves && !merged) {  // each head keeps its first n_keep slots
      tail_tokens_ = n_keep;
      if (capacity != tail_capacity_) reallocate_tail(capacity);
      return;
    }
    Rows kept = allocate_rows(capacity);
    gather_kept(layout().tail, plan.slots, n_keep,
                GatherTarget{kept.k.data(), kept.v.data(), kept.positions.data(), capacity});
    upload_merged(kept, capacity);
    tail_ = std::move(kept);
    tail_capacity_ = capacity;
    tail_tokens_ = n_keep;
    return;
  }

  // The blocks to pack again, in runs of consecutive units (block-major: all heads of a
  // block are one run when they all changed).
  std::vector<UnitRun> runs;
  std::vector<int32_t> rows;
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int32_t* placed = plan.slots.data() + h * n_keep;
      bool changed = merged;
      for (int64_t j = b * g; j < (b + 1) * g && !changed; ++j) changed = placed[j] != j;
      if (!changed) continue;
      const int64_t unit = b * n_kv_heads_ + h;
      if (!runs.empty() && runs.back().first_unit + runs.back().n_units == unit) {
        ++runs.back().n_units;
      } else {
        runs.push_back(UnitRun{unit, 1});
      }
      for (int64_t t = 0; t < g; ++t) rows.push_back(static_cast<int32_t>(h * n_keep + b * g + t));
    }
  }
  const int64_t packed = n_blocks * g, tail = n_keep - packed;
  const int64_t capacity = std::max(tail, std::min(config_.residual, n_keep) + g);  // as KiviLayerKv
  Rows new_tail = allocate_rows(capacity);
  if (runs.empty() && n_blocks == n_blocks_) {
    // Every block stays as packed (an eviction within the tail: a decode step's): the kept
    // tail rows come from the tail itself, nothing is unpacked. Not in place: the tail's rows
    // keep position order (settled blocks only), so a shift's source rows are other moves'
    // destinations; the tail is small (about residual + group rows).
    std::vector<int32_t> tail_slots(static_cast<size_t>(n_kv_heads_ * tail));
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      for (int64_t j = 0; j < tail; ++j) {
        tail_slots[h * tail + j] =
            plan.slots[h * n_keep + packed + j] - static_cast<int32_t>(packed);
      }
    }
    gather_kept(
        layout().tail, tail_slots, tail,
        GatherTarget{new_tail.k.data(), new_tail.v.data(), new_tail.positions.data(), capacity});
  } else {
    Rows kept = allocate_rows(n_keep);
    gather_kept(view(), plan.slots, n_keep,
                GatherTarget{kept.k.data(), kept.v.data(), kept.positions.data(), n_keep});
    upload_merged(kept, n_keep);
    pack_units(kept.k.data(), kept.v.data(), kept.positions.data(), n_kv_heads_ * n_keep, runs,
               rows);
    copy_rows(kept, n_keep, packed, new_tail, capacity, tail);
    wait_default_stream();
  }
  resize_blocks(n_blocks);
  tail_ = std::move(new_tail);
  tail_capacity_ = capacity;
  tail_tokens_ = tail;
  drop_view();
}

std::unique_ptr<LayerKv> CudaKiviLayerKv::clone() const {
  auto copy = std::make_unique<CudaKiviLayerKv>(n_kv_heads_, head_dim_, config_);
  // As KiviLayerKv's copy: the blocks in use only (the copy's next resize restores its room),
  // the tail at its capacity, no view.
  const int64_t used = n_blocks_ * n_kv_heads_;
  copy->blocks_ = allocate_blocks(used);
  copy_units(blocks_, copy->blocks_, used);
  copy->tail_ = allocate_rows(tail_capacity_);
  copy_rows(tail_, tail_capacity_, 0, copy->tail_, tail_capacity_, tail_tokens_);
  wait_default_stream();
  copy->n_blocks_ = n_blocks_;
  copy->block_capacity_ = block_capacity_;
  copy->tail_capacity_ = tail_capacity_;
  copy->tail_tokens_ = tail_tokens_;
  copy->keys_rounded_ = keys_rounded_;
  copy->values_rounded_ = values_rounded_;
  return copy;
}

std::unique_ptr<LayerKv> CudaKiviLayerKv::head_store(int32_t head) const {
  auto one = std::make_unique<CudaKiviLayerKv>(1, head_dim_, config_);
  one->resize_blocks(n_blocks_);  // PackedBlocks::head's room: n_blocks plus slack
  const auto copy_units_of_head = [&](auto* to, const auto* from, int64_t per_unit,
                                      const char* what) {
    if (n_blocks_ == 0) return;
    const size_t unit_bytes = per_unit * sizeof(*from);
    check(cudaMemcpy2DAsync(to, unit_bytes, from + head * per_unit, n_kv_heads_ * unit_bytes,
                            unit_bytes, n_blocks_, cudaMemcpyDeviceToDevice, nullptr),
          what);
  };
  const int64_t code_bytes = int64_t{config_.group} * head_dim_ * config_.bits / 8;
  Blocks& to = one->blocks_;
  copy_units_of_head(to.k_codes.data(), blocks_.k_codes.data(), code_bytes, "copy key codes");
  copy_units_of_head(to.v_codes.data(), blocks_.v_codes.data(), code_bytes, "copy value codes");
  copy_units_of_head(to.k_scale.data(), blocks_.k_scale.data(), head_dim_, "copy key scales");
  copy_units_of_head(to.k_min.data(), blocks_.k_min.data(), head_dim_, "copy key minimums");
  copy_units_of_head(to.v_scale.data(), blocks_.v_scale.data(), head_dim_, "copy value scales");
  copy_units_of_head(to.v_min.data(), blocks_.v_min.data(), head_dim_, "copy value minimums");
  copy_units_of_head(to.positions.data(), blocks_.positions.data(), config_.group,
                     "copy block positions");
  one->tail_ = one->allocate_rows(tail_capacity_);
  one->tail_capacity_ = tail_capacity_;
  one->tail_tokens_ = tail_tokens_;
  if (tail_tokens_ > 0) {
    const int64_t at = static_cast<int64_t>(head) * tail_capacity_;  // the head's first row
    const size_t rows = static_cast<size_t>(tail_tokens_);
    check(cudaMemcpyAsync(one->tail_.k.data(), tail_.k.data() + at * head_dim_,
                          rows * head_dim_ * sizeof(float), cudaMemcpyDeviceToDevice, nullptr),
          "copy a head's tail keys");
    check(cudaMemcpyAsync(one->tail_.v.data(), tail_.v.data() + at * head_dim_,
                          rows * head_dim_ * sizeof(float), cudaMemcpyDeviceToDevice, nullptr),
          "copy a head's tail values");
    check(cudaMemcpyAsync(one->tail_.positions.data(), tail_.positions.data() + at,
                          rows * sizeof(int32_t), cudaMemcpyDeviceToDevice, nullptr),
          "copy a head's tail positions");
  }
  wait_default_stream();
  one->keys_rounded_[0] = keys_rounded_[head];
  one->values_rounded_[0] = values_rounded_[head];
  return one;
}

int64_t CudaKiviLayerKv::bytes_resident() const {
  return blocks_.k_codes.bytes() + blocks_.v_codes.bytes() + blocks_.k_scale.bytes() +
         blocks_.k_min.bytes() + blocks_.v_scale.bytes() + blocks_.v_min.bytes() +
         blocks_.positions.bytes() + tail_.k.bytes() + tail_.v.bytes() + tail_.positions.bytes() +
         view_k_.bytes() + view_v_.bytes() + view_positions_.bytes();
}

std::vector<std::unique_ptr<LayerKv>> make_cuda_kivi_layers(const KvShape& shape,
                                                            const KiviConfig& config) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<CudaKiviLayerKv>(shape.n_kv_heads, shape.head_dim, config));
  }
  return layers;
}

}  // namespace kvbench
