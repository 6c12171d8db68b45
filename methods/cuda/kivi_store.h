// KIVI's packed store in device memory: KiviLayerKv's twin (methods/kivi.h) for a model whose
// forward runs on a GPU. Same semantics: keys per channel and values per token packed to 2 or
// 4 bits in blocks of `group` tokens as its `tail` rule says (at settle()), the newest
// tokens in an fp32 tail (with rows KIVI has quantized rounded there), the same block growth, the same slot placement after a
// retain (so the same blocks are packed again) and the same bytes: bytes_resident and the
// bytes attend() returns equal KiviLayerKv's for the same calls.
//
// The storage and EVERY pointer crossing the LayerKv interface are on the device; only the
// retain plan is on the host, as for every store. Work goes on the default stream (nullptr),
// ordered with the caller's kernels there. The kernels are kernels/cuda's: packing through
// quantize_groups_cuda, view() through dequantize_groups_cuda, attention through
// attention_kivi_cuda (the dense ones while nothing is packed), rows moved by gather_rows_cuda.
// Host code (compiled by the C++ compiler); pulls in <cuda_runtime.h>.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/cuda/device_buffer.h"
#include "methods/kivi.h"

namespace kvbench {

// Where CudaKiviLayerKv rounds groups of its tail: quantize_groups_cuda's codes and parameters.
struct RoundingScratch {
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scale, min;
};

class CudaKiviLayerKv : public LayerKv {
 public:
  // Throws std::invalid_argument unless bits is 2 or 4 and head_dim a multiple of the group
  // (attention further needs head_dim 64 or 128 and group 32: the CUDA kernel's).
  CudaKiviLayerKv(int32_t n_kv_heads, int32_t head_dim, const KiviConfig& config);

  void reserve(int64_t n_tokens) override;
  // k, v: DEVICE [n_new, n_kv_heads, head_dim]; positions: DEVICE [n_new]. Enqueued on the
  // default stream (the tail grows synchronously when it must).
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  // query.q, query.q_positions, query.out: DEVICE pointers. pages->pages: a DEVICE
  // [n_kv_heads, n_selected] array; it is copied to the host (a small synchronous copy) to
  // count what is read, so the bytes returned are exactly KiviLayerKv's. The attention itself
  // is left running on the default stream.
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  // plan is on the host. Kept slots are placed as KiviLayerKv places them (kept slots in
  // the packed blocks that remain stay, their holes take the oldest kept slots after them,
  // the rest follow in order; plan.slots says so on return, each >= j), so the same blocks are unpacked and packed again. Merged contents
  // (plan.k, plan.v) are supported. An eviction that leaves every block as packed (a decode
  // step's, within the tail) gathers the tail alone, unpacking nothing. Throws
  // std::invalid_argument for a malformed plan (slots not ascending or past the stored tokens,
  // merged rows of the wrong size) before anything changes. Synchronous.
  void retain(RetainPlan& plan) override;
  // DEVICE pointers: the fp32 tail itself while nothing is packed, else everything unpacked
  // into device buffers held (and counted in bytes_resident) until the next append, retain
  // or settle. A policy that reads the view on the host must copy it down.
  DenseKv view() const override;
  // Packs the whole blocks of quantized slots and rounds the tail rows KiviTail::Kivi has
  // quantized (KiviLayerKv::settle); synchronous when it packs, the rounding (a decode step's
  // usual work: one value row per head) enqueued, with no allocation.
  void settle() override;
  // A deep copy in device memory (without the view buffers).
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return n_blocks_ * config_.group + tail_tokens_; }
  // Device bytes held: packed blocks at their capacity, the fp32 tail at its capacity, and
  // the view buffers while held.
  int64_t bytes_resident() const override;
  const char* tier() const override { return "device"; }
  // KV head `head` alone in a device store: its blocks and fp32 tail as they are, sized as
  // KiviLayerKv::head_store sizes them.
  std::unique_ptr<LayerKv> head_store(int32_t head) const override;

