#include "harness/model_cache.h"
#include "harness/session.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>

#include "cache/registry.h"
#include "common/elapsed.h"
#include "common/input_error.h"
#include "harness/cache_blend.h"
#include "harness/fidelity.h"
#include "harness/generate.h"
#include "harness/model/chat_template.h"
#include "harness/model/gguf.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/reconstruction.h"
#include "harness/shared_prefill.h"
#include "reuse/block_key.h"
#include "reuse/context_snapshots.h"

namespace kvbench {

namespace {

using Clock = std::chrono::steady_clock;

// The pieces of the chat template a session is cut into, taken from render_chat with
// marker contents so that any template (ChatML, Llama-3) lays out the same way:
//   context segment  = head + context + "\n\n"
//   turn 1 query     = query + query_tail
//   turn k > 1 query = user_head + query + query_tail
//   after an answer  = answer_tail (the end-of-turn token and what follows it)
struct ChatLayout {
  std::string head;         // system prompt + user header
  std::string query_tail;   // end of the user message + assistant header
  std::string answer_tail;  // end of the assistant message
  std::string user_head;    // header of the next user message
};

ChatLayout chat_layout(const LlamaModel& model) {
  const std::string jinja = model.file().get_string("tokenizer.chat_template", "");
  const ChatFormat format = detect_chat_format(jinja);
  const std::string system = default_system_prompt(jinja);
  const std::string q = "\x01KVBQ\x01", a = "\x01KVBA\x01", r = "\x01KVBR\x01";
  const std::string one = render_chat(format, {{"user", q}}, true, system);
  const std::string two =
      render_chat(format, {{"user", q}, {"assistant", a}, {"user", r}}, true, system);
  ChatLayout layout;
  const size_t q_at = one.find(q);
  layout.head = one.substr(0, q_at);
  layout.query_tail = one.substr(q_at + q.size());
  const size_t a_end = two.find(a) + a.size();
  const std::string between = two.substr(a_end, two.find(r) - a_end);
  const std::string eot = end_of_turn_token(format);
  size_t cut = between.find(eot);
  cut = cut == std::string::npos ? 0 : cut + eot.size();
  while (cut < between.size() && between[cut] == '\n') ++cut;
  layout.answer_tail = between.substr(0, cut);
  layout.user_head = between.substr(cut);
  return layout;
}

// Tokens of one segment. Only the first segment of a sequence may start with BOS.
std::vector<int32_t> encode_segment(const Tokenizer& tokenizer, const std::string& text,
                                    bool first) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  const bool adds_bos = !tokenizer.encode("").empty();  // the vocab's add_bos
  if (!first && adds_bos && !ids.empty() && ids.front() == tokenizer.bos_id() &&
      text.rfind(tokenizer.token_text(tokenizer.bos_id()), 0) != 0) {
    ids.erase(ids.begin());
  }
  return ids;
}

struct TurnTokens {
  std::vector<int32_t> query;   // query segment (with the template's pieces)
  std::vector<int32_t> answer;  // the gold answer, gold_text(turn)
};

struct SessionTokens {
  std::vector<int32_t> context;
  // A sample of documents: the context is the chat head, then each document (with its
  // "\n\n") tokenized on its own, so each is a chunk CacheBlend can hold; document i is
  // context[document_ends[i - 1] (head_tokens for i = 0), document_ends[i]).
  int64_t head_tokens = 0;
  std::vector<int64_t> document_ends;
  std::vector<TurnTokens> turns;
  std::vector<int32_t> answer_tail;
};

SessionTokens tokenize_sample(const LlamaModel& model, const Sample& sample,
                              const SessionOptions& options) {
  const Tokenizer& tok = model.tokenizer();
  const ChatLayout layout = chat_layout(model);
  SessionTokens out;
  if (sample.documents.empty()) {
    out.context = encode_segment(tok, layout.head + sample.context + "\n\n", true);
  } else {
    out.context = encode_segment(tok, layout.head, true);
    out.head_tokens = static_cast<int64_t>(out.context.size());
    for (const std::string& document : sample.documents) {
      const std::vector<int32_t> ids = encode_segment(tok, document + "\n\n", false);
      out.context.insert(out.context.end(), ids.begin(), ids.end());
      out.document_ends.push_back(static_cast<int64_t>(out.context.size()));
    }
  }
  out.answer_tail = encode_segment(tok, layout.answer_tail, false);
  size_t n_turns = sample.turns.size();
  if (options.max_turns > 0) n_turns = std::min<size_t>(n_turns, options.max_turns);
  for (size_t t = 0; t < n_turns; ++t) {
    const SampleTurn& turn = sample.turns[t];
    TurnTokens tt;
    // Multi-request answers each query as the first one of a conversation.
    const bool first = t == 0 || options.mode == SessionMode::MultiRequest;
    tt.query = encode_segment(tok, (first ? "" : layout.user_head) + turn.input + layout.query_tail,
                              false);
    const std::string& gold = gold_text(turn);
    if (!gold.empty()) tt.answer = encode_segment(tok, gold, false);
    out.turns.push_back(std::move(tt));
  }
  return out;
}

// InputError naming the sample when the conversation cannot fit the model's context.
void check_fits(const LlamaModel& model, const Sample& sample, const SessionTokens& tokens,
                const SessionOptions& options) {
  const int64_t limit = model.config().context_length;
  if (options.max_new_tokens > limit) {
    throw InputError("max_new " + std::to_string(options.max_new_tokens) +
                     " is more tokens than the model's context of " + std::to_string(limit) +
                     " could hold");
  }
  const int64_t context = static_cast<int64_t>(tokens.context.size());
  const int64_t tail = static_cast<int64_t>(tokens.answer_tail.size());
  int64_t need = context;
  for (const TurnTokens& t : tokens.turns) {
    const int64_t q = static_cast<int64_t>(t.query.size());
    const int64_t a = static_cast<int64_t>(t.answer.size());
    if (options.mode == SessionMode::MultiRequest) {
      need = std::max(need, context + q + a);
    } else {
      const int64_t appended =
          options.append == AnswerSource::Gold ? a : std::max<int64_t>(a, options.max_new_tokens);
      need += q + appended + tail;
    }
  }
  if (need > limit) {
    throw InputError("sample '" + sample.id + "': its context (" + std::to_string(context) +
                     " tokens) and " + std::to_string(tokens.turns.size()) + " turns need " +
                     std::to_string(need) + " tokens in " + to_string(options.mode) +
                     " mode, more than the model's context of " + std::to_string(limit) +
                     " tokens");
  }
}

// KVzip's reconstruction forwards (harness/reconstruction.h), run before the context's end
// when the method scores that way: the spans start after the chat head, and the template's
// query tail closes the prompt, as the authors take both from the chat template. A cache
// forked from `shared` with dense stores takes the scores another budget's fork computed over
// the same span where there are some (SharedPrefill::adopt_reconstruction), adding what they
// took to *elsewhere_ms, and otherwise keeps its own there for the next.
void reconstruct_context(const LlamaModel& model, KvCache& cache,
                         const std::vector<int32_t>& context,
                         const SharedPrefill* shared = nullptr, double* elsewhere_ms = nullptr) {
  if (!cache.policy() || !cache.policy()->scores_by_reconstruction()) return;
  double kept_ms = 0;
  if (shared && shared->adopt_reconstruction(context, cache, &kept_ms)) {
    *elsewhere_ms += kept_ms;
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const ChatLayout layout = chat_layout(model);
  const std::vector<int32_t> head = encode_segment(model.tokenizer(), layout.head, true);
  const bool has_head =
      head.size() <= context.size() && std::equal(head.begin(), head.end(), context.begin());
  score_by_reconstruction(model, cache, context,
                          has_head ? static_cast<int64_t>(head.size()) : 0, layout.query_tail);
  if (shared) shared->keep_reconstruction(context, cache, seconds_since(start) * 1e3);
}

// The shared prefill when a fork of `spec` may share KVzip's reconstruction: its stores are
// the dense ones the shared forward's copies hold (a storage method's may read otherwise).
const SharedPrefill* reconstruction_share(const ResolvedSpec& spec, const SharedPrefill* shared) {
  return spec.find(MethodKind::Storage) ? nullptr : shared;
}

// Shows the cache's policy the context's tokens as text (TokenPolicy::context_text), for a
// policy that cuts the context into segments (ShotKV). A cache without a policy is skipped.
void show_context_text(const Tokenizer& tokenizer, KvCache& cache,
                       const std::vector<int32_t>& context) {
  if (!cache.policy()) return;
  std::vector<std::string> texts;
  texts.reserve(context.size());
  for (int32_t id : context) texts.push_back(tokenizer.token_text(id));
  cache.show_context_text(texts);
}

// The shared context: in chunks of the policy's context_block() under a streamed prefill
// (a store never larger than what is kept plus one chunk), else in one forward (the model
// chunks it, but nothing is planned before the end), or through the policy's token-selective
// propagation (FastKV: LlamaModel::forward_propagating). Then end_context(): the policy
// compresses.
// Returns the logits of the context's last token (query-aware: the first query's).
std::vector<float> feed_context(const LlamaModel& model, KvCache& cache,
                                const std::vector<int32_t>& context) {
  std::vector<float> logits;
  const int64_t n = static_cast<int64_t>(context.size());
  const int64_t block = cache.policy() ? cache.policy()->context_block() : 0;
  const TokenPolicy* policy = cache.policy();
  const int32_t tsp_layer = policy ? policy->propagation_layer() : -1;
  if (tsp_layer >= 0) {  // FastKV: only the tokens the policy selects go past tsp_layer
    // (the model sizes each layer's store for the tokens it will hold)
    logits = model.forward_propagating(context, tsp_layer, [&](int32_t layer) {
      return policy->propagated_rows(layer, cache.layer(layer).view());
    }, cache);
  } else if (block <= 0 || block >= n) {
    cache.reserve_more(n);
    logits = model.forward(context, cache);
  } else {
    for (int64_t start = 0; start < n; start += block) {
      const int64_t len = std::min(block, n - start);
      cache.reserve_more(len);
      logits = model.forward(
          std::vector<int32_t>(context.begin() + start, context.begin() + start + len), cache);
    }
  }
  show_context_text(model.tokenizer(), cache, context);
  reconstruct_context(model, cache, context);
  cache.end_context();
  return logits;
}

// The sample's context forked from its shared prefill, its end not marked, when that serves
// `spec`; nothing otherwise. Adds to *elsewhere_ms the shared forward's share for this method
// (the caller times the call itself) and marks the result as forked.
std::optional<KvCache> fork_context(const ResolvedSpec& spec, const SharedPrefill* shared,
                                    SessionResult& result, double* elsewhere_ms) {
  if (!shared || !shared->serves(spec.canonical)) return std::nullopt;
  double shared_ms = 0;
  std::optional<KvCache> cache(shared->fork(spec.canonical, &shared_ms));
  *elsewhere_ms += shared_ms;
  result.shared_prefill = true;
  return cache;
}

// A fresh cache for `spec` holding the compressed context: forked from the sample's shared
// prefill when it serves the method (fork_context), else prefilled here, which fills the
// result's prefill fields. `logits` (when given, a prefill of its own only) gets the
// context's last token's.
KvCache context_cache(const LlamaModel& model, const ResolvedSpec& spec,
                      const std::vector<int32_t>& context, const SharedPrefill* shared,
                      SessionResult& result, double* elsewhere_ms,
                      std::vector<float>* logits = nullptr) {
  if (std::optional<KvCache> forked = fork_context(spec, shared, result, elsewhere_ms)) {
    show_context_text(model.tokenizer(), *forked, context);
    reconstruct_context(model, *forked, context, reconstruction_share(spec, shared), elsewhere_ms);
    forked->end_context();
    return std::move(*forked);
  }
  KvCache cache = new_cache(model, spec);
  std::vector<float> last = feed_context(model, cache, context);
  if (logits) *logits = std::move(last);
  result.prefilled_tokens += static_cast<int64_t>(context.size());
  return cache;
}

// The span compressed before turn 1 (or request t): the context, and query-aware its query.
std::vector<int32_t> compressed_span(const SessionTokens& tokens, const SessionOptions& options,
                                     size_t turn) {
  std::vector<int32_t> span = tokens.context;
  if (options.query == QuerySetting::Aware && turn < tokens.turns.size()) {
    span.insert(span.end(), tokens.turns[turn].query.begin(), tokens.turns[turn].query.end());
  }
  return span;
}

// Query-aware: the context and request t's query (the first turn's, multi-turn), compressed
// after both; *logits are the query's. A method whose prefill is dense takes them as two
// forwards, as an engine that found the context cached would, so that its context comes from
// the sample's shared prefill where there is one, for every request: the same KV and
// observations, bit for bit, as the context forward of its own. Other methods prefill the
// span as one context.
KvCache aware_cache(const LlamaModel& model, const ResolvedSpec& spec, const SessionTokens& tokens,
                    const SessionOptions& options, size_t t, const SharedPrefill* shared,
                    SessionResult& result, double* elsewhere_ms, std::vector<float>* logits) {
  const std::vector<int32_t> span = compressed_span(tokens, options, t);
  if (!SharedPrefill::can_share(spec, model)) {
    return context_cache(model, spec, span, nullptr, result, elsewhere_ms, logits);
  }
  const std::vector<int32_t>& query = tokens.turns[t].query;
  std::optional<KvCache> cache = fork_context(spec, shared, result, elsewhere_ms);
  const SharedPrefill* share = cache ? reconstruction_share(spec, shared) : nullptr;
  if (!cache) {
    cache.emplace(new_cache(model, spec));
    cache->reserve_more(static_cast<int64_t>(tokens.context.size()));
    model.forward(tokens.context, *cache);
    result.prefilled_tokens += static_cast<int64_t>(tokens.context.size());
  }
  cache->reserve_more(static_cast<int64_t>(query.size()));
  *logits = model.forward(query, *cache);
  show_context_text(model.tokenizer(), *cache, span);
  reconstruct_context(model, *cache, span, share, elsewhere_ms);
  cache->end_context();
  return std::move(*cache);
}

// Teacher forcing on the reference answer, one decode step per token as in decoding (so
// decode-time evictors evict per token, and Quest reads the pages it selects). top1[0] is the argmax of the query's logits,
// top1[i] the argmax after answer[i - 1]. With feed_all the last answer token and `tail`
// are fed too (what a multi-turn conversation keeps); without, only what top1 needs.
std::vector<int32_t> teacher_force(const LlamaModel& model, KvCache& cache,
                                   const std::vector<float>& query_logits,
                                   const std::vector<int32_t>& answer,
                                   const std::vector<int32_t>& tail, bool feed_all) {
  std::vector<int32_t> top1 = {argmax(query_logits)};
  for (size_t i = 0; i < answer.size(); ++i) {
    if (i + 1 < answer.size()) {
      top1.push_back(argmax(model.decode(answer[i], cache)));
    } else if (feed_all) {
      model.decode(answer[i], cache);
    }
  }
  if (feed_all && !tail.empty()) model.forward(tail, cache);
  return top1;
}

// Tokens held per layer and KV head, the mean over both (heads of their own counted exactly).
double mean_tokens(const CacheStats& stats) {
  const std::vector<int64_t>& counts =
      stats.tokens_per_head.empty() ? stats.tokens_per_layer : stats.tokens_per_head;
  if (counts.empty()) return 0;
  double total = 0;
  for (int64_t n : counts) total += static_cast<double>(n);
  return total / static_cast<double>(counts.size());
}

void fill_fidelity(TurnRecord& record, const TurnReference& reference) {
  record.first_token_kl = kl_divergence(reference.first_logprobs, record.own.first_logprobs);
  record.top1_agreement = top1_agreement(reference.top1, record.own.top1);
}

// One turn after its query was fed: `logits` are the query's. Decodes the model's answer
// and teacher-forces the reference, one of them on a clone (per `decode_on_clone`).
// keep_answer: the main cache goes on to the next turn (multi-turn), so the answer the
// options name (gold or the model's) and the end-of-turn tail are appended to it.
void answer_turn(const LlamaModel& model, KvCache& cache, const std::vector<float>& logits,
                 const TurnTokens& turn, const std::vector<int32_t>& tail,
                 const SessionOptions& options, bool keep_answer, TurnRecord& record) {
  GenerateOptions decode_options;
  decode_options.max_new_tokens = options.max_new_tokens;
  decode_options.temperature = 0.f;
  int64_t branch_peak = 0;
  DecodeResult d;
  // Bytes read by the decode steps, on whichever cache decodes.
  const auto decode_reading = [&](KvCache& on) {
    const int64_t read_before = on.stats().bytes_read_total;
    const ReadPolicy::Recall recall_before =
        on.reader() ? on.reader()->recall() : ReadPolicy::Recall{};
    d = decode(model, on, logits, decode_options);
    if (d.tokens_fed > 0) {
      record.kv_read_per_step = (on.stats().bytes_read_total - read_before) / d.tokens_fed;
    }
    if (on.reader()) {
      const ReadPolicy::Recall recall = on.reader()->recall();
      if (recall.count > recall_before.count) {
        record.retrieval_recall = (recall.sum - recall_before.sum) /
                                  static_cast<double>(recall.count - recall_before.count);
      }
    }
  };
  const int64_t before = cache.next_position();
  if (!keep_answer || options.append == AnswerSource::Gold) {
    {
      KvCache branch = cache.clone();
      // Room for the answer up to the context's end, never past it (decode stops there).
      branch.reserve_more(std::min<int64_t>(
          options.max_new_tokens, model.config().context_length - branch.next_position()));
      decode_reading(branch);
      branch_peak = branch.stats().bytes_peak;
    }
    record.own.top1 = teacher_force(model, cache, logits, turn.answer, tail, keep_answer);
  } else {
    {
      KvCache branch = cache.clone();
      branch.reserve_more(static_cast<int64_t>(turn.answer.size()));
      record.own.top1 = teacher_force(model, branch, logits, turn.answer, tail, false);
      branch_peak = branch.stats().bytes_peak;
    }
    decode_reading(cache);
    // The token decode chose last was never fed (max_new_tokens): it goes in with the tail.
    std::vector<int32_t> rest(d.tokens.begin() + d.tokens_fed, d.tokens.end());
    rest.insert(rest.end(), tail.begin(), tail.end());
    if (!rest.empty()) model.forward(rest, cache);
  }
  record.appended_tokens = cache.next_position() - before;
  record.prediction = d.text;
  record.stop_reason = d.stop_reason;
  record.output_tokens = static_cast<int64_t>(d.tokens.size());
  record.tpot_ms = d.tpot_ms;
  record.decode_tokens_per_s = d.decode_tokens_per_s;
  record.cache = cache.stats();
  record.kv_bytes = record.cache.bytes_resident;
  record.kv_bytes_peak = std::max(record.cache.bytes_peak, branch_peak);
  record.tokens_kept = mean_tokens(record.cache);
}

// CacheBlend's documents, each prefilled alone once per session (as a RAG server caches its
// corpus ahead of requests: not part of any request's TTFT).
struct BlendDocuments {
  double ratio = 0;
  int32_t select_layer = 1;
  std::vector<CachedChunk> chunks;
  double prefill_ms = 0;
  int64_t bytes = 0;
};

std::unique_ptr<BlendDocuments> blend_documents(const LlamaModel& model, const ResolvedSpec& spec,
                                                const Sample& sample, const SessionTokens& tokens) {
  const MethodParams* params = nullptr;
  for (const auto& [info, p] : spec.components) {
    if (info->name == "cacheblend") params = &p;
  }
  if (!params) return nullptr;
  if (tokens.document_ends.empty()) {
    throw InputError("sample '" + sample.id + "': cacheblend needs a context of documents (a "
                     "sample with \"documents\", e.g. task docs_kv)");
  }
  auto blend = std::make_unique<BlendDocuments>();
  blend->ratio = params->get_float("ratio");
  blend->select_layer = static_cast<int32_t>(params->get_int("select_layer"));
  if (blend->select_layer >= model.config().n_layers) {
    throw InputError("cacheblend select_layer=" + std::to_string(blend->select_layer) +
                     ": the model has " + std::to_string(model.config().n_layers) + " layers");
  }
  const auto start = Clock::now();
  int64_t begin = tokens.head_tokens;
  const std::vector<int32_t> head(tokens.context.begin(), tokens.context.begin() + tokens.head_tokens);
  const bool after_head = params->get("chunks") == "after_head";
  for (int64_t end : tokens.document_ends) {
    const std::vector<int32_t> document(tokens.context.begin() + begin, tokens.context.begin() + end);
    blend->chunks.push_back(after_head ? prefill_chunk_after(model, head, document)
                                       : prefill_chunk(model, document));
    blend->bytes += blend->chunks.back().bytes();
    begin = end;
  }
  blend->prefill_ms = seconds_since(start) * 1e3;
  return blend;
}

// The context through CacheBlend: the chat head prefilled, then the documents' cached KV
// blended in. Returns what it reused.
ReuseTurn feed_blended_context(const LlamaModel& model, KvCache& cache,
                               const SessionTokens& tokens, const BlendDocuments& blend) {
  cache.reserve_more(static_cast<int64_t>(tokens.context.size()));
  model.forward(std::vector<int32_t>(tokens.context.begin(), tokens.context.begin() + tokens.head_tokens),
                cache);
  std::vector<const CachedChunk*> chunks;
  for (const CachedChunk& chunk : blend.chunks) chunks.push_back(&chunk);
  const BlendStats stats = blend_chunks(model, chunks, blend.ratio, cache, blend.select_layer);
  cache.end_context();
  ReuseTurn turn;
  turn.tokens_reused = stats.tokens - stats.recomputed;
  turn.blocks_hit = static_cast<int64_t>(blend.chunks.size());
  turn.bytes_loaded = blend.bytes;
  turn.load_ms = stats.rotate_ms;
  turn.served_by = "device";
  turn.documents = true;
  return turn;
}

// One request with prefix reuse: the longest cached prefix of context + query is loaded,
// the rest prefilled (the context's end marked where it falls), and the new whole blocks
// captured for store(). Returns the tokens loaded; `logits` are the query's last token's.
// Query-aware, the context's end is marked after the query instead.
int64_t request_prompt(const LlamaModel& model, PrefixCache& reuse, KvCache& cache,
                       const std::vector<int32_t>& context, const std::vector<int32_t>& query,
                       int64_t room, bool query_aware, ReuseTurn& turn,
                       std::vector<float>& logits) {
  std::vector<int32_t> prompt = context;
  prompt.insert(prompt.end(), query.begin(), query.end());
  const int64_t n_context = static_cast<int64_t>(context.size());
  cache.reserve(n_context + room);
  const int64_t loaded = reuse.load(prompt, cache, turn);
  reuse.start_capture(cache, prompt, loaded);
  if (loaded < n_context) model.forward(std::vector<int32_t>(context.begin() + loaded, context.end()), cache);
  if (!query_aware) cache.end_context();
  const int64_t query_from = std::max<int64_t>(0, loaded - n_context);
  logits = model.forward(std::vector<int32_t>(query.begin() + query_from, query.end()), cache);
  if (query_aware) cache.end_context();
  return loaded;
}

// One request whose method evicts or merges: the context's compressed cache is reused whole
// (a copy of the snapshot), or prefilled and compressed, a copy going to `to_store` for
// later requests. Returns the context tokens loaded; `logits` are the query's last token's.
int64_t request_from_snapshot(const LlamaModel& model, ContextSnapshots& snapshots,
                              const std::string& key, KvCache& cache,
                              const std::vector<int32_t>& context,
                              const std::vector<int32_t>& query, int64_t room, ReuseTurn& turn,
                              std::vector<float>& logits, std::optional<KvCache>& to_store) {
  const auto start = Clock::now();
  const int64_t n_context = static_cast<int64_t>(context.size());
  turn.tokens_looked_up = n_context + static_cast<int64_t>(query.size());
  std::optional<KvCache> hit = snapshots.find(key);
  if (hit) {
    cache = std::move(*hit);
    cache.reset_peak();  // the snapshot's own prefill peak is not this request's
    turn.tokens_reused = n_context;
    turn.blocks_hit = 1;
    turn.bytes_loaded = cache.bytes_resident();
    turn.load_ms = seconds_since(start) * 1e3;
    turn.served_by = "device";
  } else {
    turn.blocks_missed = 1;
    feed_context(model, cache, context);
    to_store.emplace(cache.clone());
  }
  cache.reserve_more(room);
  logits = model.forward(query, cache);
  return turn.tokens_reused;
}

// The canonical text of a spec's per-sequence methods (reuse and tiers left out).
std::string per_sequence_spec(const ResolvedSpec& spec) {
  std::string out;
  for (const auto& [info, params] : spec.components) {
    if (info->kind == MethodKind::Reuse || info->kind == MethodKind::Tiers ||
        info->kind == MethodKind::Pinning) {
      continue;
    }
    const std::string p = params.text();
    out += (out.empty() ? "" : "+") + info->name + (p.empty() ? "" : ":" + p);
  }
  return out.empty() ? "full" : out;
}

// The tiers after the request, and what went wrong in them during it (a fault counted).
// Returns the block bytes moved into and out of the tiers during it.
int64_t note_tiers(std::vector<TierStats> now_tiers, const std::vector<TierStats>& before,
                   TurnRecord& record) {
  int64_t moved = 0;
  record.reuse_tiers = std::move(now_tiers);
  for (size_t i = 0; i < record.reuse_tiers.size() && i < before.size(); ++i) {
    const TierStats& now = record.reuse_tiers[i];
    const int64_t faults = now.faults - before[i].faults;
    if (faults > 0) {
      record.reuse.faults += (record.reuse.faults.empty() ? "" : "; ") + now.name + ": " +
                             now.last_fault + (faults > 1 ? " (" + std::to_string(faults) + " faults)" : "");
    }
    moved += now.bytes_in - before[i].bytes_in + now.bytes_out - before[i].bytes_out;
  }
  return moved;
}

// The reuse a multi-request session keeps across its requests: prefix blocks in their tiers,
// or, behind an eviction method, whole compressed contexts (the unit of reuse is then the
// compressed context). Their disk files and Redis keys live as long as it does; their TTLs
// read the session's simulated clock: 0 at the first request, advanced by the turn gap before
// each later one (nothing sleeps; the requests take no simulated time). A multi-turn
// conversation keeps its cache across turns, so reuse acts on requests only.
struct RequestReuse {
  std::shared_ptr<double> now = std::make_shared<double>(0.0);  // simulated seconds
  std::unique_ptr<PrefixCache> prefix;
  std::unique_ptr<ContextSnapshots> snapshots;
  std::string snapshot_key;

  bool any() const { return prefix || snapshots; }
  std::vector<TierStats> tiers() const {
    return prefix      ? prefix->tier_stats()
           : snapshots ? std::vector<TierStats>{snapshots->stats()}
                       : std::vector<TierStats>{};
  }
};

RequestReuse request_reuse(const LlamaModel& model, const ResolvedSpec& spec,
                           const SessionTokens& tokens, const SessionOptions& options) {
  RequestReuse reuse;
  const std::unique_ptr<ReuseConfig> config = prefix_reuse_config(spec);
  if (!config || options.mode != SessionMode::MultiRequest) return reuse;
  const auto clock = [now = reuse.now] { return *now; };
  const std::string model_id = model_identity(model.file().path());
  if (spec.find(MethodKind::Eviction)) {
    reuse.snapshots = std::make_unique<ContextSnapshots>(config->tiers.device_bytes,
                                                         config->tiers.policy, config->tiers.ttl_s,
                                                         clock, config->tiers.pin_ttl_s);
    reuse.snapshot_key = context_key(model_id, per_sequence_spec(spec), tokens.context);
  } else {
    reuse.prefix = std::make_unique<PrefixCache>(*config, model_id, model.kv_shape(), clock);
  }
  return reuse;
}

// What a turn records of its prompt, however it was prefilled: TTFT from `start` to the
// first token chosen (plus `elsewhere_ms`, its share of a shared prefill run before it), the
// prompt's tokens and the rate of the `prefilled` ones, the attention work, and the first
// token's log-probabilities.
void record_prompt(TurnRecord& record, const std::vector<float>& logits, Clock::time_point start,
                   double elsewhere_ms, int64_t prompt_tokens, int64_t prefilled,
                   double attn_flops, double attn_flops_dense) {
  const double prefill_s = seconds_since(start) + elsewhere_ms / 1e3;
  argmax(logits);  // the first token chosen: TTFT ends here
  record.ttft_ms = seconds_since(start) * 1e3 + elsewhere_ms;
  record.attn_flops = attn_flops;
  record.attn_flops_dense = attn_flops_dense;
  record.prompt_tokens = prompt_tokens;
  record.prefill_tokens_per_s = prefilled / std::max(prefill_s, 1e-9);
  record.own.first_logprobs = log_softmax(logits);
}

// One session's fixed inputs, and its turns: a conversation's (one cache through the session)
// or a request's (a fresh cache, the context prefilled, loaded or forked again).
class SessionRun {
 public:
  SessionRun(const LlamaModel& model, const ResolvedSpec& spec, const Sample& sample,
             const SessionTokens& tokens, const SessionOptions& options,
             const SharedPrefill* shared, SessionResult& result)
      : model_(model), spec_(spec), tokens_(tokens), options_(options), shared_(shared),
        result_(result), aware_(options.query == QuerySetting::Aware),
        blend_(blend_documents(model, spec, sample, tokens)),
        reuse_(request_reuse(model, spec, tokens, options)) {}

  // Multi-turn: the conversation's cache with the context in (query-aware: none yet; the
  // context goes in with the first query, as turn 1).
  void start_conversation() {
    if (blend_) {
      const auto start = Clock::now();
      conversation_.emplace(new_cache(model_, spec_));
      feed_blended_context(model_, *conversation_, tokens_, *blend_);
      result_.context_prefill_ms = seconds_since(start) * 1e3;
    } else if (!aware_) {
      double elsewhere_ms = 0;
      const auto start = Clock::now();
      conversation_.emplace(
          context_cache(model_, spec_, tokens_.context, shared_, result_, &elsewhere_ms));
      result_.context_prefill_ms = seconds_since(start) * 1e3 + elsewhere_ms;
    }
  }

  // Turn t of the conversation: its query into the conversation's cache, then its answer.
  void conversation_turn(size_t t, int64_t room, TurnRecord& record) {
    const TurnTokens& turn = tokens_.turns[t];
    const int64_t query_n = static_cast<int64_t>(turn.query.size());
    std::vector<float> logits;
    if (aware_ && t == 0 && !blend_) {
      // The context and the first query prefilled as one span, then compressed: TTFT is all
      // of it, as in a request (context_prefill_ms stays 0: nothing ran before the query).
      double elsewhere_ms = 0;
      const auto start = Clock::now();
      conversation_.emplace(aware_cache(model_, spec_, tokens_, options_, 0, shared_, result_,
                                        &elsewhere_ms, &logits));
      conversation_->reserve_more(room - query_n);
      const int64_t prompt = static_cast<int64_t>(tokens_.context.size()) + query_n;
      record_prompt(record, logits, start, elsewhere_ms, prompt, prompt,
                    conversation_->attn_flops(), conversation_->attn_flops_dense());
    } else {
      KvCache& cache = *conversation_;
      cache.reset_peak();
      cache.reserve_more(room);
      const double flops_before = cache.attn_flops();
      const double dense_before = cache.attn_flops_dense();
      const auto start = Clock::now();
      logits = model_.forward(turn.query, cache);
      record_prompt(record, logits, start, 0, query_n, query_n,
                    cache.attn_flops() - flops_before, cache.attn_flops_dense() - dense_before);
    }
    answer_turn(model_, *conversation_, logits, turn, tokens_.answer_tail, options_, true, record);
  }

  // Turn t as a request: a fresh cache, the context prefilled (or its cached prefix or
  // compressed context loaded) and compressed, then the query (query-aware: compressed after
  // it); all of it counts towards TTFT. The turn gap passes first on the simulated clock.
  void request_turn(size_t t, int64_t room, TurnRecord& record) {
    const TurnTokens& turn = tokens_.turns[t];
    const int64_t query_n = static_cast<int64_t>(turn.query.size());
    const int64_t n_context = static_cast<int64_t>(tokens_.context.size());
    if (t > 0) *reuse_.now += options_.turn_gap_s;
    const auto start = Clock::now();
    KvCache cache = new_cache(model_, spec_);
    const std::vector<TierStats> tiers_before = reuse_.tiers();
    std::vector<float> logits;
    int64_t loaded = 0;
    double elsewhere_ms = 0;  // the shared prefill's share for this method
    std::optional<KvCache> to_store;
    if (reuse_.prefix) {
      loaded = request_prompt(model_, *reuse_.prefix, cache, tokens_.context, turn.query, room,
                              aware_, record.reuse, logits);
      result_.prefilled_tokens += std::max<int64_t>(0, n_context - loaded);
    } else if (reuse_.snapshots) {
      loaded = request_from_snapshot(model_, *reuse_.snapshots, reuse_.snapshot_key, cache,
                                     tokens_.context, turn.query, room, record.reuse, logits,
                                     to_store);
      result_.prefilled_tokens += n_context - loaded;
    } else if (blend_) {
      record.reuse = feed_blended_context(model_, cache, tokens_, *blend_);
      record.reuse.tokens_looked_up = n_context + query_n;
      if (t == 0) {  // the documents' own prefills, done once before the first request
        record.reuse.blocks_stored = static_cast<int64_t>(blend_->chunks.size());
        record.reuse.bytes_stored = blend_->bytes;
        record.reuse.store_ms = blend_->prefill_ms;
      }
      cache.reserve_more(room);
      logits = model_.forward(turn.query, cache);
    } else if (aware_) {
      // Every request is the first of its conversation: its own query compressed with the
      // context, which every request forks from the shared prefill.
      cache = aware_cache(model_, spec_, tokens_, options_, t, shared_, result_, &elsewhere_ms,
                          &logits);
      cache.reserve_more(room - query_n);
    } else {
      cache = context_cache(model_, spec_, tokens_.context, shared_, result_, &elsewhere_ms);
      cache.reserve_more(room);
      logits = model_.forward(turn.query, cache);
    }
    const int64_t prompt = n_context + query_n;
    // A fresh cache: its attention work is the request's whole prefill.
    record_prompt(record, logits, start, elsewhere_ms, prompt, prompt - loaded,
                  cache.attn_flops(), cache.attn_flops_dense());
    // Stored after the first token, as LMCache stores.
    if (reuse_.prefix) reuse_.prefix->store(cache, record.reuse);
    if (to_store) {
      const auto store_start = Clock::now();
      record.reuse.blocks_stored = 1;
      record.reuse.bytes_stored = to_store->bytes_resident();
      reuse_.snapshots->put(reuse_.snapshot_key, std::move(*to_store));
      record.reuse.store_ms = seconds_since(store_start) * 1e3;
    }
    const int64_t moved = reuse_.any() ? note_tiers(reuse_.tiers(), tiers_before, record) : 0;
    answer_turn(model_, cache, logits, turn, tokens_.answer_tail, options_, false, record);
    record.cache.hits = record.reuse.blocks_hit;
    record.cache.misses = record.reuse.blocks_missed;
    record.cache.bytes_moved = moved;
  }

 private:
  const LlamaModel& model_;
  const ResolvedSpec& spec_;
  const SessionTokens& tokens_;
  const SessionOptions& options_;
  const SharedPrefill* shared_;
  SessionResult& result_;
  const bool aware_;
  const std::unique_ptr<BlendDocuments> blend_;
  RequestReuse reuse_;
  std::optional<KvCache> conversation_;  // multi-turn: the one cache of the conversation
};

}  // namespace

std::vector<int32_t> session_context_tokens(const LlamaModel& model, const Sample& sample,
                                            const SessionOptions& options) {
  return tokenize_sample(model, sample, options).context;
}

SessionResult run_session(const LlamaModel& model, const Sample& sample,
                          const ResolvedSpec& spec, const SessionOptions& options,
                          const SampleReference* reference, const SharedPrefill* shared) {
  if (options.max_new_tokens < 1) throw InputError("max_new_tokens must be at least 1");
  check_query_setting(spec, options.query);
  if (!(options.turn_gap_s >= 0)) throw InputError("turn gap must be >= 0 seconds");
  const SessionTokens tokens = tokenize_sample(model, sample, options);
  check_fits(model, sample, tokens, options);
  if (reference) {
    if (reference->sample_id != sample.id || reference->turns.size() < tokens.turns.size()) {
      throw std::invalid_argument("run_session: the reference is for sample '" +
                                  reference->sample_id + "' with " +
                                  std::to_string(reference->turns.size()) +
                                  " turns, not for sample '" + sample.id + "' with " +
                                  std::to_string(tokens.turns.size()));
    }
  }

  SessionResult result;
  result.sample_id = sample.id;
  result.method = spec.canonical;
  result.mode = options.mode;
  result.append = options.append;
  result.context_tokens = static_cast<int64_t>(tokens.context.size());
  result.fidelity = reference != nullptr;
  {
    const std::unique_ptr<TokenPolicy> policy = make_cache_parts(spec, model.kv_shape()).policy;
    const int64_t chunk = policy ? policy->context_block() : 0;
    result.prefill = chunk > 0 ? "stream:" + std::to_string(chunk) : "dense";
  }

  SessionRun run(model, spec, sample, tokens, options, shared, result);
  const bool conversation = options.mode == SessionMode::MultiTurn;
  if (conversation) run.start_conversation();
  for (size_t t = 0; t < tokens.turns.size(); ++t) {
    const TurnTokens& turn = tokens.turns[t];
    TurnRecord record;
    record.turn = static_cast<int32_t>(t + 1);
    record.query = sample.turns[t].input;
    record.reference = gold_text(sample.turns[t]);
    // The cache room the turn needs: its query, and its answer as given or decoded.
    const int64_t room = static_cast<int64_t>(turn.query.size()) + std::max<int64_t>(
        static_cast<int64_t>(turn.answer.size() + tokens.answer_tail.size()),
        options.append == AnswerSource::Model ? options.max_new_tokens + 1 : 0);
    if (conversation) {
      run.conversation_turn(t, room, record);
    } else {
      run.request_turn(t, room, record);
    }
    if (reference) fill_fidelity(record, reference->turns[t]);
    result.turns.push_back(std::move(record));
  }
  return result;
}

void check_session_fits(const LlamaModel& model, const Sample& sample,
                        const SessionOptions& options) {
  check_fits(model, sample, tokenize_sample(model, sample, options), options);
}

SampleReference reference_of(const SessionResult& result) {
  SampleReference reference;
  reference.sample_id = result.sample_id;
  for (const TurnRecord& turn : result.turns) reference.turns.push_back(turn.own);
  return reference;
}

void apply_reference(SessionResult& result, const SampleReference& reference) {
  if (reference.sample_id != result.sample_id || reference.turns.size() < result.turns.size()) {
    throw std::invalid_argument("apply_reference: the reference is for sample '" +
                                reference.sample_id + "', not '" + result.sample_id + "'");
  }
  for (size_t t = 0; t < result.turns.size(); ++t) {
    fill_fidelity(result.turns[t], reference.turns[t]);
  }
  result.fidelity = true;
}

}  // namespace kvbench
