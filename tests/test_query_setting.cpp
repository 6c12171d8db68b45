// Query-aware compression: with QuerySetting::Aware the first turn's query is inside the
// span the eviction method compresses (in multi-request, each request's), so the tokens
// kept after the first turn are the budget alone; agnostic is as before. Exact counts on a
// tiny random-weight model, the shared prefill's fork against a prefill of its own, and the
// refusals of the option in specs and sweep configs.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/session.h"
#include "tests/session_by_text.h"
#include "harness/shared_prefill.h"
#include "harness/sweep_config.h"
#include "prefix_requests.h"

using namespace kvbench;

namespace {

Sample aware_sample() { return testing::shared_context_sample("aware-1", 240, 'c'); }

SessionOptions with_query(SessionMode mode, QuerySetting query) {
  SessionOptions options = testing::multi_request_options();
  options.mode = mode;
  options.query = query;
  return options;
}

}  // namespace

TEST_CASE("query setting: names parse, anything else is one InputError naming it",
          "[unit][query_setting]") {
  CHECK(parse_query_setting("agnostic") == QuerySetting::Agnostic);
  CHECK(parse_query_setting("aware") == QuerySetting::Aware);
  CHECK(std::string(to_string(QuerySetting::Aware)) == "aware");
  CHECK_THROWS_WITH(parse_query_setting("sideways"), Catch::Contains("'sideways'"));
  CHECK(SessionOptions{}.query == QuerySetting::Agnostic);
}

TEST_CASE("query setting: the compressed span ends with the first query when aware",
          "[unit][query_setting]") {
  const LlamaModel& model = testing::prefix_test_model();
  const Sample sample = aware_sample();
  for (SessionMode mode : {SessionMode::MultiTurn, SessionMode::MultiRequest}) {
    INFO(to_string(mode));
    const SessionOptions agnostic = with_query(mode, QuerySetting::Agnostic);
    const SessionOptions aware = with_query(mode, QuerySetting::Aware);
    // The shared prefill holds the context alone in both settings (aware, each query is fed
    // after it).
    const std::vector<int32_t> context = session_context_tokens(model, sample, agnostic);
    CHECK(session_context_tokens(model, sample, aware) == context);

    const std::string method = "snapkv:budget=48";
    const SessionResult before = run_session(model, sample, method, agnostic, nullptr);
    const SessionResult after = run_session(model, sample, method, aware, nullptr);
    REQUIRE(before.context_tokens > 48);
    const TurnRecord& a = before.turns[0];
    const TurnRecord& b = after.turns[0];
    const int64_t n_context = static_cast<int64_t>(context.size());
    const int64_t query_1 = mode == SessionMode::MultiTurn ? a.prompt_tokens
                                                           : a.prompt_tokens - n_context;
    REQUIRE(query_1 > 0);
    // Agnostic: the budget, then the query and the answer on top. Aware: the query went
    // into the budget, so exactly its tokens fewer are held.
    CHECK(a.tokens_kept == 48 + query_1 + a.appended_tokens);
    CHECK(b.tokens_kept == 48 + b.appended_tokens);
    CHECK(b.appended_tokens == a.appended_tokens);
    CHECK(b.prompt_tokens == n_context + query_1);
    if (mode == SessionMode::MultiTurn) {
      CHECK(a.prompt_tokens == query_1);
      CHECK(after.context_prefill_ms == 0);  // nothing ran before the first query
      // Later turns append to the compressed cache as before: one query and answer each.
      for (size_t t = 1; t < after.turns.size(); ++t) {
        CHECK(after.turns[t].tokens_kept - after.turns[t - 1].tokens_kept ==
              before.turns[t].tokens_kept - before.turns[t - 1].tokens_kept);
      }
    } else {
      // Every request is its conversation's first: its own query compressed with the context.
      for (size_t t = 0; t < after.turns.size(); ++t) {
        INFO("request " << t + 1);
        const int64_t query_t = before.turns[t].prompt_tokens - before.context_tokens;
        CHECK(after.turns[t].tokens_kept == before.turns[t].tokens_kept - query_t);
        CHECK(after.turns[t].prompt_tokens == before.turns[t].prompt_tokens);
      }
    }
  }
}

