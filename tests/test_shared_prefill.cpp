// One prefill for many methods (harness/shared_prefill.h): every method that starts from
// the sample's shared prefill gives the same predictions, logits, scores, KL and bytes as
// a prefill of its own, in both modes, on a tiny random-weight model and on the real one.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "gguf_writer.h"
#include "harness/evaluation.h"
#include "harness/model/llama_model.h"
#include "harness/session.h"
#include "tests/session_by_text.h"
#include "harness/shared_prefill.h"
#include "tests/same_turns.h"

using namespace kvbench;

namespace {

const LlamaModel& tiny_model() {
  static const std::unique_ptr<LlamaModel> model = [] {
    testing::TinyLlamaSpec spec;
    spec.n_layer = 4;
    spec.n_embd = 128;  // head_dim 32: KIVI packs channels in groups of 32
    spec.context_length = 2048;
    const std::string path = testing::temp_path("tiny_shared_prefill.gguf");
    testing::write_tiny_llama_gguf(path, spec);
    auto m = LlamaModel::load(path);
    m->prefill_chunk = 64;  // a context of several forwards: stores grow chunk by chunk
    // duo_attention's head map, fixed and synthetic (no probe runs on this random model).
    std::vector<float> heads(static_cast<size_t>(spec.n_layer) * spec.n_head_kv);
    for (size_t i = 0; i < heads.size(); ++i) heads[i] = static_cast<float>(i * 37 % 11);
    m->set_head_retrieval(heads);
    return m;
  }();
  return *model;
}

Sample long_sample() {
  Sample s;
  s.id = "shared-1";
  for (int i = 0; i < 40; ++i) {
    s.context += "key " + std::to_string(i * 7919 % 1000) + " holds " +
                 std::to_string(i * 104729 % 977) + ". ";
  }
  SampleTurn a, b;
  a.input = "which key holds 7?";
  a.answers = {"key 3 holds it"};
  b.input = "and the first key?";
  b.answers = {"key 0"};
  s.turns = {a, b};
  return s;
}

// Every kind of per-sequence method and the compositions, budgets below the context.
const std::vector<std::string> kSpecs = {
    "full",
    "streamingllm:budget=64",
    "h2o:budget=64",
    "snapkv:budget=64,window=8",
    "pyramidkv:budget=64,window=8",
    "adakv+snapkv:budget=64,window=8",
    "adakv:floor=0.5+pyramidkv:budget=64,window=8",
    "criticalkv:budget=64,window=8",
    "adakv+criticalkv:budget=64,window=8",
    "cake:budget=64,window=8",
    "d2o:budget=64",
    "uncomp:budget=64,window=8",
    "simlayerkv:budget=64,threshold=0.1",
    "lacache:budget=64,span=2",
    "duo_attention:budget=64,sink=4,recent=16",
    "tova:budget=64",
    "knorm:budget=64",
    "keydiff:budget=64",
    "kvmerger:budget=64,window=8",
    "cam:budget=64,window=8",
    "chelsea:budget=64,window=8",
    "kivi:bits=2,residual=32",
    "kivi:bits=4,residual=32,tail=block",
    "quest:budget=32,page=8",
    "snapkv:budget=64,window=8+kivi:bits=2,residual=32",
    "h2o:budget=64+kivi:bits=2,residual=32",
    "quest:budget=32,page=8+kivi:bits=4,residual=32",
    "pca_kv:rank=8",
    "snapkv:budget=64,window=8+pca_kv:rank=8",
    "kvquant_keys:bits=2",
    "snapkv:budget=64,window=8+kvquant_keys:bits=4",
    "h2o:budget=64+kvquant_keys",
    "snapkv:budget=64,window=8+mikv:bits=2",
    "h2o:budget=64+mikv:bits=4",
    "zipcache",
    "zipcache:gap=4",
    "kvzip:budget=64",
    // Other budgets and level: they adopt the first kvzip fork's reconstruction scores.
    "kvzip:budget=32",
    "kvzip:budget=96,level=pair-uniform",
    // A storage method behind: its own reconstruction (its stores, not the dense copies).
    "kvzip:budget=64+kivi:bits=2,residual=32",
};

}  // namespace

