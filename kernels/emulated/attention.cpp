// attention_dense_cuda, attention_sparse_cuda, attention_pages_cuda, attention_ragged_cuda and
// attention_narrow_cuda (kernels/cuda/attention.h) on the host: the CUDA wrapper's argument
// checks, every device pointer checked against the live allocations, then attention_dense_cpu /
// attention_sparse_cpu / attention_pages_cpu / attention_ragged_cpu / attention_narrow_cpu.
// Synchronous; the stream is ignored.
#include "kernels/cuda/attention.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

namespace {

void check_heads(const AttentionQuery& query, int32_t n_kv_heads, int32_t head_dim,
                 const char* who) {
  if (n_kv_heads <= 0 || query.n_heads % n_kv_heads != 0) {
    throw std::invalid_argument(std::string(who) + ": n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(n_kv_heads) + ")");
  }
  if (head_dim != 64 && head_dim != 128) {
    throw std::invalid_argument(std::string(who) + ": head_dim must be 64 or 128, got " +
                                std::to_string(head_dim));
  }
}

void check_pages(const PageSelection& pages, const char* who) {
  if (pages.page_tokens <= 0 || pages.n_selected < 0) {
    throw std::invalid_argument(std::string(who) +
                                ": page_tokens must be > 0 and n_selected >= 0");
  }
}

bool pages_in_range(const PageSelection& pages, int32_t n_kv_heads, int64_t n_tokens) {
  const int64_t n = static_cast<int64_t>(n_kv_heads) * pages.n_selected;
  for (int64_t i = 0; i < n; ++i) {
    if (pages.pages[i] < 0 || int64_t{pages.pages[i]} * pages.page_tokens >= n_tokens) {
      return false;
    }
  }
  return true;
}

// The CUDA kernel skips a negative page and a page past n_tokens; the CPU kernels take
// neither. No CPU counterpart, so: each KV head on its own, with only its valid pages.
// attend_head(h, part, selection) attends KV head h alone (one KV head, `group` query heads).
template <class AttendHead>
void attention_valid_pages_by_head(const AttentionQuery& query, int32_t n_kv_heads, int32_t dim,
                                   int64_t n_tokens, const PageSelection& pages,
                                   const AttendHead& attend_head) {
  const int group = query.n_heads / n_kv_heads;
  const int64_t row = static_cast<int64_t>(group) * dim;
  std::vector<float> q(static_cast<size_t>(query.n_queries * row)), out(q.size());
  for (int h = 0; h < n_kv_heads; ++h) {
    std::vector<int32_t> valid;
    for (int32_t i = 0; i < pages.n_selected; ++i) {
      const int32_t p = pages.pages[static_cast<int64_t>(h) * pages.n_selected + i];
      if (p >= 0 && int64_t{p} * pages.page_tokens < n_tokens) valid.push_back(p);
    }
    for (int i = 0; i < query.n_queries; ++i) {
      const float* src = query.q + (static_cast<int64_t>(i) * query.n_heads + h * group) * dim;
      std::copy(src, src + row, q.begin() + i * row);
    }
    const AttentionQuery part{q.data(), query.q_positions, out.data(), query.n_queries, group,
                              query.scale};
    attend_head(h, part,
                PageSelection{valid.data(), static_cast<int32_t>(valid.size()), pages.page_tokens});
    for (int i = 0; i < query.n_queries; ++i) {
      std::copy(out.begin() + i * row, out.begin() + (i + 1) * row,
                query.out + (static_cast<int64_t>(i) * query.n_heads + h * group) * dim);
    }
  }
}

}  // namespace

void attention_dense_cuda(const AttentionQuery& query, const DenseKv& kv, cudaStream_t) {
  const char* who = "attention_dense_cuda";
  if (query.n_queries <= 0) return;
  check_heads(query, kv.n_kv_heads, kv.head_dim, who);
  emulated::require_query(query, kv.head_dim, who);
  emulated::require_dense_kv(kv, who);
  attention_dense_cpu(query, kv);
}

AttentionPairs attention_sparse_cuda(const AttentionQuery& query, const DenseKv& kv,
                                     const SparsePattern& pattern, cudaStream_t) {
  const char* who = "attention_sparse_cuda";
  if (query.n_queries <= 0) return AttentionPairs{};
  check_heads(query, kv.n_kv_heads, kv.head_dim, who);
  emulated::require_query(query, kv.head_dim, who);
  emulated::require_dense_kv(kv, who);
  // The lists are read on the device (and copied down to count the pairs).
  if (pattern.n_columns > 0) {
    emulated::require_device_array(pattern.columns,
                                   static_cast<int64_t>(query.n_heads) * pattern.n_columns, who,
                                   "pattern.columns");
  }
  if (pattern.n_offsets > 0) {
    emulated::require_device_array(pattern.offsets,
                                   static_cast<int64_t>(query.n_heads) * pattern.n_offsets, who,
                                   "pattern.offsets");
  }
  return attention_sparse_cpu(query, kv, pattern);
}

