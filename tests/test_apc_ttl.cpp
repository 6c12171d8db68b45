// apc_ttl (Continuum's KV pinned for a time-to-live between requests) on the simulated
// clock: the device tier's pins renewed by use and freed when they run out, and the
// session's multi-request mode with turn gaps below and above the ttl, in exact counts.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/session.h"
#include "tests/session_by_text.h"
#include "prefix_requests.h"
#include "reuse/tiered_store.h"

using namespace kvbench;

namespace {

SharedBytes bytes_of(size_t n, uint8_t fill) { return std::make_shared<const Bytes>(n, fill); }

SessionOptions gapped(double gap_s) {
  SessionOptions options = testing::multi_request_options();
  options.turn_gap_s = gap_s;
  return options;
}

}  // namespace

TEST_CASE("apc_ttl: a pin lasts ttl after its last use, then its bytes are freed",
          "[unit][apc_ttl]") {
  double now = 0;
  TierConfig config;
  config.device_bytes = 10000;
  config.pin_ttl_s = 30;
  TieredStore store(config, [&] { return now; });
  store.put("a", bytes_of(100, 1));
  store.put("b", bytes_of(200, 2));
  now = 20;
  std::string from;
  CHECK(store.get("a", &from));  // a hit renews a's pin to 50; b's runs out at 30
  CHECK(from == "device");
  now = 40;
  store.expire();
  std::vector<TierStats> stats = store.stats();
  CHECK(stats[0].entries == 1);
  CHECK(stats[0].bytes_resident == 100);
  CHECK(stats[0].evictions == 1);
  CHECK(store.get("b") == nullptr);
  CHECK(store.get("a"));  // renewed again: to 70
  now = 70;  // a gap equal to the ttl expires
  CHECK(store.get("a") == nullptr);
  stats = store.stats();
  CHECK(stats[0].entries == 0);
  CHECK(stats[0].bytes_resident == 0);
  CHECK(stats[0].evictions == 2);
}

TEST_CASE("apc_ttl: an expired pin is still served by a lower tier, and pinned again",
          "[unit][apc_ttl]") {
  double now = 0;
  TierConfig config;
  config.device_bytes = 10000;
  config.cpu_bytes = 10000;
  config.pin_ttl_s = 30;  // the cpu tier keeps its lru
  TieredStore store(config, [&] { return now; });
  store.put("a", bytes_of(100, 1));
  now = 100;
  std::string from;
  CHECK(store.get("a", &from));
  CHECK(from == "cpu");
  const std::vector<TierStats> stats = store.stats();
  CHECK(stats[0].evictions == 1);
  CHECK(stats[0].entries == 1);  // copied back up, pinned from 100
  CHECK(store.get("a", &from));
  CHECK(from == "device");
}

TEST_CASE("apc_ttl: spec composition and refusals", "[unit][apc_ttl]") {
  CHECK(resolve_method_spec("prefix:block=16+apc_ttl:ttl=30").canonical ==
        "prefix:block=16+apc_ttl:ttl=30");
  const std::string with_tiers = resolve_method_spec("prefix+tiers:cpu=1GB+apc_ttl").canonical;
  CHECK(with_tiers.rfind("prefix:block=256+tiers:", 0) == 0);
  CHECK(with_tiers.find("+apc_ttl:ttl=30") != std::string::npos);
  REQUIRE_THROWS_AS(resolve_method_spec("apc_ttl:ttl=30"), InputError);
  REQUIRE_THROWS_AS(resolve_method_spec("snapkv+apc_ttl"), InputError);
  REQUIRE_THROWS_AS(resolve_method_spec("prefix+apc_ttl:ttl=0"), InputError);
  REQUIRE_THROWS_AS(resolve_method_spec("prefix+apc_ttl:ttl=-5"), InputError);
  REQUIRE_THROWS_WITH(resolve_method_spec("prefix+apc_ttl+apc_ttl"),
                      Catch::Contains("at most one pinning"));
  const auto config = prefix_reuse_config(resolve_method_spec("prefix:block=16+apc_ttl:ttl=12.5"));
  REQUIRE(config);
  CHECK(config->tiers.pin_ttl_s == 12.5);
  CHECK(prefix_reuse_config(resolve_method_spec("prefix"))->tiers.pin_ttl_s == 0);
}

