// kernels/cuda/narrow.h on the host: the wrappers' checks, every device pointer checked against
// the live allocations, then encode_kv_rows / decode_kv_rows (kernels/cpu/narrow.h), which the
// appends and moves of a narrow store are made of. Synchronous; the stream is ignored.
#include "kernels/cuda/narrow.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/narrow.h"
#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

namespace {

void check_rows(int64_t n_rows, int32_t dim, const char* who) {
  if (n_rows < 0 || dim <= 0) {
    throw std::invalid_argument(std::string(who) + ": n_rows must be >= 0 and dim > 0, got " +
                                std::to_string(n_rows) + ", " + std::to_string(dim));
  }
}

// Every array of `rows` over its whole capacity.
void require_target(const NarrowTarget& rows, const char* who) {
  const int64_t slots = static_cast<int64_t>(rows.n_kv_heads) * rows.capacity;
  const int64_t bytes = slots * rows.head_dim * kv_element_bytes(rows.element);
  emulated::require_device(rows.k, bytes, who, "rows.k");
  emulated::require_device(rows.v, bytes, who, "rows.v");
  if (rows.element == KvElement::F8E4M3) {
    emulated::require_device_array(rows.k_scale, slots, who, "rows.k_scale");
    emulated::require_device_array(rows.v_scale, slots, who, "rows.v_scale");
  }
  emulated::require_device_array(rows.positions, slots, who, "rows.positions");
}

}  // namespace

void encode_kv_rows_cuda(KvElement element, const float* src, int64_t src_stride, int64_t n_rows,
                         int32_t dim, void* dst, float* scale, cudaStream_t) {
  const char* who = "encode_kv_rows_cuda";
  check_rows(n_rows, dim, who);
  if (n_rows == 0) return;
  emulated::require_device_array(src, (n_rows - 1) * src_stride + dim, who, "src");
  emulated::require_device(dst, n_rows * dim * kv_element_bytes(element), who, "dst");
  if (element == KvElement::F8E4M3) emulated::require_device_array(scale, n_rows, who, "scale");
  encode_kv_rows(element, src, src_stride, n_rows, dim, dst, scale);
}

void decode_kv_rows_cuda(KvElement element, const void* src, const float* scale, int64_t n_rows,
                         int32_t dim, float* dst, cudaStream_t) {
  const char* who = "decode_kv_rows_cuda";
  check_rows(n_rows, dim, who);
  if (n_rows == 0) return;
  emulated::require_device(src, n_rows * dim * kv_element_bytes(element), who, "src");
  if (element == KvElement::F8E4M3) emulated::require_device_array(scale, n_rows, who, "scale");
  emulated::require_device_array(dst, n_rows * dim, who, "dst");
  decode_kv_rows(element, src, scale, n_rows, dim, dst);
}

void append_narrow_rows_cuda(const NarrowTarget& rows, int64_t n_tokens, const float* k,
                             const float* v, const int32_t* positions, int64_t n_new,
                             cudaStream_t) {
  const char* who = "append_narrow_rows_cuda";
  if (n_new < 0 || n_tokens < 0 || n_tokens + n_new > rows.capacity) {
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(n_new) +
                                " rows after " + std::to_string(n_tokens) +
                                " do not fit a capacity of " + std::to_string(rows.capacity));
  }
  if (n_new == 0 || rows.n_kv_heads <= 0) return;
  check_rows(n_new, rows.head_dim, who);
  const int64_t stride = static_cast<int64_t>(rows.n_kv_heads) * rows.head_dim;  // per token
  emulated::require_device_array(k, n_new * stride, who, "k");
  emulated::require_device_array(v, n_new * stride, who, "v");
  emulated::require_device_array(positions, n_new, who, "positions");
  require_target(rows, who);
  // NarrowLayerKv::append's loop.
  const bool scaled = rows.element == KvElement::F8E4M3;
  const int64_t row_bytes = static_cast<int64_t>(rows.head_dim) * kv_element_bytes(rows.element);
  for (int32_t h = 0; h < rows.n_kv_heads; ++h) {
    const int64_t row = h * rows.capacity + n_tokens;
    encode_kv_rows(rows.element, k + h * rows.head_dim, stride, n_new, rows.head_dim,
                   static_cast<uint8_t*>(rows.k) + row * row_bytes,
                   scaled ? rows.k_scale + row : nullptr);
    encode_kv_rows(rows.element, v + h * rows.head_dim, stride, n_new, rows.head_dim,
                   static_cast<uint8_t*>(rows.v) + row * row_bytes,
                   scaled ? rows.v_scale + row : nullptr);
    std::memcpy(rows.positions + row, positions, n_new * sizeof(int32_t));
  }
}

void move_narrow_rows_cuda(const NarrowTarget& rows, const int64_t* from, const int64_t* to,
                           int64_t n_moves, cudaStream_t) {
  const char* who = "move_narrow_rows_cuda";
  if (n_moves < 0) throw std::invalid_argument(std::string(who) + ": n_moves < 0");
  if (n_moves == 0) return;
  emulated::require_device_array(from, n_moves, who, "from");
  emulated::require_device_array(to, n_moves, who, "to");
  require_target(rows, who);
  // The kernel copies every move at once: a row both read and written would race there.
  const int64_t n_rows = static_cast<int64_t>(rows.n_kv_heads) * rows.capacity;
  std::vector<char> read(static_cast<size_t>(n_rows), 0);
  for (int64_t i = 0; i < n_moves; ++i) {
    if (from[i] < 0 || from[i] >= n_rows || to[i] < 0 || to[i] >= n_rows) {
      emulated::fail(who, "a move's row is outside the buffers");
    }
    read[from[i]] = 1;
  }
  for (int64_t i = 0; i < n_moves; ++i) {
    if (read[to[i]]) emulated::fail(who, "a row is both moved from and moved to");
  }
  const int64_t row_bytes = static_cast<int64_t>(rows.head_dim) * kv_element_bytes(rows.element);
  for (int64_t i = 0; i < n_moves; ++i) {
    std::memcpy(static_cast<uint8_t*>(rows.k) + to[i] * row_bytes,
                static_cast<const uint8_t*>(rows.k) + from[i] * row_bytes, row_bytes);
    std::memcpy(static_cast<uint8_t*>(rows.v) + to[i] * row_bytes,
                static_cast<const uint8_t*>(rows.v) + from[i] * row_bytes, row_bytes);
    rows.positions[to[i]] = rows.positions[from[i]];
    if (rows.element == KvElement::F8E4M3) {
      rows.k_scale[to[i]] = rows.k_scale[from[i]];
      rows.v_scale[to[i]] = rows.v_scale[from[i]];
    }
  }
}

}  // namespace kvbench
