// The extents the kernels' layouts (kernels/layouts.h) imply, checked by every emulated kernel
// before it runs its CPU reference: a pointer outside one live device allocation aborts.
#pragma once

#include <cstdint>

#include "kernels/emulated/device_memory.h"
#include "kernels/layouts.h"

namespace kvbench::emulated {

// Rows a per-head array of `capacity` stride spans when each head holds n rows.
inline int64_t strided_rows(int64_t heads, int64_t capacity, int64_t n) {
  return heads <= 0 || n <= 0 ? 0 : (heads - 1) * capacity + n;
}

inline void require_dense_kv(const DenseKv& kv, const char* who) {
  const int64_t rows = strided_rows(kv.n_kv_heads, kv.capacity, kv.n_tokens);
  require_device_array(kv.k, rows * kv.head_dim, who, "kv.k");
  require_device_array(kv.v, rows * kv.head_dim, who, "kv.v");
  require_device_array(kv.positions, rows, who, "kv.positions");
}

// NarrowKv's arrays: elements of kv_element_bytes each, fp8's row scales.
inline void require_narrow_kv(const NarrowKv& kv, const char* who) {
  const int64_t rows = strided_rows(kv.n_kv_heads, kv.capacity, kv.n_tokens);
  const int64_t bytes = rows * kv.head_dim * kv_element_bytes(kv.element);
  require_device(kv.k, bytes, who, "kv.k");
  require_device(kv.v, bytes, who, "kv.v");
  if (kv.element == KvElement::F8E4M3) {
    require_device_array(kv.k_scale, rows, who, "kv.k_scale");
    require_device_array(kv.v_scale, rows, who, "kv.v_scale");
  }
  require_device_array(kv.positions, rows, who, "kv.positions");
}

// q and out [n_queries, n_heads, head_dim], q_positions [n_queries].
inline void require_query(const AttentionQuery& query, int32_t head_dim, const char* who,
                          bool writes_out = true) {
  const int64_t n = static_cast<int64_t>(query.n_queries) * query.n_heads * head_dim;
  require_device_array(query.q, n, who, "query.q");
  require_device_array(query.q_positions, int64_t{query.n_queries}, who, "query.q_positions");
  if (writes_out) require_device_array(query.out, n, who, "query.out");
}

inline void require_pages(const PageSelection& pages, int32_t n_kv_heads, const char* who) {
  require_device_array(pages.pages, static_cast<int64_t>(n_kv_heads) * pages.n_selected, who,
                       "pages.pages");
}

}  // namespace kvbench::emulated
