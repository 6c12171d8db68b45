// The CI gate: a results db's aggregates against a baseline written from an earlier db,
// per (method, task, mode, budget). A regression is an accuracy whose 95% interval lies
// wholly below the baseline's (less a tolerance), top-1 agreement lower, KV memory higher,
// or decode speed / TTFT worse than the baseline by more than a tolerance, or a baseline
// row the db does not have. Speed is compared after scaling the baseline by how fast this
// db's machine ran, the median over a task and mode's rows of db / baseline (a machine twice
// as fast halves every TTFT, so the gate asks whether a method got slower beside the others;
// with fewer than three rows, as measured).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "reports/aggregate.h"

namespace kvbench {

struct Tolerances {
  double accuracy = 0.0;   // absolute gap below the baseline's interval, in [0, 1]: the
                           // intervals already absorb sampling noise
  double fidelity = 0.05;  // absolute drop of top-1 agreement
  double memory = 0.05;    // relative growth of mean KV bytes
  double speed = 0.3;      // relative loss of decode tok/s, and growth of TTFT, beside the
                           // run's other rows: an unchanged tree moved up to 1.22x (TTFT)
                           // and 0.85x (tok/s) on a quiet 2-core machine (docs/ci.md)
};

// "accuracy=0.1,speed=0.3": any subset, values >= 0. InputError naming the text otherwise.
Tolerances parse_tolerances(const std::string& text);

// The baseline file: {"kvbench_baseline": 1, "rows": [{method, task, mode, budget, accuracy,
// accuracy_low, accuracy_high, scored_turns, top1_agreement, kv_bytes, decode_tokens_per_s,
// ttft_ms}, ...]} (pretty-printed, stable order, so a diff of a committed baseline reads
// well). A row with an accuracy and no interval (an older baseline) is refused.
std::string baseline_json(const std::vector<Aggregate>& rows);
// InputError naming `source` for malformed JSON or a missing field.
std::vector<Aggregate> parse_baseline(const std::string& json_text, const std::string& source);

struct Regression {
  std::string method, task, mode, budget;
  std::string metric;  // "accuracy", "top-1", "KV bytes", "decode tok/s", "TTFT ms", "missing"
  double baseline = 0;
  double current = 0;  // accuracy: the upper bound of the db's interval
  double limit = 0;    // the value the current one had to reach
};

std::vector<Regression> find_regressions(const std::vector<Aggregate>& current,
                                         const std::vector<Aggregate>& baseline,
                                         const Tolerances& tolerances);

// How close the run came to the speed limits: the row that slowed most beside the run's others,
// for TTFT (the largest now / machine-scaled baseline) and decode tok/s (the smallest), so a CI
// log shows the gate's margin and its noise on an unchanged tree, not only pass or fail.
struct SpeedMargin {
  std::string method, task, mode, budget;
  double ratio = 1;  // now / (baseline x the machine's median change)
};
struct SpeedMargins {
  std::optional<SpeedMargin> ttft, decode;
};
SpeedMargins speed_margins(const std::vector<Aggregate>& current,
                           const std::vector<Aggregate>& baseline);
// One line per metric: the worst ratio, its limit (1 +- the speed tolerance) and its row.
std::string render_speed_margins(const SpeedMargins& margins, const Tolerances& tolerances);

// A plain-text table of the regressions (one line each), or a line saying there are none
// among N compared rows.
std::string render_regressions(const std::vector<Regression>& regressions, size_t compared);

}  // namespace kvbench
