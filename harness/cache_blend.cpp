#include "harness/cache_blend.h"

#include <algorithm>
#include <chrono>

#include "cache/full_cache.h"
#include "common/elapsed.h"
#include "common/input_error.h"
#include "kernels/cpu/layer_ops.h"

namespace kvbench {

int64_t CachedChunk::bytes() const {
  return static_cast<int64_t>(tokens.size() * sizeof(int32_t) +
                              (k.size() + v.size()) * sizeof(float));
}

CachedChunk prefill_chunk(const LlamaModel& model, const std::vector<int32_t>& tokens) {
  const KvShape shape = model.kv_shape();
  KvCache cache = make_full_cache(shape);
  model.forward(tokens, cache);

  // The store keeps each KV head's rows apart ([n_kv_heads, capacity, head_dim]); a chunk
  // keeps each token's heads together, the layout the model's projections produce.
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t head_dim = shape.head_dim;
  const int64_t kv_width = shape.n_kv_heads * head_dim;
  CachedChunk chunk;
  chunk.tokens = tokens;
  chunk.k.resize(shape.n_layers * n * kv_width);
  chunk.v.resize(chunk.k.size());
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    const DenseKv kv = cache.layer(l).view();
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        const int64_t from = (h * kv.capacity + t) * head_dim;
        const int64_t to = (l * n + t) * kv_width + h * head_dim;
        std::copy_n(kv.k + from, head_dim, chunk.k.data() + to);
        std::copy_n(kv.v + from, head_dim, chunk.v.data() + to);
      }
    }
  }
  return chunk;
}

CachedChunk prefill_chunk_after(const LlamaModel& model, const std::vector<int32_t>& prefix,
                                const std::vector<int32_t>& tokens) {
  if (prefix.empty()) return prefill_chunk(model, tokens);
  std::vector<int32_t> both = prefix;
  both.insert(both.end(), tokens.begin(), tokens.end());
  const CachedChunk whole = prefill_chunk(model, both);
  const ModelConfig& config = model.config();
  const int64_t kv_width = static_cast<int64_t>(config.n_kv_heads) * config.head_dim;
  const int64_t skip = static_cast<int64_t>(prefix.size());
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t total = skip + n;
  CachedChunk chunk;
  chunk.tokens = tokens;
  chunk.k.resize(config.n_layers * n * kv_width);
  chunk.v.resize(chunk.k.size());
  for (int32_t l = 0; l < config.n_layers; ++l) {
    const int64_t from = (l * total + skip) * kv_width, to = l * n * kv_width;
    std::copy_n(whole.k.data() + from, n * kv_width, chunk.k.data() + to);
    std::copy_n(whole.v.data() + from, n * kv_width, chunk.v.data() + to);
    rerotate_keys(config, chunk.k.data() + to, n, -static_cast<int32_t>(skip));
  }
  return chunk;
}

void rerotate_keys(const ModelConfig& config, float* k, int64_t n_tokens, int32_t delta) {
  // Every row turns by the same angle, so the rows are handed to the RoPE kernel as the
  // heads of a single token at position delta: its sin/cos table is computed once.
  rope_interleaved_cpu(k, &delta, 1, static_cast<int32_t>(n_tokens * config.n_kv_heads),
                       config.head_dim, config.rope_inv_freq.data());
}

BlendStats blend_chunks(const LlamaModel& model, const std::vector<const CachedChunk*>& chunks,
                        double ratio, KvCache& cache, int32_t select_layer) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& config = model.config();
  const int64_t kv_width = static_cast<int64_t>(config.n_kv_heads) * config.head_dim;
  BlendStats stats;
  std::vector<int32_t> tokens;
  for (const CachedChunk* chunk : chunks) {
    tokens.insert(tokens.end(), chunk->tokens.begin(), chunk->tokens.end());
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw InputError("blend_chunks: the chunks hold no tokens");

  // The chunks side by side, layer by layer: forward_blend's [n_layers, n, kv_width].
  std::vector<float> k(config.n_layers * n * kv_width), v(k.size());
  for (int32_t l = 0; l < config.n_layers; ++l) {
    int64_t offset = 0;
    for (const CachedChunk* chunk : chunks) {
      const int64_t len = static_cast<int64_t>(chunk->tokens.size());
      const int64_t from = l * len * kv_width, to = (l * n + offset) * kv_width;
      std::copy_n(chunk->k.data() + from, len * kv_width, k.data() + to);
      std::copy_n(chunk->v.data() + from, len * kv_width, v.data() + to);
      // Computed at 0..len-1, placed at next_position + offset onwards.
      rerotate_keys(config, k.data() + to, len,
                    static_cast<int32_t>(cache.next_position() + offset));
      offset += len;
    }
  }
  stats.tokens = n;
  stats.rotate_ms = ms_since(start);

  const auto forward_start = std::chrono::steady_clock::now();
  stats.recomputed = model.forward_blend(tokens, k.data(), v.data(), ratio, select_layer, cache);
  stats.forward_ms = ms_since(forward_start);
  return stats;
}

}  // namespace kvbench
