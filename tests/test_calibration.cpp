// Calibration files and what a sweep with min_full_accuracy does with them: tasks the full
// cache cannot do are left out with the reason, recorded in the run's config.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "gguf_writer.h"
#include "harness/calibration.h"
#include "common/input_error.h"
#include "harness/sweep.h"

using namespace kvbench;
using Catch::Contains;

namespace {

// Cells: task, length, samples, turns, accuracy, low, high, seconds, prefill seconds, and the
// no-context control's accuracy, low and high.
Calibration two_cells() {
  Calibration c;
  c.model = "qwen2.5-0.5b";
  c.model_sha256 = std::string(64, 'a');
  c.cells.push_back({"retr_kv", 1024, 5, 5, 0.96, 0.80, 0.99, 12.5, 0.0, 0.0, 0.0, 0.13});
  c.cells.push_back({"math_find", 1024, 5, 5, 0.40, 0.23, 0.59, 10.0, 0.0, 0.08, 0.02, 0.25});
  return c;
}

SweepConfig three_tasks(double min_full_accuracy) {
  return parse_sweep_config(
      R"({"tasks": ["retr_kv", "math_find", "multihop_vt"], "methods": ["full", "snapkv"],
          "budgets": ["ratio=0.25"], "context_tokens": 1024, "model": "qwen2.5-0.5b",
          "min_full_accuracy": )" + std::to_string(min_full_accuracy) + "}",
      "cfg.json");
}

}  // namespace

TEST_CASE("calibration: a file round-trips, and put replaces a cell of the same setting",
          "[unit]") {
  const std::string path = testing::temp_path("calibration.json");
  Calibration c = two_cells();
  c.put({"retr_kv", 1024, 2, 3, 0.5, 0.2, 0.8, 1.0});  // same setting: replaced
  c.put({"retr_kv", 2048, 2, 3, 0.9, 0.6, 0.98, 2.0});  // another length: added
  save_calibration(c, path);
  const Calibration back = load_calibration(path);
  CHECK(back.model == "qwen2.5-0.5b");
  CHECK(back.model_sha256 == c.model_sha256);
  REQUIRE(back.cells.size() == 3);
  REQUIRE(back.find("retr_kv", 1024) != nullptr);
  CHECK(back.find("retr_kv", 1024)->accuracy == 0.5);
  CHECK(back.find("retr_kv", 1024)->samples == 2);
  CHECK(back.find("retr_kv", 2048)->high == 0.98);
  CHECK(back.find("retr_kv", 512) == nullptr);
  CHECK_FALSE(back.find("retr_kv", 1024)->has_control());  // put without one
  REQUIRE(back.find("math_find", 1024)->has_control());
  CHECK(back.find("math_find", 1024)->no_context_accuracy == 0.08);
  CHECK(back.find("math_find", 1024)->no_context_high == 0.25);
  std::remove(path.c_str());
}

TEST_CASE("calibration: a malformed or missing file is one line naming it", "[unit]") {
  const std::string path = testing::temp_path("calibration_bad.json");
  { std::ofstream(path) << R"({"model": "x", "cells": []})"; }
  try {
    load_calibration(path);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Contains(path) && Contains("malformed calibration file"));
  }
  std::remove(path.c_str());
  CHECK_THROWS_WITH(load_calibration(path), Contains("cannot read the calibration file"));
}

TEST_CASE("calibration: a sweep leaves out tasks below min_full_accuracy, and says why",
          "[unit]") {
  SweepConfig config = three_tasks(0.8);
  CHECK(config.model == "qwen2.5-0.5b");
  apply_calibration(config, two_cells(), std::string(64, 'a'), "cal.json");
  REQUIRE(config.tasks.size() == 1);
  CHECK(config.tasks[0].name == "retr_kv");
  REQUIRE(config.excluded_tasks.size() == 2);
  CHECK(config.excluded_tasks[0].task == "math_find");
  CHECK_THAT(config.excluded_tasks[0].reason,
             Contains("full cache 40%") && Contains("23%-59%") && Contains("25 turns") &&
                 Contains("at 1024 tokens") && Contains("below 80%"));
  CHECK(config.excluded_tasks[1].task == "multihop_vt");
  CHECK_THAT(config.excluded_tasks[1].reason, Contains("not calibrated at 1024 tokens"));
  // The run's config records what was left out and why.
  const std::string json = canonical_config_json(config);
  CHECK_THAT(json, Contains("\"excluded_tasks\"") && Contains("below 80%") &&
                       Contains("\"min_full_accuracy\":0.8"));

  SweepConfig lower = three_tasks(0.3);  // math_find's 40% now passes
  apply_calibration(lower, two_cells(), std::string(64, 'a'), "cal.json");
  CHECK(lower.tasks.size() == 2);
}

TEST_CASE("calibration: another model file's calibration, or nothing left, is refused",
          "[unit]") {
  SweepConfig config = three_tasks(0.8);
  CHECK_THROWS_WITH(apply_calibration(config, two_cells(), std::string(64, 'b'), "cal.json"),
                    Contains("cal.json: calibrated on another file of qwen2.5-0.5b"));
  SweepConfig strict = three_tasks(0.99);
  CHECK_THROWS_WITH(apply_calibration(strict, two_cells(), std::string(64, 'a'), "cal.json"),
                    Contains("no task of the sweep at 1024 tokens scores 99% or more"));
}

