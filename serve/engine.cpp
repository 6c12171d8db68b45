#include "serve/engine.h"

#include <algorithm>
#include <cmath>

#include "common/input_error.h"
#include "harness/generate.h"
#include "harness/model/gguf.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "harness/reconstruction.h"
#include "reuse/block_key.h"
#include "reuse/prefix_cache.h"

namespace kvbench {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Bytes at the end of `text` that start a UTF-8 character not yet complete: held back until
// the next token completes it, so that no chunk a client gets splits a character.
size_t incomplete_utf8_tail(const std::string& text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

}  // namespace

bool SequenceChannel::next(Update* update, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [&] { return !text_.empty() || (end_ && !end_taken_); };
  if (!changed_.wait_for(lock, timeout, ready)) return false;
  update->text = std::move(text_);
  text_.clear();
  update->tokens = tokens_;
  update->end.reset();
  if (end_ && !end_taken_) {
    update->end = end_;
    end_taken_ = true;
  }
  return true;
}

void SequenceChannel::push(const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    text_ += text;
  }
  changed_.notify_all();
}

void SequenceChannel::finish(SequenceEnd end) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    end_ = std::move(end);
  }
  changed_.notify_all();
}

struct ServingEngine::Sequence {
  int64_t id = 0;
  GenerationRequest request;
  std::shared_ptr<SequenceChannel> channel;
  std::optional<KvCache> cache;
  PrefixCache* prefix = nullptr;
  bool capturing = false;     // its prefix cache records this prompt's blocks (one at a time)
  bool packs_chunks = false;  // its prompt's chunks settle as they come in
  ReuseTurn reuse;
  StoreCost cost;     // of its method's store (KvPool::store_cost)
  int64_t floor = 0;  // the reservation's floor (KvPool's rule)
  int64_t reserved = 0;
  int64_t fed = 0;  // prompt tokens in the cache, loaded or prefilled
  bool decoding = false;
  int32_t next_token = -1;  // chosen, not yet fed
  std::vector<int32_t> generated;
  size_t text_sent = 0;  // bytes of the decoded text the channel has
  uint64_t rng_state = 0;
  Clock::time_point arrived, admitted;
  double ttft_ms = 0;
  int64_t eos_text_bytes = -1;  // SequenceEnd's
  int64_t need = -1;            // what it reserves when admitted (priced once: price())
};

ServingEngine::ServingEngine(const LlamaModel& model, EngineOptions options)
    : model_(model),
      options_(options),
      pool_(options.pool_bytes, options.prefill_chunk),
      started_(Clock::now()) {
  metrics_.pool_capacity = options.pool_bytes;
  const Tokenizer& tokenizer = model.tokenizer();
  for (int32_t t = 0; t < tokenizer.vocab_size(); ++t) {
    if (t == tokenizer.eos_id() || tokenizer.is_control(t)) end_tokens_.push_back(t);
  }
}

int32_t ServingEngine::pick_token(Sequence& s, const float* logits) const {
  std::vector<float> row(logits, logits + model_.config().vocab_size);
  if (s.request.ignore_eos) {
    if (s.eos_text_bytes < 0) {
      const int32_t best =
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      if (std::binary_search(end_tokens_.begin(), end_tokens_.end(), best)) {
        s.eos_text_bytes = static_cast<int64_t>(model_.tokenizer().decode(s.generated).size());
      }
    }
    for (int32_t t : end_tokens_) row[t] = -INFINITY;
  }
  return sample_token(row, s.request.temperature, s.rng_state);
}

ServingEngine::~ServingEngine() = default;

bool ServingEngine::packs_chunks(const GenerationRequest& request, const StoreCost& cost) const {
  if (!options_.pack_prompt_chunks || !cost.settles_chunks ||
      prefix_reuse_config(*request.method)) {
    return false;
  }
  return new_cache(model_, *request.method).settle_context_chunks();  // no policy in front
}

namespace {
// What a request reserves when admitted, by its store's cost (KvPool's rule).
int64_t bytes_needed(const GenerationRequest& request, const StoreCost& cost, bool packs_chunks) {
  const int64_t tokens = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (packs_chunks) return cost.whole.at(tokens);
  // The prompt whole at prefill precision, and the answer at the same rate.
  return ByteBound{0, cost.prompt_token_bytes}.at(tokens);
}
}  // namespace

int64_t ServingEngine::admission_bytes(const GenerationRequest& request) {
  const StoreCost cost = pool_.store_cost(model_, *request.method);
  return bytes_needed(request, cost, packs_chunks(request, cost));
}

