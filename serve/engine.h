// The serving engine behind `kvbench serve`: continuous batching of many requests, each
// with its own cache method, in one fixed KV memory pool.
//
// One thread (run()) owns the model and every cache. Each iteration it drops cancelled
// sequences, admits waiting ones while the pool can hold them (serve/kv_pool.h), runs one
// batched decode step for every sequence that is decoding (LlamaModel::decode_batch), then
// one prefill chunk of the oldest sequence still prefilling, so that a long prompt delays
// the others' next token by one chunk, not by its whole prefill. Requests come in from any
// thread (submit) and their text goes out through a SequenceChannel the caller reads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "serve/kv_pool.h"

namespace kvbench {

class LlamaModel;
class PrefixCache;

// One generation as the API layer hands it over: already tokenized and checked.
struct GenerationRequest {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;
  float temperature = 0.f;  // 0: greedy
  uint64_t seed = 0;
  std::vector<std::string> stop;  // strings that end the text (not included in it)
  bool ignore_eos = false;        // end-of-turn and control tokens never picked: max_tokens
  std::shared_ptr<const ResolvedSpec> method;
};

// Why a sequence ended, in the OpenAI API's words: "stop" (end of turn or a stop string),
// "length" (max_tokens or the context), "cancelled" (the client left or the server stopped).
struct SequenceEnd {
  std::string finish_reason;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens loaded by prefix reuse instead of prefilled
  double ttft_ms = 0;         // arrival -> first token chosen (queueing included)
  double queue_ms = 0;        // arrival -> admitted
  int64_t kv_bytes_peak = 0;  // the most its cache held
  // ignore_eos: bytes of the text before the first step whose most likely token ended the
  // turn (the answer as it would have ended, for scoring); -1: no step did
  int64_t eos_text_bytes = -1;
  std::string error;          // non-empty: it failed (a message for the client)
};

// The engine writes a sequence's text here as it is decided; the client's thread reads it.
class SequenceChannel {
 public:
  // New text since the last call, and the end once the sequence ended; waits up to
  // `timeout` for either. Returns false while the sequence runs and nothing new came.
  struct Update {
    std::string text;
    int64_t tokens = 0;  // generated so far (text may trail them: a character not yet whole)
    std::optional<SequenceEnd> end;
  };
  bool next(Update* update, std::chrono::milliseconds timeout);
  // Asks the engine to stop the sequence and free its cache (a client that left).
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // The engine's side: a token generated, then the text that is ready.
  void count_token() { ++tokens_; }
  void push(const std::string& text);
  void finish(SequenceEnd end);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string text_;
  std::optional<SequenceEnd> end_;
  bool end_taken_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> tokens_{0};
};

struct EngineOptions {
  int64_t pool_bytes = int64_t{1} << 30;
  int32_t max_seqs = 16;          // sequences running at once, whatever the pool holds
  int32_t max_waiting = 1024;     // queued beyond that: refused (503)
  int32_t prefill_chunk = 256;    // prompt tokens one iteration feeds
  // A store that packs by blocks (KIVI) packs each prompt chunk as it comes in, the later
  // chunks attending over the packed ones, as a serving engine's quantized cache does
  // (KvCache::settle_context_chunks); false: the prompt attends over itself at fp32 and is
  // packed at its end, as KIVI's code and the sweeps do, held whole at fp32 meanwhile.
  bool pack_prompt_chunks = true;
};

// What /metrics prints: counters since start and the state now.
struct EngineMetrics {
  int64_t running = 0;
  int64_t prefilling = 0;
  int64_t waiting = 0;
  int64_t pool_capacity = 0;
  int64_t pool_reserved = 0;   // reservations of the running sequences (and reuse's top tier)
  int64_t pool_resident = 0;   // bytes their stores hold now
  int64_t prefix_bytes = 0;    // reuse's top tier, counted in pool_reserved
  int64_t requests_finished = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_refused = 0;  // did not fit the pool even alone, or the queue was full
  int64_t prompt_tokens = 0;
  int64_t prefilled_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens loaded from reuse's tiers
  int64_t prefix_lookup_tokens = 0;
  int64_t decode_steps = 0;       // batched steps
  int64_t decode_rows = 0;        // sequences over all steps (rows / steps: the mean batch)
  int64_t most_running = 0;       // the most sequences ever running at once
  double busy_s = 0;              // seconds spent computing
  double uptime_s = 0;
  double tokens_per_s = 0;        // generated tokens per second over the last 10 s
};

class ServingEngine {
 public:
  // Prefix reuse is shared by every request whose method has the same prefix and tiers
  // components (one PrefixCache each), its top tier counted in the pool at its capacity.
  ServingEngine(const LlamaModel& model, EngineOptions options);
  ~ServingEngine();

  // Queues a request; its channel carries the text. Throws InputError (the client's fault:
  // a 400) when the request alone cannot fit the pool, and EngineBusy when the queue is full
  // or the engine is stopping (a 503).
  std::shared_ptr<SequenceChannel> submit(GenerationRequest request);
  struct EngineBusy : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  // The bytes a request reserves when it is admitted (KvPool::reservation of an empty cache).
  int64_t admission_bytes(const GenerationRequest& request);

  // The scheduling loop; returns after stop() once nothing runs or the grace period ended.
  void run();
  // Stops admitting; what runs finishes within `grace`, then is cancelled. Any thread.
  void stop(std::chrono::milliseconds grace);
  bool stopping() const { return stopping_; }
  bool finished() const { return finished_; }  // run() has returned

  EngineMetrics metrics() const;
  int64_t pool_capacity() const { return pool_.capacity(); }

 private:
  struct Sequence;
  void admit();
  void drop_cancelled();
  void decode_step();
  void prefill_step();
  void finish(Sequence& s, const std::string& reason, const std::string& error = "");
  bool emit_token(Sequence& s, int32_t token);  // false: the sequence ended
  int32_t pick_token(Sequence& s, const float* logits) const;
  // Whether `request`'s prompt chunks settle as they come in (pack_prompt_chunks, a store
  // that packs by blocks, no policy planning on the prompt's fp32 KV, no prefix reuse
  // loading whole blocks at once).
  bool packs_chunks(const GenerationRequest& request, const StoreCost& cost) const;
  // Fills s.cost, s.packs_chunks and s.need (admission_bytes) the first time it is called.
  void price(Sequence& s);
  void update_reservation(Sequence& s);
  int64_t reserved_bytes() const;
  PrefixCache* prefix_cache_for(const ResolvedSpec& spec);

  const LlamaModel& model_;
  EngineOptions options_;
  KvPool pool_;
  mutable std::mutex mutex_;  // inbox_, stopping_, metrics_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::deque<std::unique_ptr<Sequence>> waiting_;   // the engine thread's own from here on
  std::vector<std::unique_ptr<Sequence>> running_;
  std::map<std::string, std::unique_ptr<PrefixCache>> prefix_caches_;  // by reuse config
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finished_{false};
  std::chrono::steady_clock::time_point stop_deadline_;
  std::chrono::steady_clock::time_point started_;
  EngineMetrics metrics_;
  std::deque<std::pair<double, int64_t>> recent_tokens_;  // (seconds since start, tokens)
  int64_t next_id_ = 0;
  std::vector<int32_t> end_tokens_;  // end of sequence and control tokens, ascending
                                     // (ignore_eos masks them)
};

}  // namespace kvbench
