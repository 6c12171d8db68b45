// The session driver: runs one shared-context sample through one cache method, the way
// SCBench does, and measures every turn.
//   multi-turn:   the context is prefilled once and compressed; each turn appends its
//                 query, decodes an answer, then appends the gold answer (default) or the
//                 model's own; the cache persists and grows across turns.
//   multi-request: each query is a new request on a fresh cache: the context is prefilled
//                 again, or, with a reuse method (prefix), its cached blocks are loaded and
//                 only the rest is prefilled; the cache is discarded after the query.
// Fidelity compares each turn with the full cache on the same turn.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/registry.h"
#include "datasets/sample.h"
#include "harness/session_mode.h"
#include "reuse/prefix_cache.h"

namespace kvbench {

class LlamaModel;
class SharedPrefill;

struct SessionOptions {
  SessionMode mode = SessionMode::MultiTurn;
  AnswerSource append = AnswerSource::Gold;
  int32_t max_new_tokens = 64;
  int32_t max_turns = 0;  // 0: every turn of the sample
  // Aware: the context's compression runs after the first turn's query (multi-request:
  // after each request's query, every request being the first of its conversation).
  QuerySetting query = QuerySetting::Agnostic;
  // Multi-request: simulated seconds between one request and the next. The session's clock
  // (never real time, nothing sleeps) advances by it; TTLs in the reuse tiers (apc_ttl,
  // tiers policy=ttl) read that clock. 0: back to back.
  double turn_gap_s = 0;
};

// What the full cache predicts on each turn: the reference fidelity is measured against.
struct TurnReference {
  std::vector<float> first_logprobs;  // [vocab] log-softmax of the first answer token
  // argmax at each position of the reference answer under teacher forcing: top1[0] from
  // the query's logits, top1[i] after reference token i - 1 (at least one entry, also for
  // an empty answer).
  std::vector<int32_t> top1;
};

struct SampleReference {
  std::string sample_id;
  std::vector<TurnReference> turns;
};

struct TurnRecord {
  int32_t turn = 0;
  std::string query;
  std::string prediction;  // the model's decoded answer
  std::string reference;   // the gold answer, gold_text(turn)
  std::string stop_reason;  // of the decoded answer: "end_of_turn", "max_new_tokens", "context_length"
  int64_t prompt_tokens = 0;  // tokens fed this turn before decoding (context + query, or query)
  int64_t output_tokens = 0;  // tokens of `prediction`
  int64_t appended_tokens = 0;  // fed to the turn's cache after the query: the appended answer
                                // and end-of-turn tail (multi-turn); the teacher-forced
                                // reference minus its last token (multi-request)
  double ttft_ms = 0;         // turn start (context prefill and compression in
                              // multi-request) -> first token chosen
  double tpot_ms = 0;         // mean time per output token after the first
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  int64_t kv_bytes = 0;       // resident after the turn
  int64_t kv_bytes_peak = 0;  // largest resident during the turn: the larger of the turn's
                              // cache and the clone the other answer ran on (never their sum)
  double tokens_kept = 0;     // mean tokens stored per layer after the turn
  int64_t kv_read_per_step = 0;  // KV bytes attention read per decode step of the answer
                                 // (Quest reads pages, KIVI packed blocks: less than held)
  // A retrieval reader's recall of the true top keys over the answer's decode steps (layers,
  // query heads), where it measures one (ReadPolicy::recall); else none.
  std::optional<double> retrieval_recall;
  // Attention FLOPs of the prefill counted in ttft_ms under a sparse prefill (a_shape,
  // tri_shape, minference), and a dense causal prefill's of the same rows; 0 otherwise.
  double attn_flops = 0;
  double attn_flops_dense = 0;
  // Fidelity, measured only with a reference (SessionResult::fidelity), else 0:
  double first_token_kl = 0;  // KL(full || method) of the first answer token's distribution
  double top1_agreement = 0;  // fraction of reference-answer positions with the same argmax
  CacheStats cache;           // after the turn (hits, misses, bytes_moved: this turn's reuse)
  ReuseTurn reuse;            // what prefix reuse did for this turn's request (zeros without it)
  std::vector<TierStats> reuse_tiers;  // the reuse tiers after the turn, top-down
  TurnReference own;          // this run's first-token logprobs and top-1 ids
};

struct SessionResult {
  std::string sample_id;
  // How the context went in: "dense", or "stream:N" (evicting after every N tokens).
  std::string prefill = "dense";
  bool shared_prefill = false;   // forked from the sample's one prefill (shared_prefill.h)
  int64_t prefilled_tokens = 0;  // context tokens this unit ran through the model itself
  std::string method;  // canonical spec
  SessionMode mode = SessionMode::MultiTurn;
  AnswerSource append = AnswerSource::Gold;
  int64_t context_tokens = 0;     // the shared context segment (system prompt, user header)
  double context_prefill_ms = 0;  // multi-turn: context prefill + compression, before turn 1
  bool fidelity = false;          // first_token_kl / top1_agreement were measured
  std::vector<TurnRecord> turns;
};

// Runs `sample` with the cache `method` builds (resolved once, by the caller's entry point).
// `reference` (from a run with the full cache in the same mode) fills the fidelity fields;
// without it they stay 0.
// Throws InputError for a method the session's mode cannot run, and naming the sample id
// when the context and turns cannot fit the model's context length (checked before anything
// runs).
//
// The chat layout (from the model's template, tokenized segment by segment so every
// method sees the same tokens): context segment = system prompt + user header + context +
// "\n\n"; query of turn 1 = query + end of user message + assistant header; later turns
// open a new user message; an appended answer ends with the end-of-turn tail.
// In a turn the model's answer is decoded greedily (TTFT: query in -> first token chosen;
// TPOT after it) and the reference answer is teacher-forced token by token; with
// AnswerSource::Gold the decoding runs on a clone and the reference goes on the cache,
// with AnswerSource::Model the other way round. Multi-request does the same on a fresh
// cache per turn, its context prefill counted in TTFT.
// With `shared` serving the method (SharedPrefill::serves), the context comes from that one
// prefill instead of one of its own, bit-identical; its time is the shared forward's share
// for this method (SharedPrefill::fork), so TTFT and context_prefill_ms mean the same.
SessionResult run_session(const LlamaModel& model, const Sample& sample,
                          const ResolvedSpec& method, const SessionOptions& options,
                          const SampleReference* reference,
                          const SharedPrefill* shared = nullptr);

// The shared context segment: what a sample's shared prefill holds and every unit forks, in
// both query settings (query-aware, each request's query is fed after the fork).
std::vector<int32_t> session_context_tokens(const LlamaModel& model, const Sample& sample,
                                            const SessionOptions& options);

// Throws the InputError run_session would (naming the sample) when the sample's context and
// turns cannot fit the model's context length in `options`' mode; checks every sample of a
// run before any runs.
void check_session_fits(const LlamaModel& model, const Sample& sample,
                        const SessionOptions& options);

// The reference of a run: its turns' `own` fields.
SampleReference reference_of(const SessionResult& result);

// Fills `result`'s fidelity fields from `reference` (e.g. a full-cache run that is its own
// reference: KL 0, agreement 1).
void apply_reference(SessionResult& result, const SampleReference& reference);

}  // namespace kvbench