void ServingEngine::price(Sequence& s) {
  if (s.need >= 0) return;
  s.cost = pool_.store_cost(model_, *s.request.method);
  s.packs_chunks = packs_chunks(s.request, s.cost);
  s.need = bytes_needed(s.request, s.cost, s.packs_chunks);
}

std::shared_ptr<SequenceChannel> ServingEngine::submit(GenerationRequest request) {
  auto s = std::make_unique<Sequence>();
  s->arrived = Clock::now();
  s->rng_state = request.seed;
  s->channel = std::make_shared<SequenceChannel>();
  s->request = std::move(request);
  std::shared_ptr<SequenceChannel> channel = s->channel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto refuse = [&] { ++metrics_.requests_refused; };
    if (stopping_) {
      refuse();
      throw EngineBusy("the server is shutting down");
    }
    if (static_cast<int64_t>(inbox_.size()) + metrics_.waiting >= options_.max_waiting) {
      refuse();
      throw EngineBusy("the queue is full (" + std::to_string(options_.max_waiting) +
                       " requests waiting)");
    }
    s->id = next_id_++;
    inbox_.push_back(std::move(s));
  }
  wake_.notify_all();
  return channel;
}

void ServingEngine::stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) stop_deadline_ = Clock::now() + grace;
    stopping_ = true;
  }
  wake_.notify_all();
}

PrefixCache* ServingEngine::prefix_cache_for(const ResolvedSpec& spec) {
  const std::unique_ptr<ReuseConfig> config = prefix_reuse_config(spec);
  if (!config) return nullptr;
  std::string key;
  for (const auto& [info, params] : spec.components) {
    if (info->kind == MethodKind::Reuse || info->kind == MethodKind::Tiers ||
        info->kind == MethodKind::Pinning) {
      key += info->name + ":" + params.text() + "+";
    }
  }
  auto& cache = prefix_caches_[key];
  if (!cache) {
    cache = std::make_unique<PrefixCache>(*config, model_identity(model_.file().path()),
                                          model_.kv_shape());
  }
  return cache.get();
}

int64_t ServingEngine::reserved_bytes() const {
  int64_t total = 0;
  for (const auto& s : running_) total += s->reserved;
  for (const auto& [key, prefix] : prefix_caches_) {
    const auto tiers = prefix->tier_stats();
    if (!tiers.empty()) total += tiers.front().capacity;  // the top tier may fill up to it
  }
  return total;
}

void ServingEngine::update_reservation(Sequence& s) {
  s.reserved = std::max(s.cache->bytes_resident(), s.floor);
}

