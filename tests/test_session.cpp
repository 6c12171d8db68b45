// The session driver on a tiny random-weight model written by the test: what each mode
// feeds and keeps, the bytes it reports, fidelity against the full cache, and the errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>

#include "cache/registry.h"
#include "common/input_error.h"
#include "gguf_writer.h"
#include "harness/fidelity.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/session.h"
#include "tests/session_by_text.h"

using namespace kvbench;

namespace {

const LlamaModel& tiny_model() {
  static const std::unique_ptr<LlamaModel> model = [] {
    testing::TinyLlamaSpec spec;
    spec.context_length = 1024;
    const std::string path = testing::temp_path("tiny_session.gguf");
    testing::write_tiny_llama_gguf(path, spec);
    return LlamaModel::load(path);
  }();
  return *model;
}

SampleTurn turn_of(std::string input, std::vector<std::string> answers) {
  SampleTurn t;
  t.input = std::move(input);
  t.answers = std::move(answers);
  return t;
}

Sample tiny_sample() {
  Sample s;
  s.id = "tiny-1";
  s.context = "keys: abc = 12, def = 34, ghi = 56, jkl = 78. the quick brown fox jumps.";
  s.turns = {turn_of("what is abc?", {"12 is the value of abc", "12"}),
             turn_of("and def?", {"34"}), turn_of("what about ghi, then?", {"the value is 56"})};
  return s;
}

SessionOptions options_for(SessionMode mode, AnswerSource append = AnswerSource::Gold,
                           int32_t max_new = 6) {
  SessionOptions o;
  o.mode = mode;
  o.append = append;
  o.max_new_tokens = max_new;
  return o;
}

int64_t n_tokens(const std::string& text) {
  return static_cast<int64_t>(tiny_model().tokenizer().encode(text).size());
}

// Bytes the dense store holds per token slot, all layers ([k, v] fp32 + a position per head).
int64_t dense_bytes_per_token() {
  const KvShape s = tiny_model().kv_shape();
  return static_cast<int64_t>(s.n_layers) * s.n_kv_heads *
         (2 * s.head_dim * static_cast<int64_t>(sizeof(float)) + sizeof(int32_t));
}

constexpr int64_t kTailTokens = 2;  // "<|im_end|>" + "\n"

}  // namespace

TEST_CASE("fidelity: log-softmax, KL, argmax, agreement", "[unit]") {
  const std::vector<float> logits = {1.f, 2.f, 3.f, -100.f};
  const auto lp = log_softmax(logits);
  double total = 0;
  for (float x : lp) total += std::exp(static_cast<double>(x));
  CHECK(total == Approx(1.0).epsilon(1e-6));
  CHECK(lp[2] - lp[1] == Approx(1.0));
  CHECK(kl_divergence(lp, lp) == 0.0);
  CHECK(kl_divergence(lp, log_softmax(logits)) == 0.0);
  // KL([1/2, 1/2] || [1/4, 3/4]) = 0.5 ln 2 + 0.5 ln(2/3).
  const std::vector<float> p = {std::log(0.5f), std::log(0.5f)};
  const std::vector<float> q = {std::log(0.25f), std::log(0.75f)};
  CHECK(kl_divergence(p, q) == Approx(0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)).epsilon(1e-6));
  CHECK(kl_divergence(q, p) > 0);
  CHECK(argmax({0.f, 5.f, 5.f, 1.f}) == 1);
  CHECK(argmax({}) == -1);
  CHECK(top1_agreement({1, 2, 3, 4}, {1, 2, 0, 4}) == 0.75);
  CHECK(top1_agreement({1, 2}, {1, 2, 3}) == Approx(2.0 / 3.0));
  CHECK(top1_agreement({}, {}) == 1.0);
}

TEST_CASE("session: modes parse and print", "[unit]") {
  CHECK(parse_session_mode("multi-turn") == SessionMode::MultiTurn);
  CHECK(parse_session_mode("multi-request") == SessionMode::MultiRequest);
  CHECK(std::string(to_string(SessionMode::MultiRequest)) == "multi-request");
  CHECK_THROWS_AS(parse_session_mode("scdq"), InputError);
  CHECK(parse_answer_source("model") == AnswerSource::Model);
  CHECK_THROWS_AS(parse_answer_source("mine"), InputError);
}