TEST_CASE("apc_ttl: in a session, a gap below the ttl hits and one above misses",
          "[unit][apc_ttl]") {
  const LlamaModel& model = testing::prefix_test_model();
  const Sample sample = testing::shared_context_sample("ttl-1", 300);
  const std::string method = "prefix:block=16+apc_ttl:ttl=30";

  const SessionResult hits = run_session(model, sample, method, gapped(10), nullptr);
  REQUIRE(hits.turns.size() == 3);
  const int64_t context_blocks = hits.context_tokens / 16;
  REQUIRE(context_blocks >= 2);
  for (size_t t = 1; t < 3; ++t) {
    INFO("turn " << t + 1);
    CHECK(hits.turns[t].reuse.tokens_reused == context_blocks * 16);
    CHECK(hits.turns[t].reuse.blocks_hit == context_blocks);
    CHECK(hits.turns[t].reuse_tiers[0].evictions == 0);
  }

  const SessionResult misses = run_session(model, sample, method, gapped(45), nullptr);
  REQUIRE(misses.turns.size() == 3);
  for (size_t t = 0; t < 3; ++t) {
    INFO("turn " << t + 1);
    const TurnRecord& r = misses.turns[t];
    CHECK(r.reuse.tokens_reused == 0);
    CHECK(r.reuse.blocks_hit == 0);
    CHECK(r.reuse.blocks_missed == 1);
    CHECK(r.reuse.blocks_stored == r.prompt_tokens / 16);
    // Everything the request before stored ran out and was freed before this lookup:
    // what is resident is this request's blocks alone.
    CHECK(r.reuse_tiers[0].bytes_resident == r.reuse.bytes_stored);
    CHECK(r.reuse_tiers[0].entries == r.reuse.blocks_stored);
    int64_t stored_before = 0;
    for (size_t u = 0; u < t; ++u) stored_before += misses.turns[u].reuse.blocks_stored;
    CHECK(r.reuse_tiers[0].evictions == stored_before);
    // The same answers as a run that recomputes everything: only the cost moved.
    CHECK(r.prediction == hits.turns[t].prediction);
  }
}

TEST_CASE("apc_ttl: a hit renews the pin, which tiers' ttl (from the put) does not",
          "[unit][apc_ttl]") {
  const LlamaModel& model = testing::prefix_test_model();
  const Sample sample = testing::shared_context_sample("ttl-2", 300);
  // Requests at 0, 20 and 40 simulated seconds.
  const SessionResult pinned =
      run_session(model, sample, "prefix:block=16+apc_ttl:ttl=30", gapped(20), nullptr);
  const SessionResult from_put =
      run_session(model, sample, "prefix:block=16+tiers:policy=ttl,ttl=30", gapped(20), nullptr);
  const int64_t context = pinned.context_tokens / 16 * 16;
  CHECK(pinned.turns[1].reuse.tokens_reused == context);
  CHECK(pinned.turns[2].reuse.tokens_reused == context);  // renewed at 20, alive until 50
  CHECK(from_put.turns[1].reuse.tokens_reused == context);
  CHECK(from_put.turns[2].reuse.tokens_reused == 0);      // put at 0, gone at 30
  // No gap: back to back, as before turn gaps existed.
  const SessionResult no_gap =
      run_session(model, sample, "prefix:block=16+apc_ttl:ttl=30", gapped(0), nullptr);
  CHECK(no_gap.turns[2].reuse.tokens_reused == context);
  REQUIRE_THROWS_AS(run_session(model, sample, "prefix:block=16", gapped(-1), nullptr),
                    InputError);
}

TEST_CASE("apc_ttl: an eviction method's compressed context is pinned whole",
          "[unit][apc_ttl]") {
  const LlamaModel& model = testing::prefix_test_model();
  const Sample sample = testing::shared_context_sample("ttl-3", 200, 'b');
  const std::string method = "snapkv:budget=48+prefix+apc_ttl:ttl=30";
  const SessionResult kept = run_session(model, sample, method, gapped(29), nullptr);
  const SessionResult expired = run_session(model, sample, method, gapped(31), nullptr);
  for (size_t t = 1; t < 3; ++t) {
    INFO("turn " << t + 1);
    CHECK(kept.turns[t].cache.hits == 1);
    CHECK(kept.turns[t].reuse.blocks_stored == 0);
    CHECK(expired.turns[t].cache.hits == 0);
    CHECK(expired.turns[t].reuse.blocks_stored == 1);
    CHECK(expired.turns[t].reuse_tiers[0].evictions == static_cast<int64_t>(t));
    CHECK(expired.turns[t].reuse_tiers[0].entries == 1);
    CHECK(expired.turns[t].prediction == kept.turns[t].prediction);
  }
}
