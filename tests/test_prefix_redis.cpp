// Prefix reuse through a real redis-server on loopback (label redis), on the tiny
// random-weight model of test_prefix_cache.cpp: blocks stored to and loaded from Redis give
// the logits of a full prefill; a server killed mid-run, or an address with nothing
// listening, costs the reuse (every block prefilled again) and is reported as a fault,
// never a wrong answer or a crash. Exits 77 (skipped) when redis-server is not installed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "gguf_writer.h"
#include "harness/model/llama_model.h"
#include "harness/session.h"
#include "tests/session_by_text.h"
#include "prefix_requests.h"
#include "reuse/prefix_cache.h"
#include "tests/redis_server.h"

using namespace kvbench;
using testing::RedisServer;

namespace {

using testing::max_difference;
using testing::prompt_tokens;

const LlamaModel& tiny_model() { return testing::prefix_test_model(); }

// One request on a fresh full cache.
std::vector<float> request(PrefixCache& reuse, const std::vector<int32_t>& prompt,
                           ReuseTurn& turn) {
  KvCache cache = make_full_cache(tiny_model().kv_shape());
  return testing::request(reuse, cache, prompt, turn);
}

const TierStats& redis_stats(const std::vector<TierStats>& tiers) {
  REQUIRE(tiers.size() == 2);
  REQUIRE(tiers[1].name == "redis");
  return tiers[1];
}

// A running server for one test case; exits 77 (skipped) when redis-server is not installed.
void start(RedisServer& server) {
  RedisServer::skip_unless_installed();
  REQUIRE(server.start());
}

Sample shared_context_sample() { return testing::shared_context_sample("reuse-redis", 300); }

std::string spec_for(const std::string& address) {
  return "prefix:block=16+tiers:device=1KB,redis=" + address;
}

}  // namespace

TEST_CASE("prefix cache through redis: loaded blocks, then a killed server costs a recompute",
          "[redis]") {
  RedisServer server;
  start(server);
  const LlamaModel& model = tiny_model();
  const std::vector<int32_t> prompt = prompt_tokens(70, 11);
  KvCache reference = make_full_cache(model.kv_shape());
  const std::vector<float> expected = model.forward(prompt, reference);

  ReuseConfig config;
  config.block_tokens = 16;
  config.tiers.device_bytes = 1024;  // smaller than a block: only Redis holds them
  config.tiers.redis = server.address();
  PrefixCache reuse(config, "tiny", model.kv_shape());

  ReuseTurn first;
  CHECK(max_difference(request(reuse, prompt, first), expected) < 1e-4f);
  CHECK(first.tokens_reused == 0);
  CHECK(first.blocks_stored == 4);  // 70 tokens: 4 whole blocks of 16
  {
    const TierStats redis = redis_stats(reuse.tier_stats());
    CHECK(redis.entries == 4);
    CHECK(redis.bytes_in == first.bytes_stored);
    CHECK(redis.faults == 0);
    CHECK(reuse.tier_stats()[0].entries == 0);
  }

  ReuseTurn second;
  CHECK(max_difference(request(reuse, prompt, second), expected) < 1e-4f);
  CHECK(second.tokens_reused == 64);
  CHECK(second.blocks_hit == 4);
  CHECK(second.served_by == "redis");
  CHECK(second.faults.empty());
  CHECK(second.blocks_stored == 0);  // all 4 whole blocks came from Redis
  const TierStats before = redis_stats(reuse.tier_stats());
  CHECK(before.hits == 4);
  CHECK(before.bytes_out == second.bytes_loaded);
  CHECK(before.faults == 0);
  CHECK(before.last_fault.empty());

  server.kill();
  ReuseTurn third;
  CHECK(max_difference(request(reuse, prompt, third), expected) < 1e-4f);  // recomputed
  CHECK(third.tokens_reused == 0);
  CHECK(third.blocks_hit == 0);
  CHECK(third.blocks_missed == 1);
  CHECK(third.served_by.empty());
  CHECK(third.faults.empty());  // PrefixCache reports decode faults only; tiers count theirs
  const TierStats after = redis_stats(reuse.tier_stats());
  CHECK(after.faults > before.faults);
  CHECK_THAT(after.last_fault,
             Catch::Contains(server.address()) && Catch::Contains("unreachable"));
  CHECK(after.hits == before.hits);
  CHECK(after.entries == 0);  // the lost block was dropped; the re-stored ones failed

  // Still no crash and still right on a fourth request, with the server gone for good.
  ReuseTurn fourth;
  CHECK(max_difference(request(reuse, prompt, fourth), expected) < 1e-4f);
  CHECK(fourth.tokens_reused == 0);
}

TEST_CASE("session through redis: nothing listening costs the reuse, a live server serves it",
          "[redis]") {
  const LlamaModel& model = tiny_model();
  const Sample sample = shared_context_sample();
  const SessionOptions options = testing::multi_request_options();
  const SessionResult full = run_session(model, sample, "full", options, nullptr);
  const SampleReference reference = reference_of(full);

  // A port a server just listened on and no longer does.
  std::string dead_address;
  {
    RedisServer server;
    start(server);
    dead_address = server.address();
    server.kill();
  }
  const SessionResult dead =
      run_session(model, sample, spec_for(dead_address), options, &reference);
  REQUIRE(dead.turns.size() == 3);
  for (size_t t = 0; t < 3; ++t) {
    INFO("nothing listening, turn " << t + 1);
    const TurnRecord& r = dead.turns[t];
    CHECK(r.reuse.tokens_reused == 0);
    CHECK(r.reuse.blocks_hit == 0);
    CHECK(r.reuse.blocks_stored > 0);  // tried: every put fails
    CHECK_THAT(r.reuse.faults, Catch::Contains("redis") && Catch::Contains(dead_address) &&
                                   Catch::Contains("unreachable"));
    CHECK(r.prediction == full.turns[t].prediction);
    CHECK(r.first_token_kl < 1e-6);
    CHECK(r.top1_agreement == 1.0);
    REQUIRE(r.reuse_tiers.size() == 2);
    CHECK(r.reuse_tiers[1].name == "redis");
    CHECK(r.reuse_tiers[1].entries == 0);
    CHECK(r.reuse_tiers[1].faults > 0);
  }

  RedisServer server;
  start(server);
  const SessionResult live = run_session(model, sample, spec_for(server.address()), options,
                                         &reference);
  REQUIRE(live.turns.size() == 3);
  const int64_t context_blocks = live.context_tokens / 16;
  REQUIRE(context_blocks >= 2);
  for (size_t t = 0; t < 3; ++t) {
    INFO("live server, turn " << t + 1);
    const TurnRecord& r = live.turns[t];
    CHECK(r.reuse.faults.empty());
    CHECK(r.reuse.tokens_reused == (t == 0 ? 0 : context_blocks * 16));
    CHECK(r.reuse.served_by == (t == 0 ? "" : "redis"));
    CHECK(r.prediction == full.turns[t].prediction);
    CHECK(r.first_token_kl < 1e-6);
    CHECK(r.top1_agreement == 1.0);
    REQUIRE(r.reuse_tiers.size() == 2);
    CHECK(r.reuse_tiers[0].entries == 0);  // 1 KB holds no block
    CHECK(r.reuse_tiers[1].faults == 0);
  }
}
