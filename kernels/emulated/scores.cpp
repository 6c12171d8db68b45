// The token scores of kernels/cuda/scores.h on the host: the wrappers' checks, pointers checked
// against the live allocations, then kernels/cpu/scores.h. Synchronous; the CUDA versions'
// temporaries (cudaMallocAsync) are the CPU's own scratch here.
#include "kernels/cuda/scores.h"

#include <stdexcept>
#include <string>

#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

namespace {

constexpr int64_t kMaxGridY = 65535;

void check_kv_heads(const DenseKv& kv, const char* who) {
  if (kv.n_kv_heads > kMaxGridY) {
    throw std::invalid_argument(std::string(who) + ": more than 65535 KV heads");
  }
}

}  // namespace

void attention_scores_cuda(const AttentionQuery& query, const DenseKv& kv, float* scores,
                           cudaStream_t) {
  const char* who = "attention_scores_cuda";
  if (kv.n_kv_heads <= 0 || query.n_heads % kv.n_kv_heads != 0) {
    throw std::invalid_argument(std::string(who) + ": n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(kv.n_kv_heads) + ")");
  }
  if (query.n_heads > kMaxGridY) {
    throw std::invalid_argument(std::string(who) + ": more than 65535 query heads");
  }
  if (kv.head_dim != 64 && kv.head_dim != 128) {
    throw std::invalid_argument(std::string(who) + ": head_dim must be 64 or 128, got " +
                                std::to_string(kv.head_dim));
  }
  if (query.n_queries <= 0 || kv.n_tokens <= 0) return;
  emulated::require_query(query, kv.head_dim, who, /*writes_out=*/false);
  emulated::require_dense_kv(kv, who);
  emulated::require_device_array(scores, int64_t{query.n_heads} * kv.n_tokens, who, "scores");
  attention_scores_cpu(query, kv, scores);
}

void key_norms_cuda(const DenseKv& kv, float* norms, cudaStream_t) {
  const char* who = "key_norms_cuda";
  check_kv_heads(kv, who);
  if (kv.n_tokens <= 0 || kv.n_kv_heads <= 0) return;
  emulated::require_dense_kv(kv, who);
  emulated::require_device_array(norms, kv.n_kv_heads * kv.n_tokens, who, "norms");
  key_norms_cpu(kv, norms);
}

void key_anchor_cosine_cuda(const DenseKv& kv, float* cosine, cudaStream_t) {
  const char* who = "key_anchor_cosine_cuda";
  check_kv_heads(kv, who);
  if (kv.n_tokens <= 0 || kv.n_kv_heads <= 0) return;
  emulated::require_dense_kv(kv, who);
  emulated::require_device_array(cosine, kv.n_kv_heads * kv.n_tokens, who, "cosine");
  key_anchor_cosine_cpu(kv, cosine);
}

void pool1d_cuda(const float* in, float* out, int64_t rows, int64_t n, int32_t kernel,
                 PoolKind kind, cudaStream_t) {
  if (kernel <= 0 || kernel % 2 == 0 || in == out) {
    throw std::invalid_argument("pool1d_cuda: kernel must be odd and positive (got " +
                                std::to_string(kernel) + "), in and out distinct");
  }
  if (rows <= 0 || n <= 0) return;
  emulated::require_device_array(in, rows * n, "pool1d_cuda", "in");
  emulated::require_device_array(out, rows * n, "pool1d_cuda", "out");
  pool1d_cpu(in, out, rows, n, kernel, kind);
}

void top_k_indices_cuda(const float* values, int64_t rows, int64_t n, int64_t k, int32_t* out,
                        cudaStream_t) {
  constexpr int64_t kMax = 2147483647;
  if (k < 0 || k > n || n > kMax || rows < 0 || rows > kMax) {
    throw std::invalid_argument("top_k_indices_cuda: needs 0 <= k (" + std::to_string(k) +
                                ") <= n (" + std::to_string(n) + ") < 2^31 and rows < 2^31");
  }
  if (k == 0 || rows == 0) return;
  emulated::require_device_array(values, rows * n, "top_k_indices_cuda", "values");
  emulated::require_device_array(out, rows * k, "top_k_indices_cuda", "out");
  top_k_indices_cpu(values, rows, n, k, out);
}

}  // namespace kvbench