void ServingEngine::admit() {
  // One sequence prefills at a time, and until its context is compressed it holds the prompt
  // at prefill precision: the next is admitted once that one is compressed, so that the pool
  // holds one prompt at full size, not every admitted one's.
  const auto prefilling = [&] {
    return std::any_of(running_.begin(), running_.end(),
                       [](const std::unique_ptr<Sequence>& s) { return !s->decoding; });
  };
  while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_seqs &&
         !prefilling()) {
    Sequence& s = *waiting_.front();
    price(s);  // once, not at every step it waits
    const int64_t need = s.need;
    if (reserved_bytes() + need > pool_.capacity()) {
      // First come, first served: a later, smaller request does not pass it. One that can
      // never fit (the pool emptied and still too small) is refused.
      if (running_.empty()) {
        finish(s, "error",
               "the request needs " + std::to_string(need) + " bytes of KV, more than the pool's " +
                   std::to_string(pool_.capacity()));
        waiting_.pop_front();
        continue;
      }
      return;
    }
    s.floor = need;
    s.admitted = Clock::now();
    try {
      s.cache.emplace(new_cache(model_, *s.request.method));
      if (s.packs_chunks) {  // room for all its tokens as the store packs them
        s.cache->settle_context_chunks();
        s.cache->reserve(static_cast<int64_t>(s.request.prompt.size()) + s.request.max_tokens);
      } else {
        s.cache->reserve(static_cast<int64_t>(s.request.prompt.size()));
      }
      s.prefix = prefix_cache_for(*s.request.method);
    } catch (const std::exception& e) {  // a method or a tier that refuses: this request only
      finish(s, "error", e.what());
      waiting_.pop_front();
      continue;
    }
    update_reservation(s);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void ServingEngine::finish(Sequence& s, const std::string& reason, const std::string& error) {
  SequenceEnd end;
  end.finish_reason = reason;
  end.error = error;
  end.prompt_tokens = static_cast<int64_t>(s.request.prompt.size());
  end.completion_tokens = static_cast<int64_t>(s.generated.size());
  end.cached_tokens = s.reuse.tokens_reused;
  end.ttft_ms = s.ttft_ms;
  end.eos_text_bytes = s.eos_text_bytes;
  if (s.cache) {
    end.queue_ms = ms_between(s.arrived, s.admitted);
    end.kv_bytes_peak = s.cache->stats().bytes_peak;
  }
  if (s.capturing) {
    ReuseTurn ignored;
    s.prefix->store(*s.cache, ignored);  // stops the capture: the cache goes away
    s.capturing = false;
  }
  s.cache.reset();  // its bytes go back to the pool now
  s.reserved = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (reason == "cancelled") {
    ++metrics_.requests_cancelled;
  } else if (error.empty()) {
    ++metrics_.requests_finished;
  } else {
    ++metrics_.requests_refused;
  }
  s.channel->finish(std::move(end));
}

bool ServingEngine::emit_token(Sequence& s, int32_t token) {
  const Tokenizer& tokenizer = model_.tokenizer();
  if (token == tokenizer.eos_id() || tokenizer.is_control(token)) {
    s.channel->push(tokenizer.decode(s.generated).substr(s.text_sent));
    finish(s, "stop");
    return false;
  }
  s.generated.push_back(token);
  s.channel->count_token();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.generated_tokens;
    const double now = ms_between(started_, Clock::now()) / 1e3;
    recent_tokens_.emplace_back(now, 1);
    while (recent_tokens_.front().first < now - 10) recent_tokens_.pop_front();
  }
  const std::string text = tokenizer.decode(s.generated);
  // A stop string ends the text where it starts; only the new text can hold a new one.
  size_t longest_stop = 0;
  size_t cut = std::string::npos;
  for (const std::string& stop : s.request.stop) {
    longest_stop = std::max(longest_stop, stop.size());
    const size_t from = s.text_sent >= stop.size() ? s.text_sent - stop.size() + 1 : 0;
    const size_t at = text.find(stop, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    if (cut > s.text_sent) s.channel->push(text.substr(s.text_sent, cut - s.text_sent));
    s.text_sent = std::max(s.text_sent, cut);
    finish(s, "stop");
    return false;
  }
  const bool at_length = static_cast<int32_t>(s.generated.size()) >= s.request.max_tokens ||
                         s.cache->next_position() >= model_.config().context_length;
  if (at_length) {
    s.channel->push(text.substr(s.text_sent));
    s.text_sent = text.size();
    finish(s, "length");
    return false;
  }
  // Held back: a character not yet complete, and what could still become a stop string.
  const size_t hold = std::max(incomplete_utf8_tail(text), longest_stop ? longest_stop - 1 : 0);
  const size_t ready = text.size() > hold ? text.size() - hold : 0;
  if (ready > s.text_sent) {
    s.channel->push(text.substr(s.text_sent, ready - s.text_sent));
    s.text_sent = ready;
  }
  s.next_token = token;
  return true;
}

void ServingEngine::drop_cancelled() {
  const auto cancelled = [](const std::unique_ptr<Sequence>& s) { return s->channel->cancelled(); };
  for (auto& s : waiting_) {
    if (cancelled(s)) finish(*s, "cancelled");
  }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), cancelled), waiting_.end());
  for (auto& s : running_) {
    if (cancelled(s)) finish(*s, "cancelled");
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), cancelled), running_.end());
}

void ServingEngine::decode_step() {
  std::vector<Sequence*> batch;
  for (auto& s : running_) {
    if (s->decoding) batch.push_back(s.get());
  }
  if (batch.empty()) return;
  std::vector<int32_t> tokens;
  std::vector<KvCache*> caches;
  for (Sequence* s : batch) {
    tokens.push_back(s->next_token);
    caches.push_back(&*s->cache);
  }
  std::vector<float> logits;
  try {
    logits = model_.decode_batch(tokens, caches);
  } catch (const std::exception& e) {
    // A method that fails mid-step leaves every cache of the step half advanced: the
    // batch's requests end with the error; the server goes on.
    for (Sequence* s : batch) finish(*s, "error", e.what());
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const std::unique_ptr<Sequence>& s) { return !s->cache; }),
                   running_.end());
    return;
  }
  const int64_t vocab = model_.config().vocab_size;
  std::vector<Sequence*> ended;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    if (emit_token(s, pick_token(s, logits.data() + i * vocab))) {
      update_reservation(s);
    } else {
      ended.push_back(&s);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.decode_steps;
    metrics_.decode_rows += static_cast<int64_t>(batch.size());
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const std::unique_ptr<Sequence>& s) {
                                  return std::find(ended.begin(), ended.end(), s.get()) !=
                                         ended.end();
                                }),
                 running_.end());
}