TEST_CASE("session: the full cache in multi-turn is its own reference", "[unit]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = tiny_sample();
  const SessionOptions options = options_for(SessionMode::MultiTurn);
  const SessionResult first = run_session(model, sample, "full", options, nullptr);
  CHECK_FALSE(first.fidelity);
  CHECK(first.method == "full");
  REQUIRE(first.turns.size() == 3);
  for (const TurnRecord& t : first.turns) {
    CHECK(t.first_token_kl == 0.0);
    CHECK(t.top1_agreement == 0.0);  // not measured
    CHECK(t.own.first_logprobs.size() == static_cast<size_t>(model.tokenizer().vocab_size()));
  }
  // One top-1 per reference-answer position.
  CHECK(static_cast<int64_t>(first.turns[0].own.top1.size()) == n_tokens("12 is the value of abc"));
  CHECK(first.turns[0].own.top1[0] == argmax(first.turns[0].own.first_logprobs));

  const SampleReference reference = reference_of(first);
  const SessionResult second = run_session(model, sample, "full", options, &reference);
  CHECK(second.fidelity);
  for (const TurnRecord& t : second.turns) {
    CHECK(t.first_token_kl == 0.0);
    CHECK(t.top1_agreement == 1.0);
    CHECK(t.prediction == first.turns[t.turn - 1].prediction);
  }
  SessionResult self = first;
  apply_reference(self, reference_of(self));
  CHECK(self.fidelity);
  CHECK(self.turns[2].first_token_kl == 0.0);
  CHECK(self.turns[2].top1_agreement == 1.0);
  // The comparison can fail: against a reference whose distribution and top-1s differ, the
  // same turns score KL > 0 and no agreement.
  SampleReference shifted = reference_of(first);
  for (TurnReference& t : shifted.turns) {
    std::rotate(t.first_logprobs.begin(), t.first_logprobs.begin() + 1, t.first_logprobs.end());
    for (int32_t& id : t.top1) id = (id + 1) % model.tokenizer().vocab_size();
  }
  SessionResult against_shifted = first;
  apply_reference(against_shifted, shifted);
  for (const TurnRecord& t : against_shifted.turns) {
    CHECK(t.first_token_kl > 0.01);
    CHECK(t.top1_agreement == 0.0);
  }

  Sample other = sample;
  other.id = "other";
  CHECK_THROWS_AS(run_session(model, other, "full", options, &reference), std::invalid_argument);
}

TEST_CASE("session: multi-turn keeps growing, multi-request starts over", "[unit]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = tiny_sample();
  const auto started = std::chrono::steady_clock::now();
  const SessionResult turn = run_session(model, sample, "full", options_for(SessionMode::MultiTurn), nullptr);
  const SessionResult request =
      run_session(model, sample, "full", options_for(SessionMode::MultiRequest), nullptr);
  // Timings are in milliseconds of this wall time (a timer in seconds or microseconds, or one
  // never started, would fall outside (0, wall]).
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  REQUIRE(turn.turns.size() == 3);
  REQUIRE(request.turns.size() == 3);
  CHECK(turn.context_tokens == request.context_tokens);
  CHECK(turn.context_prefill_ms > 0);
  CHECK(turn.context_prefill_ms < wall_ms);

  // Multi-turn: context, then each turn's query and appended gold answer, all kept.
  int64_t seen = turn.context_tokens;
  for (size_t i = 0; i < 3; ++i) {
    const TurnRecord& t = turn.turns[i];
    CHECK(t.appended_tokens == n_tokens(sample.turns[i].answers[0]) + kTailTokens);
    seen += t.prompt_tokens + t.appended_tokens;
    CHECK(t.cache.tokens_seen == seen);
    CHECK(t.tokens_kept == static_cast<double>(seen));
    if (i > 0) CHECK(t.kv_bytes > turn.turns[i - 1].kv_bytes);
  }
  // Multi-request: each turn is the context and its own query on a fresh cache.
  for (size_t i = 0; i < 3; ++i) {
    const TurnRecord& t = request.turns[i];
    CHECK(t.prompt_tokens > request.context_tokens);
    CHECK(t.cache.tokens_seen == t.prompt_tokens + t.appended_tokens);
    CHECK(t.appended_tokens == n_tokens(sample.turns[i].answers[0]) - 1);
    CHECK(t.ttft_ms > 0);
    CHECK(t.ttft_ms < wall_ms);
  }
  CHECK(request.turns[2].cache.tokens_seen < turn.turns[2].cache.tokens_seen);
  // The first turn sees the same tokens either way, so the same distribution.
  CHECK(kl_divergence(turn.turns[0].own.first_logprobs, request.turns[0].own.first_logprobs) ==
        Approx(0.0).margin(1e-6));
  CHECK(turn.turns[0].own.top1 == request.turns[0].own.top1);
  CHECK(turn.turns[0].prediction == request.turns[0].prediction);
}

