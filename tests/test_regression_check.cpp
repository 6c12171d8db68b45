// The CI gate's comparison: each metric flagged past its tolerance and not within it, a
// baseline row missing from the db flagged, the baseline file round-tripped.
#include <catch2/catch.hpp>

#include "common/input_error.h"
#include "reports/regression_check.h"

using namespace kvbench;

namespace {

// A row whose accuracy is over `turns` binary turns, with its Wilson interval.
Aggregate row(const std::string& method, double accuracy, double top1, double kv, double tps,
              double ttft, int64_t turns = 20) {
  Aggregate a;
  a.method = method;
  a.task = "retr_kv";
  a.mode = "multi-turn";
  a.budget = method == "full" ? "" : "budget=128";
  a.accuracy = accuracy;
  a.accuracy_ci = wilson_interval(static_cast<int64_t>(accuracy * turns + 0.5), turns);
  a.top1_agreement = top1;
  a.kv_bytes = kv;
  a.decode_tokens_per_s = tps;
  a.ttft_ms = ttft;
  return a;
}

std::vector<std::string> metrics(const std::vector<Regression>& rs) {
  std::vector<std::string> out;
  for (const Regression& r : rs) out.push_back(r.metric);
  return out;
}

}  // namespace

TEST_CASE("check: within tolerance passes, past it fails, per metric", "[unit]") {
  const std::vector<Aggregate> base = {row("snapkv", 0.6, 0.9, 1000, 50, 200)};
  const Tolerances tol;  // accuracy 0 (below the interval), fidelity 0.05, memory 0.05, speed 0.3
  CHECK(find_regressions({row("snapkv", 0.56, 0.86, 1049, 36, 259)}, base, tol).empty());
  // Accuracy is compared by 95% intervals: 12/20 -> 8/20 overlaps (not a regression),
  // 12/20 -> 2/20 lies wholly below the baseline's interval (a regression).
  CHECK(find_regressions({row("snapkv", 0.4, 0.9, 1000, 50, 200)}, base, tol).empty());
  CHECK(metrics(find_regressions({row("snapkv", 0.1, 0.9, 1000, 50, 200)}, base, tol)) ==
        std::vector<std::string>{"accuracy"});
  const auto collapse = find_regressions({row("snapkv", 0.1, 0.9, 1000, 50, 200)}, base, tol);
  CHECK(collapse[0].current == Approx(wilson_interval(2, 20).high));
  CHECK(collapse[0].limit == Approx(wilson_interval(12, 20).low));
  // A tolerance widens the gap allowed: 2/20 passes 0.1 below 12/20's interval.
  Tolerances loose;
  loose.accuracy = 0.1;
  CHECK(find_regressions({row("snapkv", 0.1, 0.9, 1000, 50, 200)}, base, loose).empty());
  CHECK(render_regressions(collapse, 1).find("top of the db's 95% interval") != std::string::npos);
  CHECK(metrics(find_regressions({row("snapkv", 0.6, 0.8, 1000, 50, 200)}, base, tol)) ==
        std::vector<std::string>{"top-1"});
  CHECK(metrics(find_regressions({row("snapkv", 0.6, 0.9, 1051, 50, 200)}, base, tol)) ==
        std::vector<std::string>{"KV bytes"});
  CHECK(metrics(find_regressions({row("snapkv", 0.6, 0.9, 1000, 34, 261)}, base, tol)) ==
        std::vector<std::string>{"decode tok/s", "TTFT ms"});
  // Better is never a regression.
  CHECK(find_regressions({row("snapkv", 1.0, 1.0, 10, 500, 2)}, base, tol).empty());
  // A row of the baseline that the db lacks.
  const auto missing = find_regressions({row("h2o", 0.6, 0.9, 1000, 50, 200)}, base, tol);
  REQUIRE(missing.size() == 1);
  CHECK(missing[0].metric == "missing");
  CHECK(missing[0].method == "snapkv");
  const std::string table = render_regressions(missing, base.size());
  CHECK(table.find("1 regression in 1 baseline rows") != std::string::npos);
  CHECK(render_regressions({}, 3).find("no regressions in 3 baseline rows") != std::string::npos);
}

