// The session driver: runs one shared-context sample through one cache method, the way
// SCBench does, and measures every turn.
//   multi-turn:   the context is prefilled once and compressed; each turn appends its
//                 query, decodes an answer, then appends the gold answer (default) or the
//                 model's own; the cache persists and grows across turns.
//   multi-request: each query is answered from a fresh prefill of the context (the reuse
//                 issue will load it instead); everything is discarded after the query.
// Fidelity compares each turn with the full cache on the same turn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "datasets/sample.h"
#include "methods/kv_cache.h"

namespace kvbench {

class LlamaModel;

enum class SessionMode { MultiTurn, MultiRequest };
enum class AnswerSource { Gold, Model };  // what a multi-turn turn appends after decoding

const char* to_string(SessionMode mode);   // "multi-turn", "multi-request"
SessionMode parse_session_mode(const std::string& text);  // InputError on anything else

struct SessionOptions {
  SessionMode mode = SessionMode::MultiTurn;
  AnswerSource append = AnswerSource::Gold;
  int32_t max_new_tokens = 64;
  int32_t max_turns = 0;  // 0: every turn of the sample
};

// What the full cache predicts on each turn: the reference fidelity is measured against.
struct TurnReference {
  std::vector<float> first_logprobs;  // [vocab] log-softmax of the first answer token
  std::vector<int32_t> top1;          // argmax at each position of the reference answer
};

struct SampleReference {
  std::string sample_id;
  std::vector<TurnReference> turns;
};

struct TurnRecord {
  int32_t turn = 0;
  std::string query;
  std::string prediction;  // the model's decoded answer
  std::string reference;   // answers[0]
  int64_t prompt_tokens = 0;  // tokens fed this turn before decoding (context + query, or query)
  int64_t output_tokens = 0;
  double ttft_ms = 0;         // turn start (context prefill in multi-request) -> first token
  double tpot_ms = 0;         // mean time per output token after the first
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  int64_t kv_bytes = 0;       // resident after the turn
  int64_t kv_bytes_peak = 0;  // largest resident during the turn
  double tokens_kept = 0;     // mean tokens stored per layer after the turn
  double first_token_kl = 0;  // KL(full || method) of the first answer token's distribution
  double top1_agreement = 0;  // fraction of reference-answer positions with the same argmax
  CacheStats cache;           // after the turn
  TurnReference own;          // this run's first-token logprobs and top-1 ids
};

struct SessionResult {
  std::string sample_id;
  std::string method;  // canonical spec
  SessionMode mode = SessionMode::MultiTurn;
  int64_t context_tokens = 0;
  std::vector<TurnRecord> turns;
};

// Runs `sample` with the cache `method_spec` builds. `reference` (from a run with the full
// cache in the same mode) fills the fidelity fields; without it they stay 0.
SessionResult run_session(const LlamaModel& model, const Sample& sample,
                          const std::string& method_spec, const SessionOptions& options,
                          const SampleReference* reference);

// The reference of a run: its turns' `own` fields.
SampleReference reference_of(const SessionResult& result);

}  // namespace kvbench
