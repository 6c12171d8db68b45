// Hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

class GgufFile;

struct ModelConfig {
  std::string architecture;  // general.architecture ("llama")
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
  // Per-pair RoPE frequency, theta^(-2i/head_dim), divided by llama3 / linear scaling.
  std::vector<float> rope_inv_freq;  // [head_dim / 2]
  bool tied_embeddings = true;  // no output.weight: the LM head is token_embd
  bool qkv_bias = false;

  // Throws InputError naming the file for an unsupported architecture or missing keys.
  static ModelConfig from_gguf(const GgufFile& file);
};

// Llama-3.1 RoPE scaling (Meta's apply_scaling): long wavelengths divided by `factor`,
// short ones kept, a smooth ramp between. Returns the scaled inverse frequencies.
std::vector<float> llama3_scaled_inv_freq(const std::vector<float>& inv_freq, float factor,
                                          float low_freq_factor, float high_freq_factor,
                                          int32_t original_context_length);

}  // namespace kvbench
