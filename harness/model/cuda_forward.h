// The transformer forward pass on a GPU (LlamaModel loaded with ModelDevice::Cuda): the
// weights in device memory as fp32, the linear layers through cuBLAS, the per-token
// operations and attention through the kernels of kernels/cuda, and the KV in a cache of
// device stores (methods/cuda_dense_store.h). The model code hands it host views of its
// weights; no CUDA or libtorch header is pulled in here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "harness/model/model_config.h"
#include "methods/kv_cache.h"

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
};

struct HostWeights {
  std::vector<HostLayer> layers;
  const float* output_norm = nullptr;  // [n_embd]
  HostLinear lm_head;
};

class CudaForward {
 public:
  // Copies the weights to the current CUDA device. Throws std::runtime_error naming the
  // CUDA or cuBLAS call that failed (no device, out of memory).
  CudaForward(const ModelConfig& config, const HostWeights& weights);
  ~CudaForward();

  // One chunk of n tokens at positions cache.next_position() onwards through every layer:
  // x holds their embeddings on the host ([n, n_embd]); `cache` holds device stores. Writes
  // the logits of the last row, or of all rows, to the host, then advances the cache.
  void forward_chunk(const float* x, int64_t n, KvCache& cache, bool all_logits,
                     float* logits) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when a CUDA device is present.
bool cuda_device_present();

}  // namespace kvbench