TEST_CASE("check: one flipped answer in a 10-turn cell is not a regression, a collapse is",
          "[unit]") {
  const std::vector<Aggregate> base = {row("snapkv", 0.9, 0.9, 1000, 50, 200, 10)};
  const Tolerances tol;
  CHECK(find_regressions({row("snapkv", 0.8, 0.9, 1000, 50, 200, 10)}, base, tol).empty());
  CHECK(find_regressions({row("snapkv", 0.7, 0.9, 1000, 50, 200, 10)}, base, tol).empty());
  CHECK(metrics(find_regressions({row("snapkv", 0.1, 0.9, 1000, 50, 200, 10)}, base, tol)) ==
        std::vector<std::string>{"accuracy"});
  // 6-turn cells (the smoke sweep's): 6/6 -> 1/6 is flagged, 6/6 -> 2/6 is not.
  const std::vector<Aggregate> six = {row("snapkv", 1.0, 0.9, 1000, 50, 200, 6)};
  CHECK(find_regressions({row("snapkv", 2.0 / 6, 0.9, 1000, 50, 200, 6)}, six, tol).empty());
  CHECK(metrics(find_regressions({row("snapkv", 1.0 / 6, 0.9, 1000, 50, 200, 6)}, six, tol)) ==
        std::vector<std::string>{"accuracy"});
}

TEST_CASE("check: tolerances parse, bad ones are named", "[unit]") {
  const Tolerances t = parse_tolerances("accuracy=0.1,speed=0.25");
  CHECK(t.accuracy == 0.1);
  CHECK(t.speed == 0.25);
  CHECK(t.memory == 0.05);
  CHECK_THROWS_WITH(parse_tolerances("accuracy=-1"),
                    Catch::Contains("accuracy must be a decimal number in [0, 1e6]"));
  // stod reads these; a tolerance does not.
  for (const char* bad : {"accuracy=inf", "accuracy=nan", "accuracy=0x10", "speed=1e300"}) {
    CHECK_THROWS_WITH(parse_tolerances(bad), Catch::Contains("must be a decimal number"));
  }
  CHECK_THROWS_WITH(parse_tolerances("colour=1"), Catch::Contains("unknown metric 'colour'"));
  CHECK_THROWS_WITH(parse_tolerances("speed"), Catch::Contains("has no value"));
}

TEST_CASE("check: the baseline file round-trips, a bad one is named", "[unit]") {
  std::vector<Aggregate> rows = {row("full", 0.8, 1.0, 5000, 40, 150), row("snapkv", 0.6, 0.9, 1000, 50, 120)};
  rows[1].accuracy.reset();  // an unscored task
  const auto back = parse_baseline(baseline_json(rows), "b.json");
  REQUIRE(back.size() == 2);
  CHECK(back[0].method == "full");
  CHECK(back[0].budget.empty());
  CHECK(*back[0].accuracy == 0.8);
  CHECK(back[0].accuracy_ci->low == Approx(rows[0].accuracy_ci->low));
  CHECK(back[0].accuracy_ci->high == Approx(rows[0].accuracy_ci->high));
  CHECK(back[0].accuracy_ci->n == 20);
  CHECK_FALSE(back[1].accuracy);
  CHECK(back[1].kv_bytes == 1000);
  CHECK(find_regressions(rows, back, Tolerances{}).empty());
  CHECK_THROWS_WITH(parse_baseline("{", "b.json"), Catch::Contains("b.json: malformed JSON"));
  CHECK_THROWS_WITH(parse_baseline("{\"rows\": []}", "b.json"), Catch::Contains("not a kvbench baseline"));
  // A gate against nothing passed every run.
  CHECK_THROWS_WITH(parse_baseline(R"({"kvbench_baseline": 1, "rows": []})", "b.json"),
                    Catch::Contains("b.json: the baseline has no rows"));
  CHECK_THROWS_WITH(parse_baseline(R"({"kvbench_baseline": 1, "rows": [{"method": "x"}]})", "b.json"),
                    Catch::Contains("b.json: rows[0]: missing or mistyped field"));
  CHECK_THROWS_WITH(
      parse_baseline(R"({"kvbench_baseline": 1, "rows": [{"method": "x", "task": "t", "mode": "m",
                       "budget": "", "kv_bytes": 1, "decode_tokens_per_s": 1, "ttft_ms": 1,
                       "accuracy": 0.5, "top1_agreement": null}]})", "b.json"),
      Catch::Contains("b.json: rows[0]: has no accuracy interval"));
}