TEST_CASE("session: gold and model append differ in what the next turn sees", "[unit]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = tiny_sample();
  const SessionResult gold =
      run_session(model, sample, "full", options_for(SessionMode::MultiTurn, AnswerSource::Gold, 3), nullptr);
  const SessionResult own =
      run_session(model, sample, "full", options_for(SessionMode::MultiTurn, AnswerSource::Model, 3), nullptr);
  CHECK(gold.append == AnswerSource::Gold);
  CHECK(own.append == AnswerSource::Model);
  // Turn 1 is the same state in both.
  CHECK(gold.turns[0].prediction == own.turns[0].prediction);
  CHECK(gold.turns[0].own.top1 == own.turns[0].own.top1);
  // What each appends: the gold answer, or the model's (at most 3 tokens), then the tail.
  CHECK(gold.turns[0].appended_tokens == n_tokens("12 is the value of abc") + kTailTokens);
  CHECK(own.turns[0].appended_tokens == own.turns[0].output_tokens + kTailTokens);
  CHECK(own.turns[0].output_tokens <= 3);
  CHECK(own.turns[1].cache.tokens_seen <
        gold.turns[1].cache.tokens_seen);  // the gold answer is longer than 3 tokens
  // So turn 2 starts from different histories.
  CHECK(kl_divergence(gold.turns[1].own.first_logprobs, own.turns[1].own.first_logprobs) > 0);
}

TEST_CASE("session: a turn's reference, when set, is the gold answer fed and reported", "[unit]") {
  // Variable tracking: every name is required, so the gold answer lists them all.
  Sample sample = tiny_sample();
  sample.turns[0].answers = {"abc", "def"};
  sample.turns[0].reference = "abc, def";
  const SessionResult r = run_session(tiny_model(), sample, "full",
                                      options_for(SessionMode::MultiTurn), nullptr);
  CHECK(r.turns[0].reference == "abc, def");
  CHECK(r.turns[0].appended_tokens == n_tokens("abc, def") + kTailTokens);
  CHECK(r.turns[1].reference == "34");  // no reference: answers[0]
}

TEST_CASE("session: bytes after and peak agree with the cache's stats", "[unit]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = tiny_sample();
  const int32_t max_new = 9;
  const SessionResult r =
      run_session(model, sample, "full", options_for(SessionMode::MultiTurn, AnswerSource::Gold, max_new), nullptr);
  const int64_t per_token = dense_bytes_per_token();
  for (const TurnRecord& t : r.turns) {
    INFO("turn " << t.turn);
    CHECK(t.kv_bytes == t.cache.bytes_resident);
    CHECK(t.cache.bytes_resident ==
          std::accumulate(t.cache.bytes_per_layer.begin(), t.cache.bytes_per_layer.end(), int64_t{0}));
    CHECK(t.kv_bytes_peak >= t.cache.bytes_peak);
    CHECK(t.kv_bytes_peak >= t.kv_bytes);
    // The full cache holds exactly its tokens after a gold turn.
    const int64_t after = t.cache.tokens_per_layer[0];
    CHECK(t.kv_bytes == after * per_token);
    // The peak is the decoding branch (the state after the query + max_new slots) or the
    // turn's cache, whichever is larger; never the two added.
    const int64_t after_query = after - t.appended_tokens;
    CHECK(t.kv_bytes_peak == std::max(after, after_query + max_new) * per_token);
  }
  // Multi-request: the same per request, from its own fresh cache.
  const SessionResult q =
      run_session(model, sample, "full", options_for(SessionMode::MultiRequest, AnswerSource::Gold, max_new), nullptr);
  for (const TurnRecord& t : q.turns) {
    CHECK(t.kv_bytes == t.cache.bytes_resident);
    CHECK(t.kv_bytes_peak >= t.kv_bytes);
    CHECK(t.kv_bytes_peak <= (t.prompt_tokens + std::max<int64_t>(max_new, t.appended_tokens + 1 + kTailTokens)) * per_token);
  }
}

