// The tables `kvbench session` and `kvbench run` print: one per (sample, method) unit with
// a row per turn, and a summary per (task, method) over every unit.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "harness/evaluation.h"

namespace kvbench {

// "method: SPEC", then the unit's per-turn table and its summary line. A score column
// appears when the unit is scored; otherwise a rough "answer found" count.
void print_unit(const UnitResult& unit);

// Means over every turn of every unit of a (task, method); the memory ratio is against
// the full cache's units of the same task, when the run has them.
class SummaryTable {
 public:
  void add(const UnitResult& unit);
  void print() const;

 private:
  struct Totals {
    int64_t turns = 0, scored = 0, timed = 0;
    double score = 0, kl = 0, top1 = 0, ttft_ms = 0, decode_tps = 0, kv_bytes = 0;
    double kv_read = 0;  // sum of per-step reads over the turns that decoded (`timed`)
    int64_t kv_peak = 0;
    int64_t prompt_tokens = 0, tokens_reused = 0;  // reuse: tokens loaded of those prompted
    bool fidelity = false;
    std::vector<double> score_by_turn;  // sums per turn index
    std::vector<int64_t> scored_by_turn;
  };
  using Key = std::tuple<std::string, std::string, std::string>;  // task, mode, method
  std::map<Key, Totals> rows_;
  std::vector<Key> order_;  // first-seen order
};

}  // namespace kvbench
