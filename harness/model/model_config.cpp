#include "harness/model/model_config.h"

#include <algorithm>
#include <cmath>

#include "harness/model/dequant.h"
#include "harness/model/gguf.h"

namespace kvbench {

ModelConfig ModelConfig::from_gguf(const GgufFile& file) {
  ModelConfig c;
  const std::string architecture = file.get_string("general.architecture");
  c.arch = find_architecture(architecture);
  if (!c.arch) {
    throw InputError(file.path() + ": unsupported architecture '" + architecture +
                     "' (kvbench runs general.architecture " + architecture_names() + ")");
  }
  const std::string a = architecture + ".";
  c.name = file.get_string("general.name", file.path());
  // Each read as int64 and checked before narrowing: block_count = 2^32 + 2 must not load
  // as 2 layers. The limits are far beyond any real model.
  const auto count = [&](const std::string& key, int64_t lo, int64_t hi, int64_t fallback = -1) {
    const int64_t v = fallback < 0 ? file.get_int(a + key) : file.get_int(a + key, fallback);
    if (v < lo || v > hi) {
      throw InputError(file.path() + ": metadata '" + a + key + "' is " + std::to_string(v) +
                       " (expected " + std::to_string(lo) + ".." + std::to_string(hi) + ")");
    }
    return static_cast<int32_t>(v);
  };
  const auto positive = [&](const std::string& key, double fallback, double hi) {
    const double v = file.get_float(a + key, fallback);
    if (!(v > 0 && v <= hi)) {  // NaN fails too
      throw InputError(file.path() + ": metadata '" + a + key + "' is " + std::to_string(v) +
                       " (expected a number in (0, " + std::to_string(hi) + "])");
    }
    return v;
  };
  c.n_layers = count("block_count", 1, 4096);
  c.n_embd = count("embedding_length", 1, 1 << 18);
  c.n_ff = count("feed_forward_length", 1, 1 << 22);
  c.n_heads = count("attention.head_count", 1, 4096);
  c.n_kv_heads = count("attention.head_count_kv", 1, c.n_heads, c.n_heads);
  c.context_length = count("context_length", 1, 1 << 24);
  c.rms_eps = static_cast<float>(positive("attention.layer_norm_rms_epsilon", 1e-5, 1));
  c.rope_theta = static_cast<float>(positive("rope.freq_base", 10000.0, 1e12));
  if (c.n_heads % c.n_kv_heads != 0) {
    throw InputError(file.path() + ": head_count " + std::to_string(c.n_heads) +
                     " is not a multiple of head_count_kv " + std::to_string(c.n_kv_heads));
  }
  c.head_dim = count("attention.key_length", 2, 1024, std::max(1, c.n_embd / c.n_heads));
  const int64_t rope_dims = file.get_int(a + "rope.dimension_count", c.head_dim);
  if (c.head_dim % 2 != 0 || rope_dims != c.head_dim) {
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
    for (int32_t i = 0; i < c.head_dim / 2; ++i) {
      if (!(std::isfinite(divisors[i]) && divisors[i] > 0)) {
        throw InputError(file.path() + ": rope_freqs.weight[" + std::to_string(i) + "] is " +
                         std::to_string(divisors[i]) + " (expected a positive divisor)");
      }
      c.rope_inv_freq[i] /= divisors[i];
    }
  } else if (file.get_string(a + "rope.scaling.type", "none") == "linear") {
    const double factor = file.get_float(a + "rope.scaling.factor", 1.0);
    if (!(factor > 0 && std::isfinite(factor))) {
      throw InputError(file.path() + ": rope.scaling.factor must be positive");
    }
    for (float& f : c.rope_inv_freq) f = static_cast<float>(f / factor);
  }

  // Each factor may be in range and the product still not (a theta of 1e-40, a divisor of
  // 1e-40): the frequencies themselves must be usable.
  for (size_t i = 0; i < c.rope_inv_freq.size(); ++i) {
    if (!(std::isfinite(c.rope_inv_freq[i]) && c.rope_inv_freq[i] > 0)) {
      throw InputError(file.path() + ": RoPE frequency " + std::to_string(i) + " is " +
                       std::to_string(c.rope_inv_freq[i]) +
                       " (rope.freq_base, rope_freqs.weight or rope.scaling.factor out of range)");
    }
  }

  const GgufTensorInfo& embd = file.tensor("token_embd.weight");
  c.vocab_size = count("vocab_size", 1, 1 << 24, embd.shape.size() == 2 ? embd.shape[1] : 0);
  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  c.qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace kvbench
