// Prompt in, reply out: prefill, then sample one token at a time, with the timings a
// cache-method comparison needs (TTFT, prefill and decode tokens/s, KV bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "methods/kv_cache.h"

namespace kvbench {

class LlamaModel;

struct GenerateOptions {
  int32_t max_new_tokens = 128;
  float temperature = 0.f;  // 0: greedy
  uint64_t seed = 0;        // sampling seed (temperature > 0)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, without the stop token
  std::string text;             // their decoded text
  std::string stop_reason;      // "end_of_turn", "max_new_tokens" or "context_length"
  int64_t prompt_tokens = 0;
  double ttft_ms = 0;           // prompt in -> first new token chosen
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;  // tokens after the first, per second of decoding
  CacheStats cache;             // after the last step
};

// Picks the next token: argmax when temperature <= 0, else a sample from
// softmax(logits / temperature) drawn with `rng_state` (advanced in place).
int32_t sample_token(const std::vector<float>& logits, float temperature, uint64_t& rng_state);

GenerateResult generate(const LlamaModel& model, KvCache& cache,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options);

}  // namespace kvbench