TEST_CASE("query setting: an aware unit forked from the shared prefill equals its own",
          "[unit][query_setting]") {
  const LlamaModel& model = testing::prefix_test_model();
  const Sample sample = aware_sample();
  const std::string method = resolve_method_spec("snapkv:budget=48").canonical;
  for (SessionMode mode : {SessionMode::MultiTurn, SessionMode::MultiRequest}) {
    INFO(to_string(mode));
    const SessionOptions aware = with_query(mode, QuerySetting::Aware);
    const SharedPrefill shared(model, session_context_tokens(model, sample, aware),
                               {resolve_method_spec(method)});
    REQUIRE(shared.serves(method));
    const SessionResult own = run_session(model, sample, method, aware, nullptr);
    const SessionResult forked = run_session(model, sample, method, aware, nullptr, &shared);
    CHECK(forked.shared_prefill);
    // Multi-request: every request forks the context (before, the first alone did).
    CHECK(forked.prefilled_tokens == 0);
    REQUIRE(forked.turns.size() == own.turns.size());
    for (size_t t = 0; t < own.turns.size(); ++t) {
      INFO("turn " << t + 1);
      CHECK(forked.turns[t].prediction == own.turns[t].prediction);
      CHECK(forked.turns[t].own.first_logprobs == own.turns[t].own.first_logprobs);
      CHECK(forked.turns[t].own.top1 == own.turns[t].own.top1);
      CHECK(forked.turns[t].tokens_kept == own.turns[t].tokens_kept);
      CHECK(forked.turns[t].kv_bytes == own.turns[t].kv_bytes);
    }
  }
}

TEST_CASE("query setting: refusals in specs and sweep configs", "[unit][query_setting]") {
  const LlamaModel& model = testing::prefix_test_model();
  const Sample sample = aware_sample();
  const SessionOptions aware = with_query(SessionMode::MultiRequest, QuerySetting::Aware);
  // A compressed context reused whole cannot hold each request's query.
  CHECK_THROWS_AS(run_session(model, sample, "snapkv:budget=48+prefix", aware, nullptr),
                  InputError);
  // Prefix blocks with no eviction compose: the end of the context moves past the query.
  const SessionResult blocks = run_session(model, sample, "prefix:block=16", aware, nullptr);
  CHECK(blocks.turns[1].reuse.tokens_reused == blocks.context_tokens / 16 * 16);
  CHECK_NOTHROW(check_query_setting(resolve_method_spec("snapkv+prefix"), QuerySetting::Agnostic));

  const std::string head = R"({"tasks": ["retr_kv"], "methods": ["snapkv"], )";
  const SweepConfig both =
      parse_sweep_config(head + R"("query_settings": ["agnostic", "aware"], "turn_gaps_s": [0, 45.5]})",
                         "c.json");
  CHECK(both.query_settings == std::vector<std::string>{"agnostic", "aware"});
  CHECK(both.turn_gaps_s == std::vector<double>{0, 45.5});
  CHECK(canonical_config_json(both).find("\"query_settings\"") != std::string::npos);
  const SweepConfig plain = parse_sweep_config(head + R"("modes": ["multi-turn"]})", "c.json");
  CHECK(plain.query_settings == std::vector<std::string>{"agnostic"});
  CHECK(plain.turn_gaps_s == std::vector<double>{0});
  // At their defaults they stay out of the canonical config, which merge compares.
  CHECK(canonical_config_json(plain).find("query_settings") == std::string::npos);
  CHECK(canonical_config_json(plain).find("turn_gaps_s") == std::string::npos);
  CHECK_THROWS_WITH(parse_sweep_config(head + R"("query_settings": ["sideways"]})", "c.json"),
                    Catch::Contains("c.json") && Catch::Contains("query_settings") &&
                        Catch::Contains("sideways"));
  CHECK_THROWS_WITH(parse_sweep_config(head + R"("query_settings": "aware"})", "c.json"),
                    Catch::Contains("query_settings"));
  CHECK_THROWS_WITH(parse_sweep_config(head + R"("turn_gaps_s": [-1]})", "c.json"),
                    Catch::Contains("turn_gaps_s"));
  CHECK_THROWS_WITH(parse_sweep_config(head + R"("turn_gaps_s": ["10"]})", "c.json"),
                    Catch::Contains("turn_gaps_s"));
  CHECK_THROWS_WITH(
      parse_sweep_config(R"({"tasks": ["retr_kv"], "methods": ["snapkv+prefix"],
                             "query_settings": ["aware"]})",
                         "c.json"),
      Catch::Contains("c.json") && Catch::Contains("aware"));
}