  // The storage as the kernels read it: DEVICE pointers.
  KiviKv layout() const;
  int64_t n_blocks() const { return n_blocks_; }

 private:
  // Packed blocks for `units` (block, KV head) pairs, block-major as KiviKv lays them out.
  struct Blocks {
    DeviceBuffer<uint8_t> k_codes, v_codes;               // [units, group * head_dim * bits / 8]
    DeviceBuffer<float> k_scale, k_min, v_scale, v_min;  // [units, head_dim]
    DeviceBuffer<int32_t> positions;                     // [units, group]
    int64_t units = 0;
  };
  // fp32 rows per KV head in DenseKv's layout: the tail, and rows a retain keeps.
  struct Rows {
    DeviceBuffer<float> k, v;         // [n_kv_heads, capacity, head_dim]
    DeviceBuffer<int32_t> positions;  // [n_kv_heads, capacity]
  };
  // Units packed from the same rows: units [first_unit, first_unit + n_units).
  struct UnitRun {
    int64_t first_unit;
    int64_t n_units;
  };

  Blocks allocate_blocks(int64_t units) const;
  Rows allocate_rows(int64_t capacity) const;
  // Copies the first n_units units of `from` to `to`; enqueued.
  void copy_units(const Blocks& from, Blocks& to, int64_t n_units) const;
  // Copies rows [first_row, first_row + n_rows) of each head of `from` to rows [0, n_rows) of
  // `to`; enqueued.
  void copy_rows(const Rows& from, int64_t from_capacity, int64_t first_row, Rows& to,
                 int64_t to_capacity, int64_t n_rows) const;
  // KiviLayerKv::resize_blocks: room for n_blocks (slack when growing, exact when most would
  // sit idle), the used units kept.
  void resize_blocks(int64_t n_blocks);
  // Moves the tail's rows in use into buffers of exactly `capacity` rows per head.
  void reallocate_tail(int64_t capacity);
  // Packs each run's units from fp32 rows held as `k`, `v`, `positions` (row r at
  // k + r * head_dim): token t of the run's unit u comes from row rows[offset + u * group + t],
  // runs taking their rows in order. Synchronous.
  void pack_units(const float* k, const float* v, const int32_t* positions, int64_t n_rows,
                  const std::vector<UnitRun>& runs, const std::vector<int32_t>& rows);
  // Unpacks every block and copies the tail into the view buffers.
  void unpack_view() const;
  void drop_view() const;
  // KiviLayerKv::round_quantized_rows on the device; enqueued.
  void round_quantized_rows();

  int32_t n_kv_heads_;
  int32_t head_dim_;
  KiviConfig config_;

  int64_t n_blocks_ = 0;
  int64_t block_capacity_ = 0;  // blocks the storage is sized for (KiviLayerKv's)
  Blocks blocks_;               // its units are n_blocks_ or block_capacity_ times n_kv_heads

  Rows tail_;
  int64_t tail_capacity_ = 0;
  int64_t tail_tokens_ = 0;
  // KiviLayerKv's: per KV head, the leading tail rows whose keys (values) are rounded.
  std::vector<int64_t> keys_rounded_, values_rounded_;

  // The codes and parameters a rounding goes through, kept between settles so a decode step
  // allocates nothing (and so frees nothing: cudaFree synchronises). Sized by the largest
  // rounding, a part of the tail's rows: not counted in bytes_resident, as KiviLayerKv's
  // temporaries are not.
  RoundingScratch rounding_;

  // Everything unpacked, while a policy looks at it (view) until settle().
  mutable DeviceBuffer<float> view_k_, view_v_;
  mutable DeviceBuffer<int32_t> view_positions_;
};

// A device KIVI store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_cuda_kivi_layers(const KvShape& shape,
                                                            const KiviConfig& config);

}  // namespace kvbench
