// attention_kivi_cuda (kernels/cuda/kivi_attention.h) on the host: the wrapper's checks, every
// array of the KIVI layout checked against the live allocations, then attention_kivi_cpu (which
// skips a negative page and clamps pages to the stored slots, as the kernel). Synchronous.
#include "kernels/cuda/kivi_attention.h"

#include <stdexcept>
#include <string>

#include "kernels/cpu/kivi_attention.h"
#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

void attention_kivi_cuda(const AttentionQuery& query, const KiviKv& kv, const PageSelection* pages,
                         cudaStream_t) {
  const char* who = "attention_kivi_cuda";
  if (query.n_queries <= 0) return;
  const int n_kv_heads = kv.tail.n_kv_heads;
  const int dim = kv.tail.head_dim;
  if (n_kv_heads <= 0 || query.n_heads % n_kv_heads != 0) {
    throw std::invalid_argument("attention_kivi_cuda: n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(n_kv_heads) + ")");
  }
  if ((dim != 64 && dim != 128) || kv.group != 32 || (kv.bits != 2 && kv.bits != 4)) {
    throw std::invalid_argument(
        "attention_kivi_cuda: head_dim must be 64 or 128, group 32 and bits 2 or 4, got "
        "head_dim " +
        std::to_string(dim) + ", group " + std::to_string(kv.group) + ", bits " +
        std::to_string(kv.bits));
  }
  if (pages != nullptr && (pages->page_tokens <= 0 || pages->n_selected < 0)) {
    throw std::invalid_argument("attention_kivi_cuda: page_tokens must be > 0 and n_selected >= 0");
  }
  emulated::require_query(query, dim, who);
  const int64_t block_heads = kv.n_blocks * n_kv_heads;  // [n_blocks, n_kv_heads, ...]
  const int64_t codes = block_heads * dim * kv.group * kv.bits / 8;
  emulated::require_device_array(kv.k_codes, codes, who, "kv.k_codes");
  emulated::require_device_array(kv.k_scale, block_heads * dim, who, "kv.k_scale");
  emulated::require_device_array(kv.k_min, block_heads * dim, who, "kv.k_min");
  emulated::require_device_array(kv.v_codes, codes, who, "kv.v_codes");
  emulated::require_device_array(kv.v_scale, block_heads * dim, who, "kv.v_scale");
  emulated::require_device_array(kv.v_min, block_heads * dim, who, "kv.v_min");
  emulated::require_device_array(kv.positions, block_heads * kv.group, who, "kv.positions");
  emulated::require_dense_kv(kv.tail, who);
  if (pages != nullptr) emulated::require_pages(*pages, n_kv_heads, who);
  attention_kivi_cpu(query, kv, pages);
}

}  // namespace kvbench