void attention_pages_cuda(const AttentionQuery& query, const DenseKv& kv,
                          const PageSelection& pages, cudaStream_t) {
  const char* who = "attention_pages_cuda";
  if (query.n_queries <= 0) return;
  if (kv.n_kv_heads <= 0 || query.n_heads % kv.n_kv_heads != 0) {
    check_heads(query, kv.n_kv_heads, kv.head_dim, who);
  }
  check_pages(pages, who);
  check_heads(query, kv.n_kv_heads, kv.head_dim, who);
  emulated::require_query(query, kv.head_dim, who);
  emulated::require_dense_kv(kv, who);
  emulated::require_pages(pages, kv.n_kv_heads, who);
  if (pages_in_range(pages, kv.n_kv_heads, kv.n_tokens)) {
    attention_pages_cpu(query, kv, pages);
    return;
  }
  const int dim = kv.head_dim;
  attention_valid_pages_by_head(
      query, kv.n_kv_heads, dim, kv.n_tokens, pages,
      [&](int h, const AttentionQuery& part, const PageSelection& valid) {
        const int64_t head = static_cast<int64_t>(h) * kv.capacity;
        const DenseKv one{kv.k + head * dim, kv.v + head * dim, kv.positions + head, 1, dim,
                          kv.capacity, kv.n_tokens};
        attention_pages_cpu(part, one, valid);
      });
}

void attention_ragged_cuda(const AttentionQuery& query, const DenseKv* heads, int32_t n_kv_heads,
                           int32_t head_dim, int64_t max_tokens, cudaStream_t) {
  const char* who = "attention_ragged_cuda";
  if (query.n_queries <= 0) return;
  check_heads(query, n_kv_heads, head_dim, who);
  emulated::require_query(query, head_dim, who);
  emulated::require_device_array(heads, n_kv_heads, who, "the head table");
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    if (heads[h].n_kv_heads != 1 || heads[h].head_dim != head_dim ||
        heads[h].n_tokens > max_tokens) {
      throw std::invalid_argument(std::string(who) + ": head " + std::to_string(h) +
                                  " is not one head of head_dim " + std::to_string(head_dim) +
                                  " and at most max_tokens tokens");
    }
    emulated::require_dense_kv(heads[h], who);
  }
  attention_ragged_cpu(query, heads, n_kv_heads);
}

void attention_narrow_cuda(const AttentionQuery& query, const NarrowKv& kv,
                           const PageSelection* pages, cudaStream_t) {
  const char* who = "attention_narrow_cuda";
  if (query.n_queries <= 0) return;
  if (kv.n_kv_heads <= 0 || query.n_heads % kv.n_kv_heads != 0) {
    check_heads(query, kv.n_kv_heads, kv.head_dim, who);
  }
  if (pages) check_pages(*pages, who);
  check_heads(query, kv.n_kv_heads, kv.head_dim, who);
  const bool scaled = kv.element == KvElement::F8E4M3;
  if (scaled && (kv.k_scale == nullptr || kv.v_scale == nullptr)) {
    throw std::invalid_argument(std::string(who) + ": fp8 needs k_scale and v_scale");
  }
  emulated::require_query(query, kv.head_dim, who);
  emulated::require_narrow_kv(kv, who);
  if (pages) emulated::require_pages(*pages, kv.n_kv_heads, who);
  if (!pages || pages_in_range(*pages, kv.n_kv_heads, kv.n_tokens)) {
    attention_narrow_cpu(query, kv, pages);
    return;
  }
  const int64_t row_bytes = static_cast<int64_t>(kv.head_dim) * kv_element_bytes(kv.element);
  attention_valid_pages_by_head(
      query, kv.n_kv_heads, kv.head_dim, kv.n_tokens, *pages,
      [&](int h, const AttentionQuery& part, const PageSelection& valid) {
        const int64_t head = static_cast<int64_t>(h) * kv.capacity;
        const NarrowKv one{static_cast<const uint8_t*>(kv.k) + head * row_bytes,
                           static_cast<const uint8_t*>(kv.v) + head * row_bytes,
                           scaled ? kv.k_scale + head : nullptr,
                           scaled ? kv.v_scale + head : nullptr,
                           kv.positions + head,
                           kv.element,
                           1,
                           kv.head_dim,
                           kv.capacity,
                           kv.n_tokens};
        attention_narrow_cpu(part, one, &valid);
      });
}

}  // namespace kvbench