TEST_CASE("shared prefill: every dense-prefill method equals a prefill of its own", "[unit]") {
  // Both modes and query settings: query-aware, every request (or the first turn) forks the
  // context and feeds its own query, compressed after it.
  const LlamaModel& model = tiny_model();
  const Sample sample = long_sample();
  for (const auto& [mode, query] :
       {std::pair{SessionMode::MultiTurn, QuerySetting::Agnostic},
        std::pair{SessionMode::MultiRequest, QuerySetting::Agnostic},
        std::pair{SessionMode::MultiTurn, QuerySetting::Aware},
        std::pair{SessionMode::MultiRequest, QuerySetting::Aware}}) {
    SessionOptions options;
    options.mode = mode;
    options.query = query;
    options.max_new_tokens = 5;
    const std::vector<int32_t> context = session_context_tokens(model, sample, options);
    REQUIRE(context.size() > 300);  // several forwards of 64, well above every budget
    std::vector<ResolvedSpec> specs;
    for (const std::string& spec : kSpecs) specs.push_back(resolve_method_spec(spec));
    const SharedPrefill shared(model, context, specs);
    const SessionResult full = run_session(model, sample, "full", options, nullptr);
    for (const ResolvedSpec& spec : specs) {
      INFO(to_string(mode) << " " << to_string(query) << " " << spec.canonical);
      REQUIRE(SharedPrefill::can_share(spec, model));
      const SampleReference reference = reference_of(full);
      const SessionResult own = run_session(model, sample, spec.canonical, options, &reference);
      const SessionResult forked =
          run_session(model, sample, spec.canonical, options, &reference, &shared);
      CHECK(forked.shared_prefill);
      CHECK(forked.prefilled_tokens == 0);
      CHECK(own.prefilled_tokens ==
            static_cast<int64_t>(context.size()) *
                (mode == SessionMode::MultiTurn ? 1 : static_cast<int64_t>(own.turns.size())));
      testing::require_same_turns(own, forked);
    }
    // The three dense kvzip forks (one reconstruction a request: multi-request compresses the
    // context anew for each) ran it once per span, query-aware multi-request having a span per
    // request; the fork with KIVI stores ran its own, not kept.
    const int64_t requests =
        mode == SessionMode::MultiRequest ? static_cast<int64_t>(sample.turns.size()) : 1;
    const int64_t spans = query == QuerySetting::Aware ? requests : 1;
    CHECK(shared.reconstructions_kept() == spans);
    CHECK(shared.reconstructions_adopted() == 3 * requests - spans);
  }
}

TEST_CASE("shared prefill: streamed prefills, reuse methods and query-observing stores prefill on their own", "[unit]") {
  const LlamaModel& model = tiny_model();
  for (const char* spec : {"streamingllm:budget=64,prefill=stream,chunk=32",
                           "keydiff:budget=64,prefill=stream,chunk=16", "prefix",
                           "snapkv:budget=64+prefix", "bf16", "snapkv:budget=64+fp8", "think",
                           "snapkv:budget=64+think"}) {
    INFO(spec);
    CHECK_FALSE(SharedPrefill::can_share(resolve_method_spec(spec), model));
  }
  // evaluate() prefills once for the rest, and counts it.
  EvaluationOptions options;
  options.session.max_new_tokens = 3;
  int units = 0;
  const PrefillCount count =
      evaluate(model, {long_sample()}, {"snapkv:budget=64,window=8", "kivi", "h2o:budget=64",
                                         "streamingllm:budget=64,prefill=stream,chunk=32"},
               options, [&](const UnitResult&) { ++units; });
  CHECK(units == 4);
  CHECK(count.shared_prefills == 1);
  CHECK(count.unit_tokens == count.shared_tokens);  // only the streamed one prefilled again
  options.shared_prefill = false;
  const PrefillCount separate =
      evaluate(model, {long_sample()},
               std::vector<std::string>{"snapkv:budget=64,window=8", "kivi"}, options,
               [](const UnitResult&) {});
  CHECK(separate.shared_prefills == 0);
  CHECK(separate.unit_tokens == 3 * count.shared_tokens);  // full, snapkv, kivi
}

TEST_CASE("prefill=stream is recorded, and its peak is below the dense prefill's", "[unit]") {
  const LlamaModel& model = tiny_model();
  SessionOptions options;
  options.max_new_tokens = 3;
  const SessionResult dense =
      run_session(model, long_sample(), "streamingllm:budget=64", options, nullptr);
  const SessionResult stream = run_session(
      model, long_sample(), "streamingllm:budget=64,prefill=stream,chunk=32", options, nullptr);
  CHECK(dense.prefill == "dense");
  CHECK(stream.prefill == "stream:32");
  // Multi-turn: the prefill's peak is before turn 1; a request (multi-request) holds it in
  // its turn's peak.
  options.mode = SessionMode::MultiRequest;
  const SessionResult dense_request =
      run_session(model, long_sample(), "streamingllm:budget=64", options, nullptr);
  const SessionResult stream_request = run_session(
      model, long_sample(), "streamingllm:budget=64,prefill=stream,chunk=32", options, nullptr);
  CHECK(stream_request.turns[0].kv_bytes_peak < dense_request.turns[0].kv_bytes_peak / 2);
  CHECK(stream_request.turns[0].tokens_kept == dense_request.turns[0].tokens_kept);
}
