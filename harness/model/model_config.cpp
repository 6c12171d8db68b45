#include "harness/model/model_config.h"

#include <cmath>

#include "harness/model/dequant.h"
#include "harness/model/gguf.h"

namespace kvbench {

ModelConfig ModelConfig::from_gguf(const GgufFile& file) {
  ModelConfig c;
  c.architecture = file.get_string("general.architecture");
  if (c.architecture != "llama" && c.architecture != "qwen2") {
    throw InputError(file.path() + ": unsupported architecture '" + c.architecture +
                     "' (kvbench runs llama-family models: general.architecture llama or qwen2)");
  }
  // llama.cpp's rope type for the architecture (llama_model_rope_type): NEOX for qwen2.
  c.rope_neox = c.architecture == "qwen2";
  const std::string a = c.architecture + ".";
  c.name = file.get_string("general.name", file.path());
  c.n_layers = static_cast<int32_t>(file.get_int(a + "block_count"));
  c.n_embd = static_cast<int32_t>(file.get_int(a + "embedding_length"));
  c.n_ff = static_cast<int32_t>(file.get_int(a + "feed_forward_length"));
  c.n_heads = static_cast<int32_t>(file.get_int(a + "attention.head_count"));
  c.n_kv_heads = static_cast<int32_t>(file.get_int(a + "attention.head_count_kv", c.n_heads));
  c.context_length = static_cast<int32_t>(file.get_int(a + "context_length"));
  c.rms_eps = static_cast<float>(file.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(file.get_float(a + "rope.freq_base", 10000.0));
  if (c.n_layers <= 0 || c.n_embd <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.n_heads % c.n_kv_heads != 0 || c.n_ff <= 0 || c.context_length <= 0) {
    throw InputError(file.path() + ": inconsistent " + c.architecture + " hyper-parameters (block_count, "
                     "embedding_length, head_count, head_count_kv must be positive and "
                     "head_count a multiple of head_count_kv)");
  }
  c.head_dim = static_cast<int32_t>(file.get_int(a + "attention.key_length", c.n_embd / c.n_heads));
  const int64_t rope_dims = file.get_int(a + "rope.dimension_count", c.head_dim);
  if (c.head_dim % 2 != 0 || c.head_dim > 1024 || rope_dims != c.head_dim) {
    throw InputError(file.path() + ": head_dim " + std::to_string(c.head_dim) +
                     " with rope.dimension_count " + std::to_string(rope_dims) +
                     " (kvbench expects an even head_dim <= 1024, fully rotated)");
  }

  for (int32_t i = 0; i < c.head_dim / 2; ++i) {
    c.rope_inv_freq.push_back(
        static_cast<float>(std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.head_dim)));
  }
  // Llama-3.1 GGUFs carry the scaling as a rope_freqs tensor of per-pair divisors.
  if (const GgufTensorInfo* freqs = file.find_tensor("rope_freqs.weight")) {
    if (freqs->n_elements() != c.head_dim / 2) {
      throw InputError(file.path() + ": rope_freqs.weight has " +
                       std::to_string(freqs->n_elements()) + " elements, expected " +
                       std::to_string(c.head_dim / 2));
    }
    std::vector<float> divisors(c.head_dim / 2);
    dequantize_row(freqs->type, freqs->data, divisors.data(), freqs->n_elements());
    for (int32_t i = 0; i < c.head_dim / 2; ++i) c.rope_inv_freq[i] /= divisors[i];
  } else if (file.get_string(a + "rope.scaling.type", "none") == "linear") {
    const double factor = file.get_float(a + "rope.scaling.factor", 1.0);
    if (!(factor > 0)) {
      throw InputError(file.path() + ": rope.scaling.factor must be positive");
    }
    for (float& f : c.rope_inv_freq) f = static_cast<float>(f / factor);
  }

  const GgufTensorInfo& embd = file.tensor("token_embd.weight");
  c.vocab_size = static_cast<int32_t>(file.get_int(a + "vocab_size", embd.shape.size() == 2 ? embd.shape[1] : 0));
  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  c.qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace kvbench
