// The full dense cache in device memory: DenseLayerKv's twin for a model whose forward runs
// on a GPU. Same semantics (fp32 per KV head, DenseKv's layout, the same growth and the same
// bytes resident; after a ragged plan each KV head in buffers of its own, sized to its own
// count), but the storage and EVERY pointer crossing the interface are on the device.
// Work goes on the default stream (nullptr), so it is ordered with the caller's kernels there.
// Host code (compiled by the C++ compiler); pulls in <cuda_runtime.h>.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "kernels/cuda/device_buffer.h"

namespace kvbench {

class CudaDenseLayerKv : public LayerKv {
 public:
  CudaDenseLayerKv(int32_t n_kv_heads, int32_t head_dim);

  void reserve(int64_t n_tokens) override;
  // k, v: DEVICE [n_new, n_kv_heads, head_dim]; positions: DEVICE [n_new]. Enqueued on the
  // default stream: the caller may reuse the inputs once its next work there is ordered after.
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  // query.q, query.q_positions, query.out: DEVICE pointers; head_dim 64 or 128 (the CUDA
  // kernel's). pages->pages: a DEVICE [n_kv_heads, n_selected] array; it is copied to the host
  // (a small synchronous copy) to count the slots read, so the bytes returned are exactly
  // DenseLayerKv's. The attention itself is left running on the default stream.
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  // plan is on the host, as for every store. The kept slots are placed as DenseLayerKv places
  // them (place_kept_slots: each hole filled from the tail), and plan.slots says so on return,
  // so both stores hold the same rows in the same slots. While the capacity stays (a
  // decode-step eviction) only the rows that move are copied, in place, and left running on
  // the default stream; a compression gathers the kept rows into fresh buffers of exactly
  // n_keep rows (synchronous). Merged contents (plan.k, plan.v) are supported.
  void retain(RetainPlan& plan) override;
  // A ragged plan (RetainPlan::head_keep) moves each KV head into buffers of its own, sized to
  // its count, as DenseLayerKv::split_heads does; later plans apply per head, as there.
  // DEVICE pointers: a policy or read policy that reads the view on the host cannot run on
  // this store (KvCache with this store takes no policy, reader or tap that reads on the host).
  // Once ragged, the shape alone (null pointers, n_tokens the largest head's), as DenseLayerKv.
  DenseKv view() const override;
  // A deep copy in device memory.
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override;  // ragged: the largest head's
  int64_t head_tokens(int32_t head) const override;
  bool holds_ragged_heads() const override { return true; }
  // Device bytes the buffers hold: k, v and positions at capacity (every head's, once ragged).
  int64_t bytes_resident() const override;
  const char* tier() const override { return "device"; }

  int64_t capacity() const { return capacity_; }
  bool ragged() const { return !heads_.empty(); }
  // KV head `head` alone (n_kv_heads 1, DEVICE pointers), ragged or not.
  DenseKv head_view(int32_t head) const;

 private:
  // Buffers for `capacity` rows per head, in DenseKv's layout.
  struct Rows {
    DeviceBuffer<float> k, v;         // [n_kv_heads, capacity, head_dim]
    DeviceBuffer<int32_t> positions;  // [n_kv_heads, capacity]
  };
  Rows allocate(int64_t capacity) const;
  // Copies the first n_rows rows of every head from `from` (capacity from_capacity) to `to`
  // (capacity to_capacity); enqueued on the default stream.
  void copy_rows(const Rows& from, int64_t from_capacity, Rows& to, int64_t to_capacity,
                 int64_t n_rows) const;
  // Moves the rows in use into buffers of exactly new_capacity (>= n_tokens) rows per head.
  void reallocate(int64_t new_capacity);
  // Row to[i] gets row from[i] (rows numbered across heads; none both read and written), in
  // the buffers held; enqueued.
  void move_in_place(const std::vector<int64_t>& from, const std::vector<int64_t>& to);
  // append() of this store's heads taken from source heads first_head.. of a projection
  // layout of src_heads heads (a ragged layer's one-head stores).
  void append_heads(const float* k, const float* v, const int32_t* positions, int64_t n_new,
                    int32_t first_head, int32_t src_heads);
  void split_heads(const RetainPlan& plan);  // the first ragged plan: one store per KV head
  void retain_per_head(RetainPlan& plan);     // a ragged plan, or any plan once ragged

  int32_t n_kv_heads_;
  int32_t head_dim_;
  int64_t capacity_ = 0;
  int64_t n_tokens_ = 0;
  bool evicted_ = false;  // a plan has dropped slots: growth is by kEvictionSlack
  Rows rows_;
  // The last in-place retain's row list (from, then to), kept so a decode-step eviction
  // allocates nothing; a few rows (see retain), not counted in bytes_resident.
  DeviceBuffer<int64_t> moves_;
  // After a ragged plan: KV head h alone in heads_[h] (rows_ then empty), and the table of
  // their views attention reads ([n_kv_heads] one-head DenseKv, uploaded at each attend:
  // appends move the counts; a few bytes, not counted in bytes_resident).
  std::vector<std::unique_ptr<CudaDenseLayerKv>> heads_;
  mutable DeviceBuffer<DenseKv> head_table_;
};

// Appends n_new tokens given in the projection layout (DEVICE k, v [n_new, src_heads,
// head_dim], positions [n_new]) to per-head rows on the device (k_rows, v_rows
// [n_kv_heads, capacity, head_dim], position_rows [n_kv_heads, capacity]) after the first
// n_tokens of each head, the store's heads taken from source heads first_head.. (src_heads 0:
// n_kv_heads); the room must be there. Enqueued on the default stream. The dense store and
// KIVI's fp32 tail share it (HeadRows::append on the host).
void append_projection_rows(float* k_rows, float* v_rows, int32_t* position_rows,
                            int32_t n_kv_heads, int32_t head_dim, int64_t capacity,
                            int64_t n_tokens, const float* k, const float* v,
                            const int32_t* positions, int64_t n_new, int32_t first_head = 0,
                            int32_t src_heads = 0);

// A device dense store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_cuda_dense_layers(const KvShape& shape);

// Device dense stores for every layer and no policy: the plain model path on a GPU. Its
// append/attend take device pointers; stats() counts its bytes in the "device" tier.
KvCache make_cuda_full_cache(const KvShape& shape);

}  // namespace kvbench