void ServingEngine::prefill_step() {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [](const std::unique_ptr<Sequence>& s) { return !s->decoding; });
  if (it == running_.end()) return;
  Sequence& s = **it;
  const std::vector<int32_t>& prompt = s.request.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<float> logits;
  int64_t end = 0;
  try {
    // Prefix reuse at the start of the prefill, not at admission: what the prefill before
    // this one stored is found, and a PrefixCache captures one prompt at a time (prefills run
    // one after the other).
    if (s.prefix && !s.capturing && s.fed == 0) {
      s.fed = s.prefix->load(prompt, *s.cache, s.reuse);
      s.prefix->start_capture(*s.cache, prompt, s.fed);
      s.capturing = true;
    }
    end = std::min<int64_t>(n, s.fed + options_.prefill_chunk);
    logits = model_.forward_part(prompt, s.fed, end, *s.cache);
    if (end == n) {
      if (s.capturing) s.prefix->store(*s.cache, s.reuse);
      s.capturing = false;
      // The prompt is the shared context: the method compresses it before the first token
      // (KVzip first runs its reconstruction forwards), as `kvbench generate` does.
      score_by_reconstruction(model_, *s.cache, prompt, 0, "\n");
      s.cache->end_context();
    }
  } catch (const std::exception& e) {
    finish(s, "error", e.what());
    running_.erase(it);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.prefilled_tokens += end - s.fed;
  }
  s.fed = end;
  if (s.fed < n) {
    update_reservation(s);
    return;
  }
  // The compressed cache and the answer's room (KvPool's rule).
  if (s.packs_chunks) {
    s.floor = s.cache->bytes_resident() + s.cost.packed_answer.at(s.request.max_tokens);
  } else if (s.cost.reserve_answer) {
    s.cache->reserve_more(s.request.max_tokens);
    s.floor = s.cache->bytes_resident();
  } else {
    s.floor = s.cache->bytes_resident() + s.cost.answer.at(s.request.max_tokens);
  }
  s.decoding = true;
  s.ttft_ms = ms_between(s.arrived, Clock::now());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.prompt_tokens += n;
    metrics_.prefix_hit_tokens += s.reuse.tokens_reused;
    metrics_.prefix_lookup_tokens += s.reuse.tokens_looked_up;
  }
  if (emit_token(s, pick_token(s, logits.data()))) {
    update_reservation(s);
  } else {
    running_.erase(it);
  }
}

void ServingEngine::run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const auto has_work = [&] {
        return stopping_ || !inbox_.empty() || !running_.empty() || !waiting_.empty();
      };
      wake_.wait(lock, has_work);
      while (!inbox_.empty()) {
        waiting_.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
      }
      if (stopping_ && running_.empty() && waiting_.empty()) break;
      if (stopping_ && !waiting_.empty()) {
        for (auto& s : waiting_) s->channel->cancel();  // never admitted: nothing to finish
      }
      if (stopping_ && Clock::now() >= stop_deadline_) {
        for (auto& s : running_) s->channel->cancel();  // the grace period is over
      }
    }
    const auto busy_start = Clock::now();
    drop_cancelled();
    if (!stopping_) admit();
    decode_step();
    prefill_step();
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.busy_s += ms_between(busy_start, Clock::now()) / 1e3;
    metrics_.most_running = std::max<int64_t>(metrics_.most_running, running_.size());
    int64_t resident = 0, prefilling = 0;
    for (const auto& s : running_) {
      resident += s->cache->bytes_resident();
      prefilling += !s->decoding;
    }
    metrics_.running = static_cast<int64_t>(running_.size());
    metrics_.prefilling = prefilling;
    metrics_.waiting = static_cast<int64_t>(waiting_.size());
    metrics_.pool_resident = resident;
    metrics_.pool_reserved = reserved_bytes();
    int64_t prefix = 0;
    for (const auto& [key, cache] : prefix_caches_) {
      for (const TierStats& t : cache->tier_stats()) prefix += t.bytes_resident;
    }
    metrics_.prefix_bytes = prefix;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_.running = metrics_.prefilling = metrics_.waiting = 0;
  finished_ = true;
}

EngineMetrics ServingEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineMetrics m = metrics_;
  m.uptime_s = ms_between(started_, Clock::now()) / 1e3;
  // Tokens of the last 10 s over 10 s (or over the uptime, in the first 10 s).
  const double window = std::min(10.0, std::max(m.uptime_s, 1e-3));
  int64_t recent = 0;
  for (const auto& [at, tokens] : recent_tokens_) {
    if (at >= m.uptime_s - window) recent += tokens;
  }
  m.tokens_per_s = recent / window;
  return m;
}

}  // namespace kvbench