TEST_CASE("session: an eviction method keeps its budget and is measured against full", "[unit]") {
  if (!find_method("streamingllm")) {
    WARN("streamingllm is not registered: skipped");
    return;
  }
  const LlamaModel& model = tiny_model();
  const Sample sample = tiny_sample();
  const SessionOptions options = options_for(SessionMode::MultiTurn);
  const SampleReference reference = reference_of(run_session(model, sample, "full", options, nullptr));
  const SessionResult r = run_session(model, sample, "streamingllm:budget=24", options, &reference);
  CHECK(r.method.rfind("streamingllm:budget=24", 0) == 0);
  CHECK(r.fidelity);
  for (const TurnRecord& t : r.turns) {
    CHECK(t.tokens_kept <= 24.0);
    // The recorded KL is the sum over the vocabulary of p_ref (log p_ref - log p_method),
    // recomputed here unclamped: non-negative by itself, not by kl_divergence's clamp.
    const std::vector<float>& ref = reference.turns[t.turn - 1].first_logprobs;
    double kl = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      kl += std::exp(double{ref[i]}) * (double{ref[i]} - t.own.first_logprobs[i]);
    }
    CHECK(kl > -1e-9);
    CHECK(t.first_token_kl == Approx(kl).margin(1e-9));
    // Agreement: the share of reference positions where the method's argmax is the same.
    const std::vector<int32_t>& top1 = reference.turns[t.turn - 1].top1;
    size_t same = 0;
    for (size_t i = 0; i < top1.size() && i < t.own.top1.size(); ++i) same += top1[i] == t.own.top1[i];
    CHECK(t.top1_agreement == Approx(static_cast<double>(same) / std::max(top1.size(), t.own.top1.size())));
    CHECK(t.cache.tokens_evicted > 0);
  }
  CHECK(r.turns.back().first_token_kl > 0.0);  // the context it needed is gone
}

TEST_CASE("session: --turns cuts the sample", "[unit]") {
  SessionOptions options = options_for(SessionMode::MultiTurn);
  options.max_turns = 2;
  const SessionResult r = run_session(tiny_model(), tiny_sample(), "full", options, nullptr);
  CHECK(r.turns.size() == 2);
}

TEST_CASE("session: a sample longer than the context names its id", "[unit]") {
  Sample sample = tiny_sample();
  sample.id = "way-too-long";
  sample.context = std::string(3000, 'z') + " end";
  for (SessionMode mode : {SessionMode::MultiTurn, SessionMode::MultiRequest}) {
    CHECK_THROWS_WITH(run_session(tiny_model(), sample, "full", options_for(mode), nullptr),
                      Catch::Contains("sample 'way-too-long'") &&
                          Catch::Contains("context of 1024 tokens"));
  }
  // Turns that only fit without the previous ones: fine in multi-request, not in multi-turn.
  Sample turns = tiny_sample();
  turns.id = "many-turns";
  turns.turns.clear();
  for (int i = 0; i < 12; ++i) turns.turns.push_back(turn_of(std::string(60, 'q'), {std::string(40, 'a')}));
  CHECK_NOTHROW(run_session(tiny_model(), turns, "full", options_for(SessionMode::MultiRequest, AnswerSource::Gold, 1), nullptr));
  CHECK_THROWS_WITH(run_session(tiny_model(), turns, "full", options_for(SessionMode::MultiTurn, AnswerSource::Gold, 1), nullptr),
                    Catch::Contains("sample 'many-turns'"));
  CHECK_THROWS_AS(run_session(tiny_model(), tiny_sample(), "nosuch", options_for(SessionMode::MultiTurn), nullptr),
                  InputError);
}
