// A llama-family transformer (RMSNorm, RoPE, GQA, SwiGLU, optional q/k/v bias, tied or
// separate LM head) loaded from GGUF and run on the CPU (BLAS GEMMs and the kernels of
// kernels/cpu) or, in a CUDA build, on a GPU (harness/model/cuda_forward.h).
// Attention never reads K/V directly: it goes through the sequence's KvCache (methods/).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "harness/model/model_config.h"
#include "harness/model/model_dtype.h"

namespace kvbench {

class GgufFile;
class Tokenizer;

// Where the forward pass runs and the KV cache lives.
enum class ModelDevice { Cpu, Cuda };

class LlamaModel {
 public:
  // Maps the GGUF file and prepares the weights (on `device`: Cuda copies them to the GPU
  // in `dtype`, fp32 or bf16; the CPU runs fp32 only). Throws InputError naming the file
  // when it is missing, corrupt, of an unsupported architecture, or lacks a tensor, for Cuda
  // in a build without CUDA or on a machine without a CUDA device, and for bf16 on the CPU.
  static std::unique_ptr<LlamaModel> load(const std::string& path,
                                          ModelDevice device = ModelDevice::Cpu,
                                          ModelDtype dtype = ModelDtype::Fp32);
  ~LlamaModel();

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  const GgufFile& file() const;
  // The cache shape; it carries the KV heads' retrieval scores once they are set (a probe of
  // this model, harness/head_probe.h), which methods that keep whole heads need.
  KvShape kv_shape() const;
  void set_head_retrieval(std::vector<float> scores);  // [n_layers * n_kv_heads]
  ModelDevice device() const;
  ModelDtype dtype() const;
  // Bytes the weights take in device memory (about half in bf16); 0 on the CPU.
  int64_t device_weight_bytes() const;

  // Feeds `tokens` at positions cache.next_position() onwards, in chunks of at most
  // prefill_chunk tokens, storing their keys and values in `cache`. Returns the logits of
  // the last token ([vocab]) or, with all_logits, of every token ([n_tokens, vocab]).
  // Throws InputError when the tokens would run past the model's context length.
  std::vector<float> forward(const std::vector<int32_t>& tokens, KvCache& cache,
                             bool all_logits = false) const;

  // Feeds prompt[begin, end) as forward() would, as one part of a prompt whose prefill is
  // split over several calls (continuous batching interleaves them with other sequences'
  // decode steps): the cache is told that the forward ends where the prompt ends. Returns the
  // logits of token end - 1. The parts of a prompt fed in order leave the cache forward()
  // leaves when each part is a whole number of prefill chunks.
  std::vector<float> forward_part(const std::vector<int32_t>& prompt, int64_t begin,
                                  int64_t end, KvCache& cache) const;

  // One decode step: feeds `token` (one the model generated, or a teacher-forced answer
  // token) as forward() does, marked so that a retrieval method selects what it reads
  // (KvCache::mark_decode_step). Returns its logits.
  std::vector<float> decode(int32_t token, KvCache& cache) const;

  // One decode step of several sequences at once (continuous batching, serve/): row i feeds
  // tokens[i] into *caches[i] as decode() would, each cache with its own method. On the CPU
  // the linear layers stream each weight once for all rows (the block kernels, whatever the
  // row count) and attention runs per sequence through its own cache, so every row's logits
  // equal decode()'s on that sequence alone, bit for bit. On a GPU the linear layers are one
  // cuBLAS GEMM over the n rows and attention runs per sequence through its device stores;
  // a row's logits equal decode()'s up to the GEMM's summation order, which cuBLAS may choose
  // by the row count (tests/test_cuda_model.cpp bounds it). Returns logits [n, vocab]. Throws
  // InputError where a sequence would run past the context length, std::invalid_argument for
  // a cache given twice or counts that differ.
  std::vector<float> decode_batch(const std::vector<int32_t>& tokens,
                                  const std::vector<KvCache*>& caches) const;

  // CacheBlend (Yao et al., EuroSys'25): stores `tokens` at positions cache.next_position()
  // onwards from KV computed elsewhere, recomputing only a part of it. cached_k, cached_v:
  // [n_layers, n_tokens, n_kv_heads * head_dim], keys already rotated to their new
  // positions. Layers 0..select_layer run in full; at select_layer the recompute_count()
  // tokens whose fresh keys deviate most from the cached ones are chosen, and only they go
  // through the later layers, their fresh KV replacing the cached one there (the others
  // keep theirs). Ratio 0 is naive reuse: no layer is computed. Ratio 1 is a full prefill.
  // Returns the tokens recomputed; computes no logits. Throws InputError for no tokens, a
  // ratio outside [0, 1], a select_layer that is not a layer, a context overrun, or a
  // model on a GPU (CacheBlend runs on the CPU only).
  int64_t forward_blend(const std::vector<int32_t>& tokens, const float* cached_k,
                        const float* cached_v, double recompute_ratio, int32_t select_layer,
                        KvCache& cache) const;
  // Tokens forward_blend recomputes out of n_tokens: ceil(ratio * n_tokens), so any
  // positive ratio recomputes at least one.
  static int64_t recompute_count(double ratio, int64_t n_tokens);

  // FastKV's token-selective propagation (TokenPolicy::propagation_layer): feeds `tokens` at
  // positions cache.next_position() onwards, all of them through layers 0..tsp_layer (in
  // chunks of prefill_chunk, as forward() does); then select(tsp_layer) names the rows that
  // go on (indices into `tokens`, ascending, the last one among them), and only their hidden
  // states run through the later layers, at their own positions, so those layers store only
  // their tokens and the prefill computes less. Returns the last token's logits ([vocab]);
  // with every row selected they are forward()'s, bit for bit. Reserves each layer's store
  // for the tokens it will hold. Throws InputError for no tokens, a tsp_layer that is not a
  // layer, a context overrun or a model on a GPU (the CPU forward only),
  // std::invalid_argument for a selection that breaks those rules.
  using RowSelector = std::function<std::vector<int64_t>(int32_t layer)>;
  std::vector<float> forward_propagating(const std::vector<int32_t>& tokens, int32_t tsp_layer,
                                         const RowSelector& select, KvCache& cache) const;

  int32_t prefill_chunk = static_cast<int32_t>(kPrefillChunk);

  // How the CPU forward rounds the activations of its few-row products (model_dtype.h);
  // Fp32 by default. Throws InputError for Int8 on a GPU, whose forward has no such path.
  void set_decode_activations(Activations activations);
  Activations decode_activations() const;
  // The same for the GEMMs of longer prefill chunks: Int8 repacks the weights for the
  // integer GEMM (kernels/cpu/gemm_q8.h) the first time it is chosen.
  void set_prefill_activations(Activations activations);
  Activations prefill_activations() const;

 private:
  struct Impl;
  explicit LlamaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvbench
