// Hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/model/arch/architecture.h"

namespace kvbench {

class GgufFile;

struct ModelConfig {
  // general.architecture's entry (arch/architecture.h): what the layer loop does differently.
  const Architecture* arch = nullptr;  // never null once read
  std::string name;          // general.name, or the file name
  int32_t n_layers = 0;
  int32_t n_embd = 0;
  int32_t n_ff = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.f;
  // Per-pair RoPE frequency theta^(-2i/head_dim), divided by the rope_freqs.weight factors
  // (how llama.cpp's converter stores Llama-3.1 scaling) or by a linear scaling factor.
  std::vector<float> rope_inv_freq;  // [head_dim / 2]
  bool tied_embeddings = true;  // no output.weight: the LM head is token_embd
  // blk.N.attn_{q,k,v}.bias are in the file (any architecture: llama.cpp reads them where
  // present).
  bool qkv_bias = false;

  // Throws InputError naming the file for an unsupported architecture or missing keys.
  static ModelConfig from_gguf(const GgufFile& file);
};

}  // namespace kvbench
