// The transformer forward pass on a GPU (LlamaModel loaded with ModelDevice::Cuda): the
// weights in device memory, the linear layers through cuBLAS, the per-token operations and
// attention through the kernels of kernels/cuda, and the KV in a cache of device stores
// (cache/cuda/dense_store.h). The model code hands it host views of its fp32 weights; no
// CUDA or libtorch header is pulled in here.
//
// ModelDtype::Fp32 (the default and the fidelity reference): everything fp32, GEMMs in full
// fp32 (no TF32), so logits agree with the CPU's to summation order.
//
// ModelDtype::Bf16, as an engine runs a bf16 checkpoint. Rounding is always to nearest even.
// - Weights: every matrix is held as bf16 (half the fp32 bytes); norm weights and biases
//   are rounded to bf16 too (a bf16 checkpoint has nothing wider), held in fp32.
// - GEMMs: bf16 operands, products summed in fp32 (cublasGemmEx, CUBLAS_COMPUTE_32F); the
//   fp32 result plus the bias, if any, is rounded to bf16 once, as an epilogue does.
// - Activations are rounded to bf16 where an engine stores them: the embeddings; every GEMM
//   input (the two RMSNorm outputs, the attention output, silu(gate) * up) and output
//   (q, k, v, o, gate, up, down); q and k again after RoPE; the residual stream after each
//   add. They are held in fp32 buffers between the kernels (bf16-valued: no number changes,
//   only activation bytes, which decode does not spend its time on).
// - Computed in fp32 from those bf16 values, rounded only where they are stored: RMSNorm
//   (sum of squares, scale), RoPE (angle in double, as fp32), silu * up (once, as vLLM's
//   fused kernel), the residual add, attention (scores, softmax and P.V in fp32, P not rounded
//   to bf16 as FlashAttention's second GEMM does: the KV stores' kernels serve both dtypes).
// - The KV cache stays fp32: it holds the bf16-valued k and v at fp32's bytes (16-bit KV
//   storage is its own issue).
// - The logits stay fp32 (the LM head's fp32 sum, not rounded): bf16 logits of ~20 have a
//   step of 0.125 and would tie, and the harness compares distributions (TensorRT-LLM's
//   logits dtype is fp32 too).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "harness/model/model_config.h"
#include "harness/model/model_dtype.h"

namespace kvbench {

// Host fp32 weights of one linear layer: w [rows, cols] row-major, bias [rows] or nullptr.
struct HostLinear {
  const float* w = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* bias = nullptr;
};

struct HostLayer {
  const float* attn_norm = nullptr;  // [n_embd]
  const float* ffn_norm = nullptr;   // [n_embd]
  HostLinear q, k, v, o, gate, up, down;
  const float* q_norm = nullptr;  // [head_dim] per-head query norm (Architecture::qk_norm)
  const float* k_norm = nullptr;  // [head_dim] per-head key norm
};

struct HostWeights {
  std::vector<HostLayer> layers;
  const float* output_norm = nullptr;  // [n_embd]
  HostLinear lm_head;
};

class CudaForward {
 public:
  // Copies the weights to the current CUDA device, converted to `dtype`. Throws
  // std::runtime_error naming the CUDA or cuBLAS call that failed (no device, out of memory).
  CudaForward(const ModelConfig& config, const HostWeights& weights,
              ModelDtype dtype = ModelDtype::Fp32);
  ~CudaForward();

  // One chunk of n tokens at positions cache.next_position() onwards through every layer:
  // x holds their embeddings on the host ([n, n_embd]); `cache` holds device stores. Writes
  // the logits of the last row, or of all rows, to the host, then advances the cache.
  void forward_chunk(const float* x, int64_t n, KvCache& cache, bool all_logits,
                     float* logits) const;

  // One decode step of n sequences (LlamaModel::decode_batch): row i of x ([n, n_embd], on
  // the host) is the next token of *caches[i], at that cache's next position. The linear
  // layers run as one GEMM over the n rows, each row's attention through its own cache (its
  // own method's device stores). Writes the logits of every row ([n, vocab]) to the host,
  // then advances every cache by one.
  void decode_rows(const float* x, int64_t n, KvCache* const* caches, float* logits) const;

  ModelDtype dtype() const;
  // Device bytes the weights take (matrices, norm weights, biases): about half in bf16.
  int64_t weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when a CUDA device is present.
bool cuda_device_present();

}  // namespace kvbench
