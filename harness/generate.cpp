#include "harness/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "common/elapsed.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/reconstruction.h"

namespace kvbench {

int32_t sample_token(const std::vector<float>& logits, float temperature, uint64_t& rng_state) {
  const auto best = std::max_element(logits.begin(), logits.end());
  if (temperature <= 0.f) return static_cast<int32_t>(best - logits.begin());
  std::vector<double> weights(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[i]) - *best) / temperature);
  }
  std::mt19937_64 rng(rng_state);
  std::discrete_distribution<int32_t> pick(weights.begin(), weights.end());
  const int32_t token = pick(rng);
  rng_state = rng();
  return token;
}

DecodeResult decode(const LlamaModel& model, KvCache& cache, std::vector<float> logits,
                    const GenerateOptions& options) {
  const Tokenizer& tokenizer = model.tokenizer();
  DecodeResult result;
  uint64_t rng_state = options.seed;
  const auto start = std::chrono::steady_clock::now();
  result.stop_reason = "max_new_tokens";
  while (true) {
    const int32_t token = sample_token(logits, options.temperature, rng_state);
    if (token == tokenizer.eos_id() || tokenizer.is_control(token)) {
      result.stop_reason = "end_of_turn";
      break;
    }
    result.tokens.push_back(token);
    if (static_cast<int32_t>(result.tokens.size()) >= options.max_new_tokens) break;
    if (cache.next_position() >= model.config().context_length) {
      result.stop_reason = "context_length";
      break;
    }
    logits = model.decode(token, cache);
    ++result.steps;
  }
  result.decode_s = seconds_since(start);
  result.tokens_fed = result.steps;
  if (result.steps > 0) {
    result.decode_tokens_per_s = result.steps / std::max(result.decode_s, 1e-9);
    result.tpot_ms = result.decode_s * 1e3 / result.steps;
  }
  result.text = tokenizer.decode(result.tokens);
  return result;
}

GenerateResult generate(const LlamaModel& model, KvCache& cache,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  // One allocation for the whole exchange, so bytes resident are what the tokens need.
  cache.reserve(std::min<int64_t>(
      cache.next_position() + result.prompt_tokens + options.max_new_tokens,
      model.config().context_length));

  const auto start = std::chrono::steady_clock::now();
  std::vector<float> logits = model.forward(prompt, cache);
  if (!cache.context_ended()) {
    // The whole prompt is the context here: KVzip repeats all of it ("\n" closes its
    // prompt, kvpress's choice without a chat template).
    score_by_reconstruction(model, cache, prompt, 0, "\n");
    cache.end_context();
  }
  const double prefill_s = seconds_since(start);
  // TTFT ends when the first token is chosen; decode() chooses the same one again from the
  // same seed (one pass over the logits).
  uint64_t rng_state = options.seed;
  sample_token(logits, options.temperature, rng_state);
  result.ttft_ms = seconds_since(start) * 1e3;
  DecodeResult d = decode(model, cache, std::move(logits), options);
  result.prefill_tokens_per_s = result.prompt_tokens / std::max(prefill_s, 1e-9);
  result.tokens = std::move(d.tokens);
  result.text = std::move(d.text);
  result.stop_reason = std::move(d.stop_reason);
  result.decode_tokens_per_s = d.decode_tokens_per_s;
  result.tpot_ms = d.tpot_ms;
  result.cache = cache.stats();
  return result;
}

}  // namespace kvbench
