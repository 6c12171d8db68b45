#include "reports/leaderboard.h"
#include "reports/serving_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/input_error.h"
#include "reports/head_map.h"
#include "reports/html_text.h"
#include "reports/mode_comparison.h"

namespace kvbench {

namespace {

constexpr const char* kMissing = "\xE2\x80\x93";  // en dash: a cell without a value
constexpr double kMiB = 1024.0 * 1024.0;

// ---------------------------------------------------------------------------------------
// Formatting and escaping

std::string fmt(double v, int precision) {
  if (!std::isfinite(v)) return kMissing;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  std::string s = buf;
  if (s == "-0" || s.rfind("-0.", 0) == 0) {  // no "-0.0"
    bool zero = s.find_first_not_of("-0.") == std::string::npos;
    if (zero) s.erase(0, 1);
  }
  return s;
}
std::string fmt(const std::optional<double>& v, int precision, double scale = 1.0) {
  return v ? fmt(*v * scale, precision) : std::string(kMissing);
}

// Markdown table cells: reports/html_text.h.
std::string md_escape(const std::string& s) { return markdown_escape(s); }

// HTML text and attribute values (also inside SVG): reports/html_text.h.
std::string h(const std::string& s) { return html_escape(s); }

// At most `n` characters: reports/html_text.h.
std::string truncate(const std::string& s, size_t n) { return truncate_text(s, n); }

// The spec without its budget=/ratio= parameters: what stays the same along a budget sweep.
std::string strip_budget(const std::string& spec) {
  std::string out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find('+', start);
    if (end == std::string::npos) end = spec.size();
    const std::string comp = spec.substr(start, end - start);
    const size_t colon = comp.find(':');
    std::string kept = comp.substr(0, colon);
    if (colon != std::string::npos) {
      std::string params;
      size_t p = colon + 1;
      while (p <= comp.size()) {
        size_t q = comp.find(',', p);
        if (q == std::string::npos) q = comp.size();
        const std::string kv = comp.substr(p, q - p);
        if (kv.rfind("budget=", 0) != 0 && kv.rfind("ratio=", 0) != 0 && !kv.empty()) {
          params += (params.empty() ? "" : ",") + kv;
        }
        p = q + 1;
      }
      if (!params.empty()) kept += ":" + params;
    }
    out += (out.empty() ? "" : "+") + kept;
    start = end + 1;
  }
  return out;
}

// A series' short name: its family, plus the parameters that not every other series of the
// family shares ("snapkv window=8,pool=max"); a composed spec keeps all but the family name.
std::string variant_name(const std::string& family, const std::string& series,
                         const std::set<std::string>& family_series) {
  if (family_series.size() <= 1) return family;
  if (series.find('+') != std::string::npos) return series;
  auto params_of = [](const std::string& spec) {
    std::vector<std::string> out;
    const size_t colon = spec.find(':');
    if (colon == std::string::npos) return out;
    size_t p = colon + 1;
    while (p <= spec.size()) {
      size_t q = spec.find(',', p);
      if (q == std::string::npos) q = spec.size();
      if (q > p) out.push_back(spec.substr(p, q - p));
      p = q + 1;
    }
    return out;
  };
  std::string differing;
  for (const std::string& param : params_of(series)) {
    bool shared = true;
    for (const std::string& other : family_series) {
      const auto ps = params_of(other);
      if (std::find(ps.begin(), ps.end(), param) == ps.end()) shared = false;
    }
    if (!shared) differing += (differing.empty() ? "" : ",") + param;
  }
  return differing.empty() ? family : family + " " + differing;
}

// "budget=256" -> 256; otherwise nullopt.
std::optional<int64_t> budget_tokens(const std::string& text) {
  if (text.rfind("budget=", 0) != 0) return std::nullopt;
  const std::string digits = text.substr(7);
  if (digits.empty() || digits.size() > 15 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

// The budget tokens of a row: its budget text, else the spec's own budget= parameter.
std::optional<int64_t> row_budget_tokens(const std::string& budget, const std::string& spec) {
  if (auto b = budget_tokens(budget)) return b;
  if (!budget.empty()) return std::nullopt;  // ratio=
  size_t p = spec.find("budget=");
  while (p != std::string::npos) {
    if (p == 0 || spec[p - 1] == ':' || spec[p - 1] == ',') {
      size_t q = spec.find_first_of(",+", p);
      return budget_tokens(spec.substr(p, q == std::string::npos ? std::string::npos : q - p));
    }
    p = spec.find("budget=", p + 1);
  }
  return std::nullopt;
}

// "dense+shared" -> "dense, shared"; "" (a db before schema v4) -> the missing mark.
std::string prefill_cell(const std::string& prefill) {
  if (prefill.empty()) return kMissing;
  const size_t plus = prefill.find('+');
  return plus == std::string::npos ? prefill
                                   : prefill.substr(0, plus) + ", " + prefill.substr(plus + 1);
}

std::string budget_cell(const std::string& budget) {
  if (budget.empty()) return kMissing;
  if (auto b = budget_tokens(budget)) return std::to_string(*b);
  return budget;
}

// "85.0 ±9.1" or "0.0 [0.0, 7.1]": an accuracy in percent and its 95% interval
// (percent_with_interval).
std::string accuracy_cell(const std::optional<double>& value, const Interval* ci) {
  if (!value) return kMissing;
  return ci ? percent_with_interval(*value, *ci) : fmt(*value * 100, 1);
}

// "52.0 ±19.1" or its ends from an interval, the missing mark without one.
std::string interval_cell(const std::optional<Interval>& ci) {
  return ci ? accuracy_cell(ci->mean, &*ci) : std::string(kMissing);
}

// The most turns any cell of the comparison has.
size_t most_turns(const ModeComparison& modes) {
  size_t k = 0;
  for (const ModeComparisonRow& r : modes.rows) {
    for (const ModeCell& c : r.cells) k = std::max(k, c.by_turn.size());
  }
  return k;
}

const char* const kModesNote =
    "SCBench's headline: methods whose memory is sub-linear in the context hold up when each "
    "query is a new request over the shared context and fall over a session's later turns, "
    "while those that keep O(n) memory (sparse prefill, retrieval) stay level. Each method at "
    "its budget in every way the sweep drove it: multi-turn (one cache through the session), "
    "multi-request (each query re-sends the context), query-aware (the first query inside the "
    "span compressed). Accuracy with its 95% interval (± half of it where it is symmetric, "
    "else its ends), pooled over the tasks' scored turns.";

std::optional<double> mean_of(const std::vector<double>& v) {
  if (v.empty()) return std::nullopt;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// ---------------------------------------------------------------------------------------
// The model both renderers draw from: one row per (method, budget, mode) over all tasks.

struct Row {
  std::string method, budget, mode;
  std::string family, series;  // series: the spec without its budget
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
  bool is_full() const { return family == "full"; }
};

struct Board {
  std::string reference = "full";      // what KV bytes are measured against (Aggregate)
  std::optional<double> reference_kl;  // the bf16 cache's own KL from fp32: the noise floor
  std::vector<std::string> tasks;
  std::vector<Row> rows;  // full first, then by average (best first)
  std::set<std::string> modes;
  int64_t units = 0, turns = 0;
};

// The Cost table's memory column and what it says.
std::string ref_column(const Board& b) { return "KV vs " + b.reference; }

std::string ref_sentence(const Board& b) {
  std::string s =
      b.reference == "bf16"
          ? "KV vs bf16: resident KV bytes after a turn over the bf16 cache's on the same task "
            "and mode (the 16-bit cache engines hold; `kvbench report --reference fp32` divides "
            "by the fp32 full cache's instead)."
          : "KV vs full: resident KV bytes after a turn over the fp32 full cache's on the same "
            "task and mode.";
  if (b.reference_kl) {
    s += " The bf16 cache's own KL from the fp32 full cache, " + fmt(*b.reference_kl, 4) +
         " nats, is the noise floor: a method's KL below it tells nothing.";
  }
  return s;
}

std::string ref_cache(const Board& b) {
  return b.reference == "bf16" ? "the bf16 cache" : "the full cache";
}

// The "Time per unit" table: whether any row has it, what it says, and a row's cells (means
// per timed unit, in seconds).
bool any_timed(const Board& b) {
  return std::any_of(b.rows.begin(), b.rows.end(),
                     [](const Row& r) { return r.time.timed_units > 0; });
}

const char* const kTimeNote =
    "Wall seconds per unit, from the previous unit's write in the same process, so a shard's "
    "units add up to its time (units written before schema v8 have none and are left out). "
    "Shared forward: the sample's one prefill for every method that starts from it, with every "
    "method's observers (attention scores, column sums) in it, on the unit that waited for it "
    "(the sample's first); reference: the full cache's session the KL and top-1 columns compare "
    "against, where it ran before a unit and is not the unit's own; own: the rest, the unit's "
    "own session (its prefills, compression, turns, scoring).";

std::vector<std::string> time_cells(const Row& r) {
  const UnitTime& t = r.time;
  const double n = static_cast<double>(t.timed_units) * 1000.0;
  return {std::to_string(t.timed_units), fmt(t.wall_ms / n, 1), fmt(t.shared_forward_ms / n, 1),
          fmt(t.reference_ms / n, 1),
          fmt((t.wall_ms - t.shared_forward_ms - t.reference_ms) / n, 1)};
}

const char* const kTimeHead[] = {"units", "wall s", "shared forward s", "reference s", "own s"};

std::string task_accuracy_cell(const Row& r, const std::string& task) {
  auto it = r.accuracy.find(task);
  if (it == r.accuracy.end()) return kMissing;
  auto ci = r.accuracy_ci.find(task);
  return accuracy_cell(it->second, ci == r.accuracy_ci.end() ? nullptr : &ci->second);
}

Board build_board(const std::vector<Aggregate>& aggs) {
  Board b;
  std::set<std::string> tasks;
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<const Aggregate*>> g;
  std::vector<double> floor_kls;
  for (const Aggregate& a : aggs) {
    b.reference = a.reference;
    if (method_family(a.method) == "bf16" && a.first_token_kl) floor_kls.push_back(*a.first_token_kl);
    tasks.insert(a.task);
    b.modes.insert(a.mode);
    g[{a.method, a.budget, a.mode}].push_back(&a);
    b.units += a.units;
    b.turns += a.turns;
  }
  b.tasks.assign(tasks.begin(), tasks.end());
  b.reference_kl = mean_of(floor_kls);
  for (const auto& [key, list] : g) {
    Row r;
    std::tie(r.method, r.budget, r.mode) = key;
    r.family = method_family(r.method);
    r.series = strip_budget(r.method);
    std::vector<double> accs, ratios, kls, top1s, decodes, kvs, ttfts, reads, reuses;
    std::vector<std::vector<double>> turn_vals;
    std::vector<std::vector<std::vector<double>>> task_scores;  // per scored task, per unit
    double peak = 0;
    for (const Aggregate* a : list) {
      r.accuracy[a->task] = a->accuracy;
      if (a->accuracy_ci) r.accuracy_ci[a->task] = *a->accuracy_ci;
      if (a->accuracy) task_scores.push_back(a->unit_scores);
      if (a->accuracy) accs.push_back(*a->accuracy);
      if (a->kv_vs_reference) ratios.push_back(*a->kv_vs_reference);
      if (a->first_token_kl) kls.push_back(*a->first_token_kl);
      if (a->top1_agreement) top1s.push_back(*a->top1_agreement);
      if (a->decode_tokens_per_s > 0) decodes.push_back(a->decode_tokens_per_s);
      kvs.push_back(a->kv_bytes);
      if (a->kv_read_per_step > 0) reads.push_back(a->kv_read_per_step / 1024.0);
      if (a->reused) reuses.push_back(*a->reused);
      ttfts.push_back(a->ttft_ms);
      peak = std::max(peak, static_cast<double>(a->kv_bytes_peak));
      if (turn_vals.size() < a->accuracy_by_turn.size()) turn_vals.resize(a->accuracy_by_turn.size());
      for (size_t i = 0; i < a->accuracy_by_turn.size(); ++i) {
        if (std::isfinite(a->accuracy_by_turn[i])) turn_vals[i].push_back(a->accuracy_by_turn[i]);
      }
      r.prefill = r.units == 0 ? a->prefill : combine_prefill(r.prefill, a->prefill);
      r.units += a->units;
      r.turns += a->turns;
      r.time.add(a->time);
    }
    r.average = mean_of(accs);
    if (r.average) r.average_ci = average_interval(task_scores);
    r.kv_vs_ref = mean_of(ratios);
    r.kl = mean_of(kls);
    r.top1 = mean_of(top1s);
    r.decode = mean_of(decodes);
    r.kv_mib = mean_of(kvs).value_or(0) / kMiB;
    r.read_kib = mean_of(reads);
    r.reused = mean_of(reuses);
    r.ttft_ms = mean_of(ttfts).value_or(0);
    r.peak_mib = peak / kMiB;
    for (const auto& v : turn_vals) {
      r.by_turn.push_back(mean_of(v).value_or(std::numeric_limits<double>::quiet_NaN()));
    }
    b.rows.push_back(std::move(r));
  }
  std::stable_sort(b.rows.begin(), b.rows.end(), [](const Row& x, const Row& y) {
    if (x.is_full() != y.is_full()) return x.is_full();
    if (x.average.has_value() != y.average.has_value()) return x.average.has_value();
    if (x.average && *x.average != *y.average) return *x.average > *y.average;
    return std::tie(x.method, x.budget, x.mode) < std::tie(y.method, y.budget, y.mode);
  });

  // Chart labels: "family [variant] budget [(mode)]", where the variant names the parameters
  // that set a series apart from the family's other series; the spec when still ambiguous.
  const bool many_modes = b.modes.size() > 1;
  std::map<std::string, std::set<std::string>> family_series;
  for (const Row& r : b.rows) family_series[r.family].insert(r.series);
  std::map<std::string, int> seen;
  std::vector<std::string> shorts;
  for (const Row& r : b.rows) {
    // The variant may be cut; the budget and mode after it stay readable.
    std::string s = truncate(variant_name(r.family, r.series, family_series[r.family]), 24);
    if (!r.budget.empty()) s += " " + budget_cell(r.budget);
    if (many_modes) s += " (" + r.mode + ")";
    shorts.push_back(s);
    ++seen[s];
  }
  for (size_t i = 0; i < b.rows.size(); ++i) {
    Row& r = b.rows[i];
    if (seen[shorts[i]] == 1) {
      r.label = shorts[i];
    } else {
      r.label = r.method + (r.budget.empty() || r.method.find(r.budget) != std::string::npos
                                ? ""
                                : " " + r.budget);
      if (many_modes) r.label += " (" + r.mode + ")";
    }
  }
  return b;
}

bool is_multi_turn(const Row& r) { return is_multi_turn_mode(r.mode); }

size_t max_turns(const Board& b) {
  size_t k = 0;
  for (const Row& r : b.rows) {
    if (is_multi_turn(r)) k = std::max(k, r.by_turn.size());
  }
  return k;
}

// What the runs cover, one value or the sorted distinct values.
struct Coverage {
  size_t runs = 0, unfinished = 0;
  std::string model_sha, version, git_sha, first, last;
  std::map<std::string, std::string> left_out;  // task -> why its sweep left it out
  // task -> the calibration that let it in: "100% with the context, 4% without"
  std::map<std::string, std::string> calibrated;
  std::set<std::string> plugins;  // "libx.so, sha256 9f2c..." of the methods from plugins
};

// The plugins a run's methods came from ("plugins", harness/sweep.cpp run_config_json).
void add_plugins(const std::string& config_json, std::set<std::string>& out) {
  const auto root = nlohmann::json::parse(config_json, nullptr, false);
  if (!root.is_object() || !root.contains("plugins") || !root["plugins"].is_array()) return;
  for (const auto& p : root["plugins"]) {
    if (p.is_object() && p.value("file", nlohmann::json()).is_string() &&
        p.value("sha256", nlohmann::json()).is_string()) {
      out.insert(p["file"].get<std::string>() + ", sha256 " + p["sha256"].get<std::string>());
    }
  }
}

// The tasks a run's sweep left out (its config's "excluded_tasks", harness/sweep.h).
void add_left_out(const std::string& config_json, std::map<std::string, std::string>& out) {
  const auto root = nlohmann::json::parse(config_json, nullptr, false);
  if (!root.is_object() || !root.contains("excluded_tasks") ||
      !root["excluded_tasks"].is_array()) {
    return;
  }
  for (const auto& t : root["excluded_tasks"]) {
    if (t.is_object() && t.value("task", nlohmann::json()).is_string() &&
        t.value("reason", nlohmann::json()).is_string()) {
      out.emplace(t["task"].get<std::string>(), t["reason"].get<std::string>());
    }
  }
}

// The tasks a run's calibration let in, with both numbers ("calibrated_tasks").
void add_calibrated(const std::string& config_json, std::map<std::string, std::string>& out) {
  const auto root = nlohmann::json::parse(config_json, nullptr, false);
  if (!root.is_object() || !root.contains("calibrated_tasks") ||
      !root["calibrated_tasks"].is_array()) {
    return;
  }
  for (const auto& t : root["calibrated_tasks"]) {
    if (!t.is_object() || !t.value("task", nlohmann::json()).is_string() ||
        !t.value("accuracy", nlohmann::json()).is_number() ||
        !t.value("no_context_accuracy", nlohmann::json()).is_number()) {
      continue;
    }
    char text[96];
    std::snprintf(text, sizeof text, "%.0f%% with the context, %.0f%% without it",
                  100 * t["accuracy"].get<double>(), 100 * t["no_context_accuracy"].get<double>());
    out.emplace(t["task"].get<std::string>(), text);
  }
}

std::string join_set(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& v : s) out += (out.empty() ? "" : ", ") + v;
  return out.empty() ? std::string(kMissing) : out;
}

Coverage coverage(const std::vector<RunRecord>& runs) {
  Coverage c;
  c.runs = runs.size();
  std::set<std::string> shas, versions;
  // The commits of the runs that hold units (a resume with nothing to run records an empty
  // run), or of every run when none does (a db of serving runs).
  const bool any_units =
      std::any_of(runs.begin(), runs.end(), [](const RunRecord& r) { return r.units > 0; });
  std::map<std::string, int64_t> units_by_commit;
  for (const RunRecord& r : runs) {
    shas.insert(r.model_sha256.substr(0, 12));
    versions.insert(r.kvbench_version);
    if (r.units > 0 || !any_units) units_by_commit[r.git_sha] += r.units;
    if (r.finished_at.empty()) ++c.unfinished;
    add_left_out(r.config_json, c.left_out);
    add_calibrated(r.config_json, c.calibrated);
    add_plugins(r.config_json, c.plugins);
    if (!r.started_at.empty() && (c.first.empty() || r.started_at < c.first)) c.first = r.started_at;
    const std::string& end = r.finished_at.empty() ? r.started_at : r.finished_at;
    if (!end.empty() && end > c.last) c.last = end;
  }
  c.model_sha = join_set(shas);
  c.version = join_set(versions);
  // One commit: its sha. Several (a merge --allow-mixed-commits): each with its units, so a
  // reader sees that the table mixes codes.
  std::set<std::string> commits;
  for (const auto& [sha, units] : units_by_commit) {
    commits.insert(units_by_commit.size() == 1
                       ? sha
                       : sha + " (" + std::to_string(units) + " unit" + (units == 1 ? "" : "s") +
                             ")");
  }
  c.git_sha = join_set(commits);
  if (units_by_commit.size() > 1) c.git_sha = "MIXED: " + c.git_sha;
  return c;
}

// ---------------------------------------------------------------------------------------
// Markdown

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

// ---------------------------------------------------------------------------------------
// HTML and SVG

namespace {

const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr size_t kPaletteSize = sizeof kPalette / sizeof kPalette[0];

std::string colour(size_t i) { return kPalette[i % kPaletteSize]; }

// One colour per method family in every chart (the full cache: dark grey), assigned in
// family order so the same db always gets the same colours.
class FamilyColours {
 public:
  explicit FamilyColours(const std::vector<Row>& rows) {
    std::set<std::string> families;
    for (const Row& r : rows) {
      if (!r.is_full()) families.insert(r.family);
    }
    size_t i = 0;
    for (const std::string& f : families) index_[f] = i++;
  }
  std::string colour_of(const std::string& family) const {
    auto it = index_.find(family);
    return it == index_.end() ? "#444444" : colour(it->second);
  }
  // Families past the palette repeat its colours: they get a dash pattern as well.
  size_t index_of(const std::string& family) const {
    auto it = index_.find(family);
    return it == index_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, size_t> index_;
};

std::string num(double v) {  // SVG coordinates
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Text that may be long: truncated to `n` characters, the whole of it in a tooltip.
std::string svg_label(const std::string& text, size_t n) {
  const std::string t = truncate(text, n);
  if (t == text) return h(text);
  return "<title>" + h(text) + "</title>" + h(t);
}

struct Series {
  std::string label;    // legend text
  std::string tooltip;  // full name
  std::string colour;
  std::string dash;     // stroke-dasharray attribute or ""
  std::vector<std::pair<double, double>> points;  // (x, y in [0, 1])
  std::vector<std::pair<double, double>> bounds;  // per point: its 95% interval; or empty
};

struct RefLine {
  std::string label;
  double y = 0;  // in [0, 1]
};

struct XAxis {
  std::string title;
  std::vector<double> ticks;  // values with a tick and label
  bool log = false;
  double lo = 0, hi = 1;
  std::vector<std::string> tick_labels;  // parallel to ticks; empty: the numbers themselves
  // Pixels between neighbouring series' points at the same x, so that equal values stay
  // visible (for a categorical axis such as the turn index); 0: none.
  double jitter = 0;
};

// A tick of the memory axis as the Cost table writes KV vs full: "1/16x" for the fractions
// budgets are set at (0.06 would hide which one), else "0.39x".
std::string ratio_label(double r) {
  if (r > 0 && r < 1) {
    const double inv = 1 / r;
    if (std::abs(inv - std::round(inv)) < 1e-9) {
      return "1/" + std::to_string(static_cast<long long>(std::round(inv))) + "x";
    }
  }
  return fmt(r, r == std::floor(r) ? 0 : 2) + "x";
}

constexpr double kWidth = 900;
constexpr double kPlotLeft = 60, kPlotRight = 560, kPlotTop = 20, kPlotHeight = 260;
constexpr double kLegendX = 580;

std::string line_chart(const std::string& aria, const XAxis& x, const std::vector<Series>& series,
                       const std::vector<RefLine>& refs) {
  const size_t legend_items = series.size() + refs.size();
  const double height =
      std::max(kPlotTop + kPlotHeight + 50, kPlotTop + 20.0 * static_cast<double>(legend_items) + 20);
  const double bottom = kPlotTop + kPlotHeight;
  auto px = [&](double v) {
    double lo = x.lo, hi = x.hi;
    if (x.log) {
      v = std::log2(v);
      lo = std::log2(lo);
      hi = std::log2(hi);
    }
    const double f = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    return kPlotLeft + 15 + f * (kPlotRight - kPlotLeft - 30);
  };
  auto py = [&](double v) { return bottom - v * kPlotHeight; };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
    << "\" role=\"img\" aria-label=\"" << h(aria) << "\">\n";
  // Grid and y axis: 0..100 %.
  for (int t = 0; t <= 100; t += 20) {
    const double y = py(t / 100.0);
    s << "<line x1=\"" << num(kPlotLeft) << "\" y1=\"" << num(y) << "\" x2=\"" << num(kPlotRight)
      << "\" y2=\"" << num(y) << "\" class=\"grid\"/>"
      << "<text x=\"" << num(kPlotLeft - 6) << "\" y=\"" << num(y + 4)
      << "\" text-anchor=\"end\" class=\"tick\">" << t << "</text>\n";
  }
  s << "<text x=\"14\" y=\"" << num(kPlotTop + kPlotHeight / 2)
    << "\" text-anchor=\"middle\" class=\"axis\" transform=\"rotate(-90 14 "
    << num(kPlotTop + kPlotHeight / 2) << ")\">accuracy (%)</text>\n";
  // x axis: ticks at the given values, labels thinned so they do not overlap.
  s << "<line x1=\"" << num(kPlotLeft) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(kPlotRight)
    << "\" y2=\"" << num(bottom) << "\" class=\"axisline\"/>\n";
  double last_label = -1e9;
  for (size_t i = 0; i < x.ticks.size(); ++i) {
    const double t = x.ticks[i];
    const double xp = px(t);
    s << "<line x1=\"" << num(xp) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(xp)
      << "\" y2=\"" << num(bottom + 5) << "\" class=\"axisline\"/>";
    if (xp - last_label >= 40) {
      s << "<text x=\"" << num(xp) << "\" y=\"" << num(bottom + 18)
        << "\" text-anchor=\"middle\" class=\"tick\">"
        << (i < x.tick_labels.size() ? h(x.tick_labels[i]) : fmt(t, t == std::floor(t) ? 0 : 2))
        << "</text>";
      last_label = xp;
    }
    s << "\n";
  }
  s << "<text x=\"" << num((kPlotLeft + kPlotRight) / 2) << "\" y=\"" << num(bottom + 38)
    << "\" text-anchor=\"middle\" class=\"axis\">" << h(x.title) << "</text>\n";

  double ly = kPlotTop + 6;
  for (size_t i = 0; i < refs.size(); ++i) {
    const RefLine& r = refs[i];
    const std::string cls = i % 2 == 0 ? "ref" : "ref alt";
    const double y = py(r.y);
    s << "<line x1=\"" << num(kPlotLeft) << "\" y1=\"" << num(y) << "\" x2=\"" << num(kPlotRight)
      << "\" y2=\"" << num(y) << "\" class=\"" << cls << "\"><title>" << h(r.label) << ": "
      << fmt(r.y * 100, 1) << "%</title></line>\n";
    s << "<line x1=\"" << num(kLegendX) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(kLegendX + 22)
      << "\" y2=\"" << num(ly) << "\" class=\"" << cls << "\"/><text x=\"" << num(kLegendX + 28)
      << "\" y=\"" << num(ly + 4) << "\" class=\"legend\">" << svg_label(r.label + " (" + fmt(r.y * 100, 1) + ")", 44)
      << "</text>\n";
    ly += 20;
  }
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& se = series[i];
    const std::string& c = se.colour;
    const double shift =
        x.jitter * (static_cast<double>(i) - static_cast<double>(series.size() - 1) / 2);
    auto pxs = [&](double v) { return px(v) + shift; };
    s << "<g><title>" << h(se.tooltip) << "</title>";
    if (se.points.size() > 1) {
      s << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\"" << se.dash
        << " points=\"";
      for (size_t p = 0; p < se.points.size(); ++p) {
        s << (p ? " " : "") << num(pxs(se.points[p].first)) << "," << num(py(se.points[p].second));
      }
      s << "\"/>";
    }
    for (size_t p = 0; p < se.points.size(); ++p) {
      const auto& [xv, yv] = se.points[p];
      if (p < se.bounds.size()) {  // the error bar: the point's 95% interval
        s << "<line class=\"err\" x1=\"" << num(pxs(xv)) << "\" y1=\"" << num(py(se.bounds[p].first))
          << "\" x2=\"" << num(pxs(xv)) << "\" y2=\"" << num(py(se.bounds[p].second))
          << "\" stroke=\"" << c << "\" stroke-width=\"1.2\"/>";
      }
      s << "<circle cx=\"" << num(pxs(xv)) << "\" cy=\"" << num(py(yv)) << "\" r=\"3.5\" fill=\""
        << c << "\"/>";
    }
    s << "</g>\n";
    s << "<line x1=\"" << num(kLegendX) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(kLegendX + 22)
      << "\" y2=\"" << num(ly) << "\" stroke=\"" << c << "\" stroke-width=\"2\"" << se.dash
      << "/><circle cx=\"" << num(kLegendX + 11) << "\" cy=\"" << num(ly) << "\" r=\"3.5\" fill=\""
      << c << "\"/><text x=\"" << num(kLegendX + 28) << "\" y=\"" << num(ly + 4)
      << "\" class=\"legend\">" << svg_label(se.label, 44) << "</text>\n";
    ly += 20;
  }
  s << "</svg>\n";
  return s.str();
}

struct Bar {
  std::string label, tooltip, colour;
  double value = 0;
  std::string text;  // the value as shown
};

// Rough width of 12px sans-serif text (no font metrics in here): 6.8px a character.
double text_width(const std::string& s, double per_char = 6.8) {
  size_t chars = 0;
  for (char c : s) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return per_char * static_cast<double>(chars);
}

std::string bar_chart(const std::string& aria, const std::vector<Bar>& bars) {
  constexpr size_t kMaxLabel = 52;
  constexpr double row = 22, top = 10;
  // Labels get the room the longest needs (within limits); values after the bars fit in.
  double label_w = 60, value_w = 40;
  for (const Bar& b : bars) {
    label_w = std::max(label_w, text_width(truncate(b.label, kMaxLabel)));
    value_w = std::max(value_w, text_width(b.text, 6.2));
  }
  const double left = std::min(label_w, 360.0) + 16;
  const double right = kWidth - value_w - 16;
  const double height = top * 2 + row * static_cast<double>(bars.size());
  double hi = 0;
  for (const Bar& b : bars) hi = std::max(hi, b.value);
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
    << "\" role=\"img\" aria-label=\"" << h(aria) << "\">\n";
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double y = top + row * static_cast<double>(i);
    const double w = hi > 0 ? b.value / hi * (right - left) : 0;
    s << "<g><title>" << h(b.tooltip) << ": " << h(b.text) << "</title>"
      << "<text x=\"" << num(left - 8) << "\" y=\"" << num(y + 15)
      << "\" text-anchor=\"end\" class=\"legend\">" << h(truncate(b.label, kMaxLabel)) << "</text>"
      << "<rect x=\"" << num(left) << "\" y=\"" << num(y + 3) << "\" width=\"" << num(std::max(w, 1.0))
      << "\" height=\"" << num(row - 6) << "\" fill=\"" << b.colour << "\"/>"
      << "<text x=\"" << num(left + w + 6) << "\" y=\"" << num(y + 15) << "\" class=\"tick\">"
      << h(b.text) << "</text></g>\n";
  }
  s << "<line x1=\"" << num(left) << "\" y1=\"" << num(top) << "\" x2=\"" << num(left)
    << "\" y2=\"" << num(height - top) << "\" class=\"axisline\"/>\n";
  s << "</svg>\n";
  return s.str();
}

const char* const kStyle = R"(body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;background:#fafafa;color:#222;margin:24px auto;max-width:1100px;padding:0 16px;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
p.note{color:#555;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em;background:#fff}
th,td{border:1px solid #ddd;padding:4px 8px;vertical-align:top}
th{background:#f0f0f0;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.spec{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em;overflow-wrap:anywhere;max-width:360px}
td.nw{white-space:nowrap}
td.wide{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em;overflow-wrap:anywhere;min-width:180px}
tr:nth-child(even) td{background:#f8f8f8}
tr.full td{background:#eef4fb}
svg{background:#fff;border:1px solid #ddd;display:block;margin:.6em 0}
div.maps{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}div.maps svg{margin:0}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;fill:#222}
svg .tick{font-size:11px;fill:#444}svg .axis{font-size:12px}svg .legend{font-size:12px}
svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axisline{stroke:#666;stroke-width:1}
svg .ref{stroke:#222;stroke-width:1.5;stroke-dasharray:6 4}svg .ref.alt{stroke:#888;stroke-dasharray:2 3}
)";

// Table cells. A std::string is text (from a db or not) and is escaped here; a Markup holds
// HTML this file built from escaped pieces. So no db string reaches a cell unescaped.
struct Markup {
  std::string html;
};

std::string th(const std::string& text, bool numeric = false) {
  return std::string(numeric ? "<th class=\"num\">" : "<th>") + h(text) + "</th>";
}
std::string td(const Markup& cell, const char* cls = nullptr) {
  return (cls ? std::string("<td class=\"") + cls + "\">" : std::string("<td>")) + cell.html +
         "</td>";
}
std::string td(const std::string& text, const char* cls = nullptr) { return td(Markup{h(text)}, cls); }

Markup h_spec(const std::string& spec) {
  Markup out;
  for (char c : h(spec)) {
    out.html += c;
    if (c == ',' || c == '+') out.html += "<wbr>";
  }
  return out;
}

std::string tr_open(const Row& r) { return r.is_full() ? "<tr class=\"full\">" : "<tr>"; }

}  // namespace

std::string render_leaderboard_html(const std::vector<RunRecord>& runs,
                                    const std::vector<Aggregate>& rows,
                                    const std::vector<HeadMap>& head_maps) {
  const Board b = build_board(rows);
  const Coverage c = coverage(runs);
  const FamilyColours fc(b.rows);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>kvbench leaderboard</title>\n<style>\n" << kStyle << "</style>\n</head>\n<body>\n";
  o << "<h1>kvbench leaderboard</h1>\n";
  o << "<p>" << c.runs << " run" << (c.runs == 1 ? "" : "s");
  if (c.unfinished > 0) o << " (" << c.unfinished << " unfinished)";
  o << ", " << b.units << " units, " << b.turns << " turns; model sha256 " << h(c.model_sha)
    << "; kvbench " << h(c.version) << "; git " << h(c.git_sha) << "; "
    << (c.first.empty() ? kMissing : h(c.first)) << " to " << (c.last.empty() ? kMissing : h(c.last))
    << ".</p>\n";

  // Runs.
  o << "<table class=\"runs\">\n<tr>" << th("run", true) << th("kvbench, git")
    << th("model, sha256") << th("host") << th("started, finished") << th("command") << "</tr>\n";
  for (const RunRecord& r : runs) {
    o << "<tr>" << td(std::to_string(r.id), "num")
      << td(Markup{h(r.kvbench_version) + "<br>" + h(r.git_sha.substr(0, 12))}, "nw")
      << td(Markup{h(r.model_path) + "<br>" + h(r.model_sha256.substr(0, 12))}, "wide") << td(r.host)
      << td(Markup{h(r.started_at) + "<br>" +
                   (r.finished_at.empty() ? std::string("unfinished") : h(r.finished_at))},
            "nw")
      << td(r.command_line, "wide") << "</tr>\n";
  }
  o << "</table>\n";

  // Accuracy table.
  o << "<h2>Accuracy (%)</h2>\n<p class=\"note\">Mean score of the scored turns of each task, "
       "with its 95% interval (± half of it where it is symmetric, else its ends; Wilson's over "
       "turns, or a bootstrap over samples where a task gives partial credit); average: the "
       "mean of the task columns that have a value, its interval a bootstrap over each task's "
       "samples. The full cache first (shaded), then by average, best first.</p>\n";
  o << "<table>\n<tr>" << th("method") << th("budget") << th("mode");
  for (const std::string& t : b.tasks) o << th(t, true);
  o << th("average", true) << "</tr>\n";
  for (const Row& r : b.rows) {
    o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
      << td(r.mode, "nw");
    for (const std::string& t : b.tasks) o << td(task_accuracy_cell(r, t), "num");
    o << td(Markup{"<b>" + h(accuracy_cell(r.average, r.average_ci ? &*r.average_ci : nullptr)) +
                   "</b>"},
            "num")
      << "</tr>\n";
  }
  o << "</table>\n";
  if (!c.calibrated.empty()) {
    o << "<p class=\"note\"><b>Calibration</b> of the tasks above (the full cache; without the "
         "context is the control, the same questions asked alone):</p>\n<ul>\n";
    for (const auto& [task, numbers] : c.calibrated) {
      o << "<li>" << h(task) << ": " << h(numbers) << "</li>\n";
    }
    o << "</ul>\n";
  }
  if (!c.plugins.empty()) {
    o << "<p class=\"note\"><b>Plugins</b> some of the methods above came from:</p>\n<ul>\n";
    for (const std::string& p : c.plugins) o << "<li>" << h(p) << "</li>\n";
    o << "</ul>\n";
  }
  if (!c.left_out.empty()) {
    o << "<p class=\"note\"><b>Left out</b>, because the model cannot do them with the full "
         "cache or answers them without the context (so they cannot tell methods "
         "apart):</p>\n<ul>\n";
    for (const auto& [task, why] : c.left_out) o << "<li>" << h(task) << ": " << h(why) << "</li>\n";
    o << "</ul>\n";
  }

  // Accuracy vs memory: each row at its KV bytes relative to the full cache.
  o << "<h2>Accuracy vs KV memory</h2>\n";
  {
    std::map<std::pair<std::string, std::string>, std::vector<const Row*>> rows_of;
    std::vector<std::pair<std::string, std::string>> order;  // series in first-seen order
    std::vector<RefLine> refs;
    std::set<double> xs;
    size_t no_ratio = 0;  // scored rows without a full-cache reference: no x to draw them at
    const bool many_modes = b.modes.size() > 1;
    for (const Row& r : b.rows) {
      if (!r.average) continue;
      if (r.is_full()) {
        refs.push_back({"full cache" + (many_modes ? " (" + r.mode + ")" : std::string()) +
                            (r.budget.empty() ? "" : " " + r.budget),
                        *r.average});
        continue;
      }
      if (!r.kv_vs_ref || *r.kv_vs_ref <= 0) {
        ++no_ratio;
        continue;
      }
      auto key = std::make_pair(r.series, r.mode);
      if (!rows_of.count(key)) order.push_back(key);
      rows_of[key].push_back(&r);
      xs.insert(*r.kv_vs_ref);
    }
    // Series order: by family, then spec, then mode (stable across dbs).
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b2) {
      return std::make_tuple(method_family(a.first), a.first, a.second) <
             std::make_tuple(method_family(b2.first), b2.first, b2.second);
    });
    std::map<std::string, std::set<std::string>> variants;  // family -> series specs
    for (const auto& k : order) variants[method_family(k.first)].insert(k.first);
    std::vector<Series> series;
    std::map<std::string, size_t> nth_of_family;  // the family's 2nd, 3rd series: dashed
    for (const auto& k : order) {
      Series se;
      const std::string fam = method_family(k.first);
      se.colour = fc.colour_of(fam);
      const size_t nth = nth_of_family[fam]++ + (fc.index_of(fam) / kPaletteSize);
      se.dash = nth == 0 ? "" : nth % 2 == 1 ? " stroke-dasharray=\"6 3\"" : " stroke-dasharray=\"2 2\"";
      se.label = variant_name(fam, k.first, variants[fam]);
      if (many_modes) se.label += " (" + k.second + ")";
      se.tooltip = k.first + " (" + k.second + ")";
      std::vector<const Row*> rows = rows_of[k];
      std::sort(rows.begin(), rows.end(),
                [](const Row* x, const Row* y) { return *x->kv_vs_ref < *y->kv_vs_ref; });
      for (const Row* r : rows) {
        se.points.push_back({*r->kv_vs_ref, *r->average});
        const Interval ci = r->average_ci.value_or(Interval{*r->average, *r->average, *r->average, 0});
        se.bounds.push_back({ci.low, ci.high});
      }
      series.push_back(std::move(se));
    }
    if (series.empty() && refs.empty()) {
      o << "<p class=\"note\">No scored rows"
        << (no_ratio ? " with " + ref_cache(b) + " on the same task and mode" : std::string())
        << ".</p>\n";
    } else {
      XAxis x;
      x.title = "KV bytes relative to " + ref_cache(b);
      x.jitter = std::min(2.0, 20.0 / static_cast<double>(std::max<size_t>(series.size(), 1)));
      if (!xs.empty()) {
        x.lo = *xs.begin();
        x.hi = *xs.rbegin();
        x.log = x.lo > 0 && x.hi / x.lo >= 4;
        for (double t : {1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1.0, 2.0}) {
          if (t >= x.lo * 0.999 && t <= x.hi * 1.001) x.ticks.push_back(t);
        }
        if (x.ticks.empty()) x.ticks.assign(xs.begin(), xs.end());
        for (double t : x.ticks) x.tick_labels.push_back(ratio_label(t));
      }
      o << "<p class=\"note\">y: average accuracy over the tasks, with its 95% interval as a bar; "
           "x: the row's resident KV bytes over "
        << ref_cache(b) << "'s (" << ref_column(b) << "); one line per method "
           "(the spec without its budget), its points set a pixel or two apart so that equal values "
           "show; dashed: the full cache."
        << (x.log ? " x axis logarithmic." : "")
        << (no_ratio ? " Rows without " + ref_cache(b) + " on the same task and mode are not "
                       "drawn (no " + ref_column(b) + "); see the tables."
                     : std::string())
        << "</p>\n";
      o << line_chart("accuracy against KV memory relative to " + ref_cache(b) + " per method", x,
                      series, refs);
    }
  }

  // Cost and fidelity.
  o << "<h2>Cost and fidelity</h2>\n<p class=\"note\">Means over the tasks of each row. "
    << h(ref_sentence(b)) << " Peak: the largest over all turns. Decode tok/s: turns that decoded more than one "
       "token. Read/step: KV bytes attention read per decode step, all layers (Quest reads "
       "pages, KIVI packed blocks). Reused: prompt tokens loaded from the reuse tiers instead "
       "of prefilled (prefix). KL: first-token KL divergence from the full cache (nats); "
       "top-1: agreement of the greedy tokens with the full cache.</p>\n";
  o << "<table>\n<tr>" << th("method") << th("budget") << th("mode") << th("prefill")
    << th(ref_column(b), true)
    << th("KV MiB", true) << th("peak MiB", true) << th("read/step KiB", true)
    << th("TTFT ms", true) << th("reused %", true)
    << th("decode tok/s", true) << th("KL", true) << th("top-1 %", true) << "</tr>\n";
  for (const Row& r : b.rows) {
    o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
      << td(r.mode, "nw") << td(prefill_cell(r.prefill), "nw")
      << td(r.kv_vs_ref ? fmt(*r.kv_vs_ref, 2) + "x" : std::string(kMissing), "num")
      << td(fmt(r.kv_mib, 2), "num") << td(fmt(r.peak_mib, 2), "num")
      << td(fmt(r.read_kib, 0), "num") << td(fmt(r.ttft_ms, 1), "num") << td(fmt(r.reused, 1, 100), "num") << td(fmt(r.decode, 1), "num") << td(fmt(r.kl, 4), "num")
      << td(fmt(r.top1, 1, 100), "num") << "</tr>\n";
  }
  o << "</table>\n";
  if (any_timed(b)) {
    o << "<h2>Time per unit</h2>\n<p class=\"note\">" << h(kTimeNote) << "</p>\n";
    o << "<table>\n<tr>" << th("method") << th("budget") << th("mode");
    for (const char* c : kTimeHead) o << th(c, true);
    o << "</tr>\n";
    for (const Row& r : b.rows) {
      if (r.time.timed_units == 0) continue;
      o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
        << td(r.mode, "nw");
      for (const std::string& c : time_cells(r)) o << td(c, "num");
      o << "</tr>\n";
    }
    o << "</table>\n";
  }

  // Bars grouped by method family and series, budgets ascending within (full first).
  std::vector<const Row*> bar_rows;
  for (const Row& r : b.rows) bar_rows.push_back(&r);
  std::stable_sort(bar_rows.begin(), bar_rows.end(), [](const Row* x, const Row* y) {
    const auto bx = row_budget_tokens(x->budget, x->method);
    const auto by = row_budget_tokens(y->budget, y->method);
    return std::make_tuple(!x->is_full(), x->family, x->series, x->mode, !bx.has_value(),
                           bx.value_or(0), x->budget) <
           std::make_tuple(!y->is_full(), y->family, y->series, y->mode, !by.has_value(),
                           by.value_or(0), y->budget);
  });
  std::vector<Bar> ttft, mem;
  for (const Row* rp : bar_rows) {
    const Row& r = *rp;
    const std::string c = fc.colour_of(r.family);
    ttft.push_back({r.label, r.method + " " + r.mode, c, r.ttft_ms, fmt(r.ttft_ms, 1) + " ms"});
    mem.push_back({r.label, r.method + " " + r.mode, c, r.kv_mib,
                   fmt(r.kv_mib, 2) + " MiB" +
                       (r.kv_vs_ref ? " (" + fmt(*r.kv_vs_ref, 2) + "x)" : std::string())});
  }
  o << "<h2>Time to first token</h2>\n<p class=\"note\">Mean TTFT per row, milliseconds "
       "(hover a bar for the full spec).</p>\n"
    << bar_chart("mean time to first token per method", ttft);
  o << "<h2>KV memory</h2>\n<p class=\"note\">Mean resident KV cache after a turn, MiB; in "
       "parentheses the ratio to "
    << ref_cache(b) << "'s.</p>\n"
    << bar_chart("mean KV memory per method", mem);

  // Kept tokens per layer and head: one sample, one small map per method.
  o << "<h2 id=\"kept-per-head\">Kept tokens per layer and head</h2>\n";
  if (head_maps.empty()) {
    o << "<p class=\"note\">No unit recorded its tokens per KV head (a db written before "
         "schema v5).</p>\n";
  } else {
    const HeadMap& m = head_maps.front();
    o << "<p class=\"note\">After the first turn of one sample (task " << h(m.task)
      << ", sample " << h(m.sample_id) << ", " << h(m.mode)
      << "): the tokens each KV head of each layer kept, over the tokens the cache had seen "
         "by then (context, query and first answer). Rows: layers, 0 at the top; columns: "
         "KV heads. A method whose heads keep equal counts shows uniform rows; head-wise "
         "budgets vary along a row, layer budgets down the columns. Hover a cell for its "
         "count.</p>\n<div class=\"maps\">\n";
    for (const HeadMap& map : head_maps) o << head_map_svg(map);
    o << "</div>\n";
  }

  // Accuracy by turn.
  o << "<h2>Accuracy by turn (%)</h2>\n";
  const size_t k = max_turns(b);
  if (k == 0) {
    o << "<p class=\"note\">No multi-turn rows with scores.</p>\n";
  } else {
    o << "<p class=\"note\">Multi-turn rows: mean score at each turn index over the tasks.</p>\n";
    o << "<table>\n<tr>" << th("method") << th("budget");
    for (size_t i = 1; i <= k; ++i) o << th("turn " + std::to_string(i), true);
    o << "</tr>\n";
    std::vector<Series> series;
    std::map<std::string, size_t> family_lines;  // lines drawn per family so far
    for (const Row& r : b.rows) {
      if (!is_multi_turn(r) || r.by_turn.empty()) continue;
      o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num");
      Series se;
      se.label = r.label;  // every row here is multi-turn: no mode in the legend
      const std::string mode_suffix = " (" + r.mode + ")";
      if (se.label.size() > mode_suffix.size() &&
          se.label.compare(se.label.size() - mode_suffix.size(), mode_suffix.size(), mode_suffix) == 0) {
        se.label.erase(se.label.size() - mode_suffix.size());
      }
      se.tooltip = r.method;
      // The family's colour, as in the other charts; budgets of one family by dash.
      se.colour = fc.colour_of(r.family);
      static const char* const kFamilyDash[] = {"", " stroke-dasharray=\"6 3\"",
                                                " stroke-dasharray=\"2 2\"",
                                                " stroke-dasharray=\"8 2 2 2\""};
      se.dash = kFamilyDash[family_lines[r.family]++ % 4];
      for (size_t i = 0; i < k; ++i) {
        const bool has = i < r.by_turn.size() && std::isfinite(r.by_turn[i]);
        o << td(has ? fmt(r.by_turn[i] * 100, 1) : std::string(kMissing), "num");
        if (has) se.points.push_back({static_cast<double>(i + 1), r.by_turn[i]});
      }
      o << "</tr>\n";
      series.push_back(std::move(se));
    }
    o << "</table>\n";
    // More lines than the palette has colours read as spaghetti: the chart keeps the full
    // cache and the best rows (table order), the table above has them all.
    constexpr size_t kMaxLines = 12;
    if (series.size() > kMaxLines) {
      o << "<p class=\"note\">The chart shows the first " << kMaxLines << " of these "
        << series.size() << " rows (the full cache, then by average accuracy).</p>\n";
      series.resize(kMaxLines);
    }
    XAxis x;
    x.title = "turn (points of different rows are set a little apart so that equal values show)";
    x.jitter = std::min(3.0, 30.0 / static_cast<double>(std::max<size_t>(series.size(), 1)));
    x.lo = 1;
    x.hi = static_cast<double>(std::max<size_t>(k, 2));
    for (size_t i = 1; i <= k; ++i) x.ticks.push_back(static_cast<double>(i));
    o << line_chart("multi-turn accuracy by turn index", x, series, {});
  }

  const ModeComparison modes = compare_modes(rows);
  if (!modes.modes.empty()) {
    o << "<h2 id=\"modes\">Multi-turn vs multi-request</h2>\n<p class=\"note\">" << h(kModesNote)
      << "</p>\n<table>\n<tr>" << th("method") << th("budget");
    for (const std::string& m : modes.modes) o << th(m, true);
    o << "</tr>\n";
    for (const ModeComparisonRow& r : modes.rows) {
      o << (method_family(r.method) == "full" ? "<tr class=\"full\">" : "<tr>")
        << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num");
      for (const ModeCell& c : r.cells) o << td(interval_cell(c.accuracy), "num");
      o << "</tr>\n";
    }
    o << "</table>\n<p class=\"note\">By turn: the k-th query of a session, or the k-th "
         "request.</p>\n<table>\n<tr>"
      << th("method") << th("budget") << th("mode");
    const size_t k = most_turns(modes);
    for (size_t i = 1; i <= k; ++i) o << th("turn " + std::to_string(i), true);
    o << "</tr>\n";
    for (const ModeComparisonRow& r : modes.rows) {
      for (size_t m = 0; m < modes.modes.size(); ++m) {
        const std::vector<Interval>& turns = r.cells[m].by_turn;
        if (turns.empty()) continue;
        o << (method_family(r.method) == "full" ? "<tr class=\"full\">" : "<tr>")
          << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
          << td(modes.modes[m]);
        for (size_t i = 0; i < k; ++i) {
          o << td(i < turns.size() ? interval_cell(turns[i]) : std::string(kMissing), "num");
        }
        o << "</tr>\n";
      }
    }
    o << "</table>\n";
  }
  o << "</body>\n</html>\n";
  return o.str();
}

// ---------------------------------------------------------------------------------------

void write_reports(const std::string& db_path, const std::string& out_dir,
                   KvReference reference) {
  std::vector<RunRecord> runs;
  std::vector<UnitRecord> units;
  std::vector<ServingRow> serving;
  {
    auto db = ResultsDb::open(db_path, /*read_only=*/true);
    runs = db->runs();
    units = db->units();
    serving = db->serving_rows();
  }
  if (units.empty() && serving.empty()) {
    throw InputError("DB: no results to report (" + db_path + ")");
  }
  const std::filesystem::path dir(out_dir);
  const std::string md_path = (dir / "leaderboard.md").string();
  const std::string html_path = (dir / "leaderboard.html").string();
  check_output_file(md_path, {db_path}, "-o");
  check_output_file(html_path, {db_path}, "-o");
  const std::vector<Aggregate> rows = aggregate_units(units, reference);
  const std::vector<ServingPoint> points = serving_points(serving);
  std::string md, html;
  if (units.empty()) {  // a db of serving runs alone
    md = "# kvbench serving report\n\n" + render_serving_markdown(points);
    html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           "<title>kvbench serving report</title>\n<style>\n" + std::string(kStyle) +
           "</style>\n</head>\n<body>\n<h1>kvbench serving report</h1>\n" +
           render_serving_html(points) + "</body>\n</html>\n";
  } else {
    md = render_leaderboard_markdown(runs, rows);
    html = render_leaderboard_html(runs, rows, first_sample_head_maps(units));
    if (!points.empty()) {
      md += "\n" + render_serving_markdown(points);
      html.insert(html.rfind("</body>"), render_serving_html(points));
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec || !std::filesystem::is_directory(out_dir, ec)) {
    throw InputError("OUT_DIR: cannot create the report directory (" + out_dir + ": " +
                     (ec ? ec.message() : std::string("not a directory")) + ")");
  }
  write_files_atomically({{md_path, md}, {html_path, html}}, "report");
}

}  // namespace kvbench
