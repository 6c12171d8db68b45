// What the prefix-reuse tests share: a tiny random-weight model whose head_dim (32) suits
// every store (KIVI packs channels in groups of 32), prompts of known tokens, and one
// request through a PrefixCache as the session makes it (load, prefill the rest while
// capturing, store).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "harness/model/llama_model.h"
#include "harness/session.h"
#include "reuse/prefix_cache.h"

namespace kvbench::testing {

inline const LlamaModel& prefix_test_model() {
  static const std::unique_ptr<LlamaModel> model = [] {
    TinyLlamaSpec spec;
    spec.context_length = 1024;
    spec.n_embd = 128;  // 4 heads of 32
    spec.n_ff = 256;
    const std::string path = temp_path("tiny_prefix.gguf");
    write_tiny_llama_gguf(path, spec);
    return LlamaModel::load(path);
  }();
  return *model;
}

inline std::vector<int32_t> prompt_tokens(int64_t n, int32_t salt = 0) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(3 + (i * 7 + salt) % 250);
  return tokens;
}

inline float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// One request on `cache` (empty): returns the last token's logits.
inline std::vector<float> request(PrefixCache& reuse, KvCache& cache,
                                  const std::vector<int32_t>& prompt, ReuseTurn& turn) {
  cache.reserve(static_cast<int64_t>(prompt.size()));
  const int64_t loaded = reuse.load(prompt, cache, turn);
  reuse.start_capture(cache, prompt, loaded);
  std::vector<float> logits = prefix_test_model().forward(
      std::vector<int32_t>(prompt.begin() + loaded, prompt.end()), cache);
  reuse.store(cache, turn);
  return logits;
}

// A sample of three questions over one context of `filler` characters and a few keys, and
// the options of a multi-request run over it: what the session reuse tests drive.
inline Sample shared_context_sample(const std::string& id, size_t filler, char fill = 'a') {
  Sample sample;
  sample.id = id;
  sample.context = std::string(filler, fill) + " keys: abc = 12, def = 34, ghi = 56.";
  for (const char* q : {"what is abc?", "and def?", "what about ghi?"}) {
    SampleTurn turn;
    turn.input = q;
    turn.answers = {"12"};
    sample.turns.push_back(turn);
  }
  return sample;
}

inline SessionOptions multi_request_options() {
  SessionOptions options;
  options.mode = SessionMode::MultiRequest;
  options.max_new_tokens = 4;
  return options;
}

}  // namespace kvbench::testing
