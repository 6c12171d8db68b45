// The leaderboard's table model, which the Markdown and the HTML renderers both draw from
// (reports/leaderboard_markdown.cpp, leaderboard_html.cpp): one Row per (method, budget,
// mode) over all tasks, built once from the aggregates, and the cells both write the same
// way. Nothing here knows an output format beyond the escaping a cell needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "reports/aggregate.h"
#include "reports/intervals.h"
#include "reports/mode_comparison.h"
#include "store/results_db.h"

namespace kvbench::board {

inline constexpr const char* kMissing = "\xE2\x80\x93";  // en dash: a cell without a value
inline constexpr double kMiB = 1024.0 * 1024.0;

// Numbers: fixed precision, no "-0.0", non-finite and missing values the missing mark.
std::string fmt(double v, int precision);
std::string fmt(const std::optional<double>& v, int precision, double scale = 1.0);
// Markdown table cells, HTML text and attributes, at most n characters (reports/html_text.h).
std::string md_escape(const std::string& s);
std::string h(const std::string& s);
std::string truncate(const std::string& s, size_t n);

// A series' short name: its family, plus the parameters that not every other series of the
// family shares ("snapkv window=8,pool=max"); a composed spec keeps all but the family name.
std::string variant_name(const std::string& family, const std::string& series,
                         const std::set<std::string>& family_series);
// A budget column's "budget=256" -> 256; otherwise nullopt.
std::optional<int64_t> budget_tokens(const std::string& text);
// "dense+shared" -> "dense, shared"; "" (a db before schema v4) -> the missing mark.
std::string prefill_cell(const std::string& prefill);
std::string budget_cell(const std::string& budget);
// "85.0 ±9.1" or "0.0 [0.0, 7.1]": an accuracy in percent and its 95% interval.
std::string accuracy_cell(const std::optional<double>& value, const Interval* ci);
// "52.0 ±19.1" or its ends from an interval, the missing mark without one.
std::string interval_cell(const std::optional<Interval>& ci);
// The most turns any cell of the comparison has.
size_t most_turns(const ModeComparison& modes);
extern const char* const kModesNote;  // what the modes table shows
std::optional<double> mean_of(const std::vector<double>& v);

struct Row {
  std::string method, budget, mode;
  MethodParts parts;  // the spec's family, series (without its budget) and budget= tokens
  std::map<std::string, std::optional<double>> accuracy;  // by task (present tasks only)
  std::map<std::string, Interval> accuracy_ci;            // by task, where scored
  std::optional<double> average;  // mean of the task accuracies present
  std::optional<Interval> average_ci;
  std::optional<double> kv_vs_ref, kl, top1, decode;  // kv_vs_ref: Aggregate::kv_vs_reference
  double kv_mib = 0, peak_mib = 0, ttft_ms = 0;
  std::optional<double> read_kib;  // KV KiB read per decode step
  std::optional<double> reused;    // prompt tokens loaded by reuse, fraction
  std::string prefill;             // Aggregate::prefill over the row's tasks
  std::vector<double> by_turn;  // NaN: no score at that turn index
  int64_t units = 0, turns = 0;
  UnitTime time;  // summed over the row's tasks
  std::string label;  // short display name for charts
  bool is_full() const { return parts.family == "full"; }
};

struct Board {
  std::string reference = "full";      // what KV bytes are measured against (Aggregate)
  std::optional<double> reference_kl;  // the bf16 cache's own KL from fp32: the noise floor
  std::vector<std::string> tasks;
  std::vector<Row> rows;  // full first, then by average (best first)
  std::set<std::string> modes;
  int64_t units = 0, turns = 0;
};

// What the runs cover, one value or the sorted distinct values.
struct Coverage {
  size_t runs = 0, unfinished = 0;
  std::string model_sha, version, git_sha, first, last;
  std::map<std::string, std::string> left_out;  // task -> why its sweep left it out
  // task -> the calibration that let it in: "100% with the context, 4% without"
  std::map<std::string, std::string> calibrated;
  std::set<std::string> plugins;  // "libx.so, sha256 9f2c..." of the methods from plugins
};

Board build_board(const std::vector<Aggregate>& aggs);
Coverage coverage(const std::vector<RunRecord>& runs);

// The Cost table's memory column, the sentence that says what it measures against, and that
// cache's name.
std::string ref_column(const Board& b);
std::string ref_sentence(const Board& b);
std::string ref_cache(const Board& b);

// The "Time per unit" table: whether any row has it, its note, head and a row's cells
// (means per timed unit, in seconds).
bool any_timed(const Board& b);
extern const char* const kTimeNote;
extern const char* const kTimeHead[5];
std::vector<std::string> time_cells(const Row& r);

std::string task_accuracy_cell(const Row& r, const std::string& task);
bool is_multi_turn(const Row& r);
size_t max_turns(const Board& b);  // the most turns a multi-turn row has

}  // namespace kvbench::board
