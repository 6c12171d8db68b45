// CacheBlend (Yao et al., "CacheBlend: Fast LLM serving for RAG with cached knowledge
// fusion", EuroSys'25): reuse the KV of chunks (documents) that are not a prefix. Each
// chunk's KV is computed once, standalone from position 0; to place it at new positions its
// keys are re-rotated (RoPE is a rotation: rotating a key from p by d gives it at p + d),
// and the tokens whose KV deviates most from a fresh prefill are recomputed
// (LlamaModel::forward_blend), for the cross-chunk attention the standalone KV lacks.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/kv_cache.h"
#include "harness/model/llama_model.h"

namespace kvbench {

// One chunk's KV as a standalone prefill computed it.
struct CachedChunk {
  std::vector<int32_t> tokens;
  std::vector<float> k, v;  // [n_layers, n_tokens, n_kv_heads * head_dim], keys post-RoPE at
                            // positions 0..n_tokens-1
  int64_t bytes() const;    // what holding it costs: tokens, keys and values
};

// Prefills `tokens` alone (positions from 0, nothing before them) and keeps their KV.
// Throws InputError as LlamaModel::forward does.
CachedChunk prefill_chunk(const LlamaModel& model, const std::vector<int32_t>& tokens);

// Prefills `tokens` after `prefix` (the chat header every request also starts with, so the
// chunk's attention has the sink it will have in a request) and keeps only the tokens' KV,
// keys rotated back to positions from 0 as prefill_chunk's.
CachedChunk prefill_chunk_after(const LlamaModel& model, const std::vector<int32_t>& prefix,
                                const std::vector<int32_t>& tokens);

// Rotates keys [n_tokens, n_kv_heads, head_dim] of one layer, post-RoPE at positions p, in
// place to positions p + delta (delta may be negative).
void rerotate_keys(const ModelConfig& config, float* k, int64_t n_tokens, int32_t delta);

// What one blend did.
struct BlendStats {
  int64_t tokens = 0;      // tokens the chunks hold, all stored in the cache
  int64_t recomputed = 0;  // of them, recomputed past the selection layer
  double rotate_ms = 0;    // gathering the chunks' KV and re-rotating its keys
  double forward_ms = 0;   // LlamaModel::forward_blend (selection and recompute)
};

// Appends the chunks' KV, in order, at cache.next_position() onwards: keys re-rotated to
// their new positions, the `ratio` of tokens that deviate most at select_layer recomputed
// (selected over all chunks together; ratio 0: naive reuse, nothing recomputed; ratio 1:
// equal to a full prefill of the chunks' tokens). Tokens already in the cache (a chat
// header) are attended by the recomputed tokens. Throws InputError for no tokens, or as
// LlamaModel::forward_blend does.
BlendStats blend_chunks(const LlamaModel& model, const std::vector<const CachedChunk*>& chunks,
                        double ratio, KvCache& cache, int32_t select_layer = 1);

}  // namespace kvbench
