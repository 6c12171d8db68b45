// Prompt in, reply out: prefill, then sample one token at a time, with the timings a
// cache-method comparison needs (TTFT, prefill and decode tokens/s, KV bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_cache.h"

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
  double tpot_ms = 0;              // mean time per token after the first
  CacheStats cache;             // after the last step
};

// Picks the next token: argmax when temperature <= 0, else a sample from
// softmax(logits / temperature) drawn with `rng_state` (advanced in place).
int32_t sample_token(const std::vector<float>& logits, float temperature, uint64_t& rng_state);

// What decode() produced and what it cost.
struct DecodeResult {
  std::vector<int32_t> tokens;  // generated ids, without the stop token
  std::string text;             // their decoded text
  std::string stop_reason;      // "end_of_turn", "max_new_tokens" or "context_length"
  // How many of `tokens` were fed to the cache: all of them after "end_of_turn" (the stop
  // token itself is not fed), all but the last otherwise (it was chosen, never fed).
  int64_t tokens_fed = 0;
  int32_t steps = 0;               // one-token forward passes (tokens after the first)
  double decode_s = 0;             // seconds of the whole loop
  double tpot_ms = 0;              // mean time per output token after the first
  double decode_tokens_per_s = 0;  // steps per second of decoding; 0 when steps == 0
};

// The sampling loop: picks a token from `logits` (those of the last token fed to `cache`),
// stops at the end-of-turn / a control token, else keeps it; stops at max_new_tokens or
// when the cache reaches the model's context length; else feeds it and repeats.
DecodeResult decode(const LlamaModel& model, KvCache& cache, std::vector<float> logits,
                    const GenerateOptions& options);

// forward(prompt), then end_context() unless the cache's context already ended (in a plain
// generate the prompt is the shared context), then decode().
GenerateResult generate(const LlamaModel& model, KvCache& cache,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options);

}  // namespace kvbench
