// Hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

class GgufFile;

struct ModelConfig {
  std::string architecture;  // general.architecture ("llama", "qwen2" or "qwen3")
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
  bool qkv_bias = false;
  // Each query and key head RMS-normalized over head_dim before RoPE, by weights of its own
  // per layer (qwen3: attn_q_norm, attn_k_norm).
  bool qk_norm = false;
  // RoPE rotates the pairs (i, i + head_dim/2) (GPT-NeoX style: qwen2) rather than (2i, 2i+1).
  // The loader permutes Q and K rows into interleaved order, so every kernel sees one layout.
  bool rope_neox = false;

  // Throws InputError naming the file for an unsupported architecture or missing keys.
  static ModelConfig from_gguf(const GgufFile& file);
};

}  // namespace kvbench