TEST_CASE("calibration: a config's min_full_accuracy must lie in [0, 1]", "[unit]") {
  CHECK_THROWS_WITH(parse_sweep_config(R"({"tasks": ["retr_kv"], "methods": ["full"],
                                           "min_full_accuracy": 80})", "cfg.json"),
                    Contains("min_full_accuracy must be a number in [0, 1]"));
  CHECK_THROWS_WITH(parse_sweep_config(R"({"tasks": ["retr_kv"], "methods": ["full"],
                                           "model": ""})", "cfg.json"),
                    Contains("model must be a short name"));
}

TEST_CASE("calibration: the no-context control keeps out tasks answered without the context",
          "[unit]") {
  Calibration c = two_cells();
  // Known by heart: 36% without the context.
  c.put({"multihop_vt", 1024, 5, 5, 0.92, 0.75, 0.98, 9.0, 0.0, 0.36, 0.2, 0.55});
  SweepConfig config = three_tasks(0.3);
  apply_calibration(config, c, std::string(64, 'a'), "cal.json");
  REQUIRE(config.tasks.size() == 2);  // retr_kv and math_find (8% without the context)
  REQUIRE(config.excluded_tasks.size() == 1);
  CHECK(config.excluded_tasks[0].task == "multihop_vt");
  CHECK_THAT(config.excluded_tasks[0].reason,
             Contains("answered 36% without the context at 1024 tokens") && Contains("above 20%"));
  // The kept ones carry both numbers into the run's config, for the report.
  REQUIRE(config.calibrated_tasks.size() == 2);
  CHECK(config.calibrated_tasks[0].task == "retr_kv");
  CHECK(config.calibrated_tasks[0].accuracy == 0.96);
  CHECK(config.calibrated_tasks[1].no_context_accuracy == 0.08);
  CHECK_THAT(canonical_config_json(config),
             Contains("\"calibrated_tasks\"") && Contains("\"no_context_accuracy\":0.08"));

  // A looser control lets it in; a cell measured before the control never enters.
  SweepConfig loose = parse_sweep_config(
      R"({"tasks": ["multihop_vt"], "methods": ["full"], "context_tokens": 1024,
          "min_full_accuracy": 0.8, "max_no_context_accuracy": 0.4})", "cfg.json");
  apply_calibration(loose, c, std::string(64, 'a'), "cal.json");
  CHECK(loose.tasks.size() == 1);
  CHECK_THAT(canonical_config_json(loose), Contains("\"max_no_context_accuracy\":0.4"));
  c.put({"multihop_vt", 1024, 5, 5, 0.92, 0.75, 0.98, 9.0});
  SweepConfig old = three_tasks(0.8);
  apply_calibration(old, c, std::string(64, 'a'), "cal.json");
  REQUIRE(old.excluded_tasks.size() == 2);
  CHECK_THAT(old.excluded_tasks[1].reason,
             Contains("calibrated at 1024 tokens before the no-context control"));
}

TEST_CASE("calibration: a sweep's time estimate from the cells' timings", "[unit]") {
  const Calibration c = two_cells();  // retr_kv: 12.5 s for 5 x 5 turns at 1024 tokens
  const SweepEstimate e = estimate_sweep({{"retr_kv", 1024, 5, 40, 8},
                                          {"math_find", 1024, 2, 10, 5},
                                          {"retr_kv", 4096, 5, 3, 1},
                                          {"multihop_vt", 1024, 5, 7, 7}},
                                         c);
  // No prefill time recorded: 0.5 s a turn x 5 turns x 40 units + 0.4 s a turn x 2 turns x
  // 10 units.
  CHECK(e.seconds == Approx(100.0 + 8.0));
  CHECK(e.timed_units == 50);
  REQUIRE(e.untimed.size() == 2);
  CHECK(e.untimed[0] == "retr_kv at 4096 tokens");
  CHECK(e.untimed[1] == "multihop_vt at 1024 tokens");
  // With the prefill recorded, a group pays it once for all its units: 7.5 of retr_kv's
  // 12.5 s are prefill, 1.5 s a sample; the rest is 0.2 s a turn.
  Calibration timed = two_cells();
  timed.cells[0].prefill_seconds = 7.5;
  const SweepEstimate shared = estimate_sweep({{"retr_kv", 1024, 5, 40, 8}}, timed);
  CHECK(shared.seconds == Approx(8 * 1.5 + 40 * 5 * 0.2));
  CHECK(shared.timed_units == 40);
  // A unit that prefills its context itself (bf16, a sparse prefill) pays a prefill too.
  const SweepEstimate own = estimate_sweep({{"retr_kv", 1024, 5, 40, 8, 3}}, timed);
  CHECK(own.seconds == Approx((8 + 3) * 1.5 + 40 * 5 * 0.2));
}

TEST_CASE("calibration: every committed calibration file reads", "[unit]") {
  // The sweeps (configs/long.json among them) read these; a check that refused one of them
  // (a Wilson bound at 0% is 1.4e-17, above the 0% it bounds) would stop every such sweep.
  for (const char* model : {"smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"}) {
    INFO(model);
    const std::string path =
        std::string(KVBENCH_FIXTURES) + "/../../configs/calibration/" + model + ".json";
    const Calibration c = load_calibration(path);
    CHECK(c.model == model);
    CHECK_FALSE(c.cells.empty());
  }
}
