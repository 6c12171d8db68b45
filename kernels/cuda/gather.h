// CUDA twin of kernels/cpu/gather.h: applies a retain plan on the device, copying each KV head's
// kept slots, compacted, from one DenseKv (kernels/layouts.h) into another, or moving the rows a
// placement moves within one. Include only from CUDA-aware code: this header pulls in
// <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/gather.h"
#include "kernels/layouts.h"

namespace kvbench {

// As gather_rows_cpu: slot j of KV head h in `out` gets slot slots[h * n_keep + j] of `kv` (key,
// value, position). kv's and out's pointers and slots ([n_kv_heads, n_keep]) are on the device;
// `out` must not overlap `kv`. Enqueued on `stream` (asynchronous); bit-identical to the CPU (a
// copy). Returns the view of `out` holding n_keep tokens. The slots are not read back: a slot
// outside [0, kv.n_tokens) leaves its output row unwritten instead of reading out of bounds
// (the CPU throws). Throws std::invalid_argument for n_keep < 0 or out.capacity < n_keep,
// std::runtime_error on a CUDA error.
DenseKv gather_rows_cuda(const DenseKv& kv, const int32_t* slots, int64_t n_keep,
                         const GatherTarget& out, cudaStream_t stream);

// As move_rows_cpu: row to[i] of `rows` gets row from[i] (key, value, position) for i < n_moves,
// rows numbered across the n_kv_heads heads. rows' pointers, from and to ([n_moves]) are on the
// device. Every move is copied at once: no row may be both a source and a destination, nor a
// destination twice (not checked here; the CPU reference, and so the emulation, throws). Enqueued
// on `stream`; bit-identical to the CPU (a copy). A move with a row outside [0, n_kv_heads *
// rows.capacity) is skipped (the CPU throws). Throws std::invalid_argument for n_moves < 0 (or more
// than one launch's grid holds), std::runtime_error on a CUDA error.
void move_rows_cuda(const GatherTarget& rows, int32_t n_kv_heads, int32_t head_dim,
                    const int64_t* from, const int64_t* to, int64_t n_moves, cudaStream_t stream);

}  // namespace kvbench
