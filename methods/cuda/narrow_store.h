// The narrow stores in device memory: NarrowLayerKv's twin (cache/narrow_kv.h) for a model
// whose forward runs on a GPU. Same semantics: every row rounded to fp16, bf16 or fp8 e4m3 (a
// scale per token and KV head) as it is appended, bit for bit as the CPU store rounds it;
// attention widening each element as it loads it (attention_narrow_cuda); the same growth, the
// same slot placement after a retain (place_kept_slots, every slot settled: a hole is filled
// from the tail) and the same bytes (bytes_resident and what attend() returns equal
// NarrowLayerKv's for the same calls).
//
// The storage and EVERY pointer crossing the LayerKv interface are on the device; only the
// retain plan is on the host, as for every store. Work goes on the default stream (nullptr),
// ordered with the caller's kernels there. Host code (compiled by the C++ compiler); pulls in
// <cuda_runtime.h>.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/narrow.h"

namespace kvbench {

class CudaNarrowLayerKv : public LayerKv {
 public:
  CudaNarrowLayerKv(int32_t n_kv_heads, int32_t head_dim, KvElement element);

  void reserve(int64_t n_tokens) override;
  // k, v: DEVICE [n_new, n_kv_heads, head_dim] fp32; positions: DEVICE [n_new]. Rounded on the
  // device, enqueued on the default stream (synchronous when the buffers grow).
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  // query.q, query.q_positions, query.out: DEVICE pointers; head_dim 64 or 128 (the CUDA
  // kernel's). pages->pages: a DEVICE [n_kv_heads, n_selected] array, copied to the host (a
  // small synchronous copy) to count the slots read, so the bytes returned are exactly
  // NarrowLayerKv's. The attention itself is left running on the default stream.
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  // plan is on the host. Kept rows move within the buffers as NarrowLayerKv moves them
  // (plan.slots says where on return, each >= j); merged contents (plan.k, plan.v) are rounded
  // into their slots. Throws std::invalid_argument for a malformed plan before anything
  // changes. Synchronous.
  void retain(RetainPlan& plan) override;
  // DEVICE pointers: the rows widened to fp32 into device buffers ([n_kv_heads, n_tokens,
  // head_dim], capacity n_tokens) held until the next append, retain or settle, and not counted
  // in bytes_resident (as NarrowLayerKv's host view). For a policy, which copies it down.
  DenseKv view() const override;
  void settle() override { drop_view(); }
  // A deep copy in device memory (without the view).
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override { return n_tokens_; }
  // Device bytes of the rows at capacity: elements, fp8's scales, positions.
  int64_t bytes_resident() const override;
  const char* tier() const override { return "device"; }
  // KV head `head` alone in a device store sized to its count (NarrowLayerKv::head_store's).
  std::unique_ptr<LayerKv> head_store(int32_t head) const override;

  // The storage as the kernels read it: DEVICE pointers.
  NarrowKv layout() const;
  int64_t capacity() const { return capacity_; }

 private:
  // Buffers for `capacity` rows per head, in NarrowKv's layout.
  struct Rows {
    DeviceBuffer<uint8_t> k, v;            // [n_kv_heads, capacity, row_bytes]
    DeviceBuffer<float> k_scale, v_scale;  // [n_kv_heads, capacity], fp8 only
    DeviceBuffer<int32_t> positions;       // [n_kv_heads, capacity]
  };
  Rows allocate(int64_t capacity) const;
  // Copies the first n_rows rows of every head from `from` (capacity from_capacity) to `to`
  // (capacity to_capacity); enqueued on the default stream.
  void copy_rows(const Rows& from, int64_t from_capacity, Rows& to, int64_t to_capacity,
                 int64_t n_rows) const;
  // Moves the rows in use into buffers of exactly new_capacity (>= n_tokens) rows per head.
  void reallocate(int64_t new_capacity);
  NarrowTarget target() const;
  void drop_view() const;

  int32_t n_kv_heads_;
  int32_t head_dim_;
  KvElement element_;
  int64_t row_bytes_;  // element bytes of one token's keys (or values) in one KV head
  int64_t capacity_ = 0;
  int64_t n_tokens_ = 0;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack
  Rows rows_;

  mutable bool view_ready_ = false;
  mutable DeviceBuffer<float> view_k_, view_v_;    // [n_kv_heads, n_tokens, head_dim]
  mutable DeviceBuffer<int32_t> view_positions_;  // [n_kv_heads, n_tokens]
};

// A device narrow store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_cuda_narrow_layers(const KvShape& shape,
                                                              KvElement element);

}  // namespace kvbench
