// CUDA twin of kernels/cpu/narrow.h: fp32 rows rounded to fp16, bf16 or fp8 e4m3 on the
// device, bit for bit as encode_kv_rows, and read back as decode_kv_rows; plus the two ways a
// device narrow store (methods/cuda/narrow_store.h) writes its rows: appending a chunk in the
// projection layout, and moving kept rows within its buffers. Include only from CUDA-aware
// code: this header pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// As encode_kv_rows, device pointers (src rows at src + r * src_stride; dst rows of dim
// elements back to back; scale [n_rows], fp8 only, may be nullptr otherwise). Bit-identical
// to the CPU. Enqueued on `stream`. Throws std::invalid_argument for n_rows < 0 or dim <= 0,
// std::runtime_error on a CUDA error.
void encode_kv_rows_cuda(KvElement element, const float* src, int64_t src_stride, int64_t n_rows,
                         int32_t dim, void* dst, float* scale, cudaStream_t stream);

// As decode_kv_rows, device pointers; bit-identical to the CPU. Enqueued on `stream`. Throws
// as encode_kv_rows_cuda.
void decode_kv_rows_cuda(KvElement element, const void* src, const float* scale, int64_t n_rows,
                         int32_t dim, float* dst, cudaStream_t stream);

// A narrow store's buffers as the kernels below write them: NarrowKv's layout (kernels/
// layouts.h), writable, device pointers. k_scale and v_scale are fp8's, nullptr otherwise.
struct NarrowTarget {
  void* k;             // [n_kv_heads, capacity, head_dim] elements
  void* v;
  float* k_scale;      // [n_kv_heads, capacity]
  float* v_scale;
  int32_t* positions;  // [n_kv_heads, capacity]
  KvElement element;
  int32_t n_kv_heads;
  int32_t head_dim;
  int64_t capacity;
};

// Appends n_new tokens in the projection layout (k, v: [n_new, n_kv_heads, head_dim] fp32,
// positions [n_new]; device) after the first n_tokens rows of each head of `rows`, rounded as
// encode_kv_rows rounds them: what NarrowLayerKv::append does per head, in one launch. The
// room must be there (n_tokens + n_new <= capacity). Enqueued on `stream`. Throws
// std::invalid_argument for n_new < 0 or too little room, std::runtime_error on a CUDA error.
void append_narrow_rows_cuda(const NarrowTarget& rows, int64_t n_tokens, const float* k,
                             const float* v, const int32_t* positions, int64_t n_new,
                             cudaStream_t stream);

// For i < n_moves, row to[i] of `rows` gets row from[i] (keys, values, their scales and the
// position), rows numbered across heads (h * capacity + slot); from and to [n_moves] are
// device arrays. Every move is copied at once, so no row may be both read and written: what
// place_kept_slots (cache/full_cache.h) gives with every slot settled (its holes lie below
// n_keep, the rows that fill them at or past it). A move with a row outside
// [0, n_kv_heads * capacity) is skipped (the emulation aborts on it, and on a row both read and
// written). Enqueued on `stream`. Throws std::invalid_argument for n_moves < 0,
// std::runtime_error on a CUDA error.
void move_narrow_rows_cuda(const NarrowTarget& rows, const int64_t* from, const int64_t* to,
                           int64_t n_moves, cudaStream_t stream);

}  // namespace kvbench