TEST_CASE("check: speed is gated after scaling by the median speed change of the db's rows",
          "[unit]") {
  const std::vector<Aggregate> base = {row("full", 0.6, 1.0, 2000, 40, 300),
                                       row("snapkv", 0.6, 0.9, 1000, 50, 200),
                                       row("h2o", 0.6, 0.9, 1000, 45, 250)};
  Tolerances tol;
  tol.speed = 0.5;
  // A machine 1.4 x slower, snapkv slowed a little more than the rest: no regression, though
  // its 350 ms and 24 tok/s are past 1.5 x its baseline's 200 ms and 0.5 x its 50.
  CHECK(find_regressions({row("full", 0.6, 1.0, 2000, 28.6, 420),
                          row("snapkv", 0.6, 0.9, 1000, 24, 350),
                          row("h2o", 0.6, 0.9, 1000, 32, 350)},
                         base, tol)
            .empty());
  // The same machine, snapkv alone slower: past 1.5 x (and 0.5 x) of what the others keep.
  const auto slower = find_regressions({row("full", 0.6, 1.0, 2000, 40, 300),
                                        row("snapkv", 0.6, 0.9, 1000, 24, 301),
                                        row("h2o", 0.6, 0.9, 1000, 45, 250)},
                                       base, tol);
  CHECK(metrics(slower) == std::vector<std::string>{"decode tok/s", "TTFT ms"});
  // A faster machine on which snapkv did not speed up with the others: its limit scales down.
  const auto lagging = find_regressions({row("full", 0.6, 1.0, 2000, 80, 150),
                                         row("snapkv", 0.6, 0.9, 1000, 50, 200),
                                         row("h2o", 0.6, 0.9, 1000, 90, 125)},
                                        base, tol);
  REQUIRE(metrics(lagging) == std::vector<std::string>{"TTFT ms"});
  CHECK(lagging[0].limit == Approx(200 * 0.5 * 1.5));
  // One row five times slower is that row's regression alone: the median does not follow it.
  const auto noisy = find_regressions({row("full", 0.6, 1.0, 2000, 40, 1500),
                                       row("snapkv", 0.6, 0.9, 1000, 50, 290),
                                       row("h2o", 0.6, 0.9, 1000, 45, 250)},
                                      base, tol);
  REQUIRE(noisy.size() == 1);
  CHECK(noisy[0].method == "full");
}

TEST_CASE("check: the speed margins name the row that slowed most beside the others",
          "[unit]") {
  const std::vector<Aggregate> base = {row("full", 0.6, 1.0, 2000, 40, 300),
                                       row("snapkv", 0.6, 0.9, 1000, 50, 200),
                                       row("h2o", 0.6, 0.9, 1000, 45, 250)};
  // A machine twice as slow; snapkv's TTFT 10% worse than that, h2o's decode 20% worse.
  const auto m = speed_margins({row("full", 0.6, 1.0, 2000, 20, 600),
                                row("snapkv", 0.6, 0.9, 1000, 25, 440),
                                row("h2o", 0.6, 0.9, 1000, 18, 500)},
                               base);
  REQUIRE(m.ttft);
  CHECK(m.ttft->method == "snapkv");
  CHECK(m.ttft->ratio == Approx(1.1));
  REQUIRE(m.decode);
  CHECK(m.decode->method == "h2o");
  CHECK(m.decode->ratio == Approx(0.8));
  const std::string text = render_speed_margins(m, Tolerances{});
  CHECK_THAT(text, Catch::Contains("worst TTFT beside the run's others: 1.10x its baseline "
                                   "(limit 1.30x), snapkv"));
  CHECK_THAT(text, Catch::Contains("worst decode tok/s beside the run's others: 0.80x its "
                                   "baseline (limit 0.70x), h2o"));
  CHECK_FALSE(speed_margins({}, base).ttft);
}

TEST_CASE("check: by default a method 30% slower beside the others fails, on any machine",
          "[unit]") {
  const std::vector<Aggregate> base = {row("full", 0.6, 1.0, 2000, 40, 300),
                                       row("snapkv", 0.6, 0.9, 1000, 50, 200),
                                       row("h2o", 0.6, 0.9, 1000, 45, 250),
                                       row("quest", 0.6, 0.9, 1000, 42, 280)};
  // `factor` the machine's speed (2: twice as fast), snapkv's TTFT x `ttft` and tok/s x `tps`
  // beside that.
  const auto run = [&](double factor, double ttft, double tps) {
    return find_regressions({row("full", 0.6, 1.0, 2000, 40 * factor, 300 / factor),
                             row("snapkv", 0.6, 0.9, 1000, 50 * factor * tps, 200 / factor * ttft),
                             row("h2o", 0.6, 0.9, 1000, 45 * factor, 250 / factor),
                             row("quest", 0.6, 0.9, 1000, 42 * factor, 280 / factor)},
                            base, Tolerances{});
  };
  for (const double factor : {0.4, 1.0, 2.3}) {
    INFO("machine speed x" << factor);
    // Within what an unchanged tree moved on a quiet machine (1.22x TTFT, 0.85x tok/s).
    CHECK(run(factor, 1.22, 0.85).empty());
    CHECK(metrics(run(factor, 1.31, 1.0)) == std::vector<std::string>{"TTFT ms"});
    CHECK(metrics(run(factor, 1.0, 0.69)) == std::vector<std::string>{"decode tok/s"});
  }
}
