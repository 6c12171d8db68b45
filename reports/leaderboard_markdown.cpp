// leaderboard.md: the board's tables as Markdown (reports/leaderboard.h).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "reports/board.h"
#include "reports/leaderboard.h"
#include "reports/mode_comparison.h"

namespace kvbench {

using namespace board;

namespace {

std::string md_row(const std::vector<std::string>& cells) {
  std::string s = "|";
  for (const std::string& c : cells) s += " " + c + " |";
  return s + "\n";
}

std::string md_rule(size_t text_cols, size_t num_cols) {
  std::string s = "|";
  for (size_t i = 0; i < text_cols; ++i) s += "---|";
  for (size_t i = 0; i < num_cols; ++i) s += "---:|";
  return s + "\n";
}


}  // namespace

std::string render_leaderboard_markdown(const std::vector<RunRecord>& runs,
                                        const std::vector<Aggregate>& rows) {
  const Board b = build_board(rows);
  const Coverage c = coverage(runs);
  std::ostringstream o;
  o << "# kvbench leaderboard\n\n";
  o << "- Runs: " << c.runs;
  if (c.unfinished > 0) o << " (" << c.unfinished << " unfinished)";
  o << "\n";
  o << "- Model sha256: " << md_escape(c.model_sha) << "\n";
  o << "- kvbench version: " << md_escape(c.version) << "\n";
  o << "- git sha: " << md_escape(c.git_sha) << "\n";
  o << "- Dates: " << (c.first.empty() ? kMissing : md_escape(c.first)) << " to "
    << (c.last.empty() ? kMissing : md_escape(c.last)) << "\n";
  o << "- Units: " << b.units << ", turns: " << b.turns << "\n\n";

  o << "## Accuracy (%)\n\n";
  o << "Mean score of the scored turns of each task with its 95% interval (± half of it where "
       "it is symmetric, else its ends; Wilson's over turns, or a bootstrap over samples where "
       "a task gives partial credit); average: the mean of the task columns that have a value, "
       "its interval a bootstrap over each task's samples. The full cache first, then by "
       "average, best first.\n\n";
  {
    std::vector<std::string> head = {"method", "budget", "mode"};
    for (const std::string& t : b.tasks) head.push_back(md_escape(t));
    head.push_back("average");
    o << md_row(head) << md_rule(3, b.tasks.size() + 1);
    for (const Row& r : b.rows) {
      std::vector<std::string> cells = {md_escape(r.method), md_escape(budget_cell(r.budget)),
                                        md_escape(r.mode)};
      for (const std::string& t : b.tasks) cells.push_back(task_accuracy_cell(r, t));
      cells.push_back(accuracy_cell(r.average, r.average_ci ? &*r.average_ci : nullptr));
      o << md_row(cells);
    }
  }

  if (!c.calibrated.empty()) {
    o << "\n**Calibration** of the tasks above (the full cache; without the context is the "
         "control, the same questions asked alone):\n\n";
    for (const auto& [task, numbers] : c.calibrated) {
      o << "- " << md_escape(task) << ": " << md_escape(numbers) << "\n";
    }
  }
  if (!c.plugins.empty()) {
    o << "\n**Plugins** some of the methods above came from (docs/methods.md, \"Write your "
         "own method\"):\n\n";
    for (const std::string& p : c.plugins) o << "- " << md_escape(p) << "\n";
  }
  if (!c.left_out.empty()) {
    o << "\n**Left out**, because the model cannot do them with the full cache or answers "
         "them without the context (so they cannot tell methods apart):\n\n";
    for (const auto& [task, why] : c.left_out) {
      o << "- " << md_escape(task) << ": " << md_escape(why) << "\n";
    }
  }

  o << "\n## Cost and fidelity\n\n";
  o << "Means over the tasks of each row. " << ref_sentence(b) << " Peak: the largest over all turns. Decode "
       "tok/s: turns that decoded more than one token. Prefill: dense (compressed once the "
       "context is in) or stream:N (evicting every N tokens), shared when the units started "
       "from their sample's one prefill for all methods. Read/step: KV bytes attention read "
       "per decode step, all layers (Quest reads pages, KIVI packed blocks). Reused: prompt "
       "tokens loaded from the reuse tiers instead of prefilled (prefix). KL: first-token "
       "KL divergence from the full cache (nats); top-1: agreement of the greedy tokens with "
       "the full cache.\n\n";
  o << md_row({"method", "budget", "mode", "prefill", ref_column(b), "KV MiB", "peak MiB",
               "read/step KiB", "TTFT ms", "reused %", "decode tok/s", "KL", "top-1 %"})
    << md_rule(4, 9);
  for (const Row& r : b.rows) {
    o << md_row({md_escape(r.method), md_escape(budget_cell(r.budget)), md_escape(r.mode),
                 md_escape(prefill_cell(r.prefill)),
                 r.kv_vs_ref ? fmt(*r.kv_vs_ref, 2) + "x" : std::string(kMissing),
                 fmt(r.kv_mib, 2), fmt(r.peak_mib, 2), fmt(r.read_kib, 0), fmt(r.ttft_ms, 1),
                 fmt(r.reused, 1, 100), fmt(r.decode, 1), fmt(r.kl, 4), fmt(r.top1, 1, 100)});
  }

  if (any_timed(b)) {
    o << "\n## Time per unit\n\n" << kTimeNote << "\n\n";
    std::vector<std::string> head = {"method", "budget", "mode"};
    head.insert(head.end(), std::begin(kTimeHead), std::end(kTimeHead));
    o << md_row(head) << md_rule(3, std::size(kTimeHead));
    for (const Row& r : b.rows) {
      if (r.time.timed_units == 0) continue;
      std::vector<std::string> cells = {md_escape(r.method), md_escape(budget_cell(r.budget)),
                                        md_escape(r.mode)};
      for (std::string& c : time_cells(r)) cells.push_back(std::move(c));
      o << md_row(cells);
    }
  }

  o << "\nKept tokens per layer and KV head, for one sample: "
       "[leaderboard.html](leaderboard.html#kept-per-head).\n";

  o << "\n## Accuracy by turn (%)\n\n";
  const size_t k = max_turns(b);
  if (k == 0) {
    o << "No multi-turn rows with scores.\n";
  } else {
    o << "Multi-turn rows: mean score at each turn index over the tasks.\n\n";
    std::vector<std::string> head = {"method", "budget"};
    for (size_t i = 1; i <= k; ++i) head.push_back("turn " + std::to_string(i));
    o << md_row(head) << md_rule(2, k);
    for (const Row& r : b.rows) {
      if (!is_multi_turn(r) || r.by_turn.empty()) continue;
      std::vector<std::string> cells = {md_escape(r.method), md_escape(budget_cell(r.budget))};
      for (size_t i = 0; i < k; ++i) {
        cells.push_back(i < r.by_turn.size() ? fmt(r.by_turn[i] * 100, 1) : std::string(kMissing));
      }
      o << md_row(cells);
    }
  }

  const ModeComparison modes = compare_modes(rows);
  if (!modes.modes.empty()) {
    o << "\n## Multi-turn vs multi-request\n\n" << kModesNote << "\n\n";
    std::vector<std::string> head = {"method", "budget"};
    for (const std::string& m : modes.modes) head.push_back(md_escape(m));
    o << md_row(head) << md_rule(2, modes.modes.size());
    for (const ModeComparisonRow& r : modes.rows) {
      std::vector<std::string> cells = {md_escape(r.method), md_escape(budget_cell(r.budget))};
      for (const ModeCell& c : r.cells) cells.push_back(interval_cell(c.accuracy));
      o << md_row(cells);
    }
    const size_t k = most_turns(modes);
    o << "\nBy turn (the k-th query of a session, or the k-th request):\n\n";
    std::vector<std::string> by_turn_head = {"method", "budget", "mode"};
    for (size_t i = 1; i <= k; ++i) by_turn_head.push_back("turn " + std::to_string(i));
    o << md_row(by_turn_head) << md_rule(3, k);
    for (const ModeComparisonRow& r : modes.rows) {
      for (size_t m = 0; m < modes.modes.size(); ++m) {
        if (r.cells[m].by_turn.empty()) continue;
        std::vector<std::string> cells = {md_escape(r.method), md_escape(budget_cell(r.budget)),
                                          md_escape(modes.modes[m])};
        for (size_t i = 0; i < k; ++i) {
          cells.push_back(i < r.cells[m].by_turn.size() ? interval_cell(r.cells[m].by_turn[i])
                                                         : std::string(kMissing));
        }
        o << md_row(cells);
      }
    }
  }
  return o.str();
}

}  // namespace kvbench
