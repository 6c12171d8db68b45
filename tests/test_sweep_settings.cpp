// A sweep over query settings and turn gaps: one unit per (mode, setting, gap, method),
// multi-turn at gap 0 only, the settings in the db, and keys where the agnostic, gap-0 unit
// keeps the key it had before either setting existed (so a resumed older sweep skips it).
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <string>

#include "gguf_writer.h"
#include "harness/model/llama_model.h"
#include "harness/sweep.h"
#include "harness/sweep_config.h"
#include "store/results_db.h"

using namespace kvbench;

namespace {

const LlamaModel& settings_model() {
  static const std::unique_ptr<LlamaModel> model = [] {
    testing::TinyLlamaSpec spec;
    spec.context_length = 2048;
    const std::string path = testing::temp_path("tiny_sweep_settings.gguf");
    testing::write_tiny_llama_gguf(path, spec);
    return LlamaModel::load(path);
  }();
  return *model;
}

}  // namespace

TEST_CASE("sweep: query settings and turn gaps are units of their own", "[unit][query_setting]") {
  const SweepConfig c = parse_sweep_config(
      R"({"tasks": ["retr_kv"], "methods": ["full", "prefix:block=16+apc_ttl:ttl=30"],
          "modes": ["multi-turn", "multi-request"], "query_settings": ["agnostic", "aware"],
          "turn_gaps_s": [0, 45], "samples": 1, "turns": 2, "context_tokens": 300,
          "max_new": 3})",
      "cfg.json");
  const std::string path = testing::temp_path("sweep_settings.db");
  auto db = ResultsDb::open(path);
  RunRecord run;
  run.kvbench_version = run.git_sha = run.model_sha256 = run.host = "test";
  run.model_path = "tiny";
  run.command_line = "test_sweep_settings";
  const SweepProgress done = run_sweep(settings_model(), c, Shard{}, *db, run, nullptr);
  // multi-turn: 2 settings; multi-request: 2 settings x 2 gaps; 2 methods each.
  CHECK(done.done == 12);
  std::set<std::string> keys;
  std::string sample;
  for (const UnitRecord& u : db->units()) {
    keys.insert(u.key);
    sample = u.sample_id;
    CHECK((u.query_setting == "agnostic" || u.query_setting == "aware"));
    if (u.mode == "multi-turn") CHECK(u.turn_gap_s == 0);
    if (u.method != "full" && u.mode == "multi-request" && u.turn_gap_s == 45) {
      CHECK(u.turns[1].hits == 0);  // the gap outlived the pin
    } else if (u.method != "full" && u.mode == "multi-request") {
      CHECK(u.turns[1].hits > 0);
    }
  }
  REQUIRE(keys.size() == 12);
  const std::string stem = "retr_kv|" + sample + "|";
  CHECK(keys.count(stem + "multi-turn|full"));  // as before query settings and gaps
  CHECK(keys.count(stem + "multi-turn|full|aware"));
  CHECK(keys.count(stem + "multi-request|full|gap=45"));
  CHECK(keys.count(stem + "multi-request|prefix:block=16+apc_ttl:ttl=30|aware|gap=45"));
  CHECK(!keys.count(stem + "multi-turn|full|gap=45"));
  // Resumed, nothing runs again.
  CHECK(run_sweep(settings_model(), c, Shard{}, *db, run, nullptr).done == 0);
}
