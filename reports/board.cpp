#include "reports/board.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/input_error.h"
#include "common/method_spec.h"
#include "reports/html_text.h"

namespace kvbench::board {

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
std::string fmt(const std::optional<double>& v, int precision, double scale) {
  return v ? fmt(*v * scale, precision) : std::string(kMissing);
}

// Markdown table cells: reports/html_text.h.
std::string md_escape(const std::string& s) { return markdown_escape(s); }

// HTML text and attribute values (also inside SVG): reports/html_text.h.
std::string h(const std::string& s) { return html_escape(s); }

// At most `n` characters: reports/html_text.h.
std::string truncate(const std::string& s, size_t n) { return truncate_text(s, n); }

// A series' short name: its family, plus the parameters that not every other series of the
// family shares ("snapkv window=8,pool=max"); a composed spec keeps all but the family name.
std::string variant_name(const std::string& family, const std::string& series,
                         const std::set<std::string>& family_series) {
  if (family_series.size() <= 1) return family;
  // A series' parameters, "key=value" each; none for one that does not parse (an edited db).
  auto params_of = [](const std::string& spec) {
    std::vector<std::string> out;
    try {
      const MethodSpec parsed = parse_method_spec(spec);
      for (const auto& [key, value] : parsed.components.front().params) {
        out.push_back(key + "=" + value);
      }
    } catch (const InputError&) {
    }
    return out;
  };
  // A composed series (or one that does not parse) is named in full.
  if (family.find('+') != std::string::npos || family == series) return series;
  std::vector<std::vector<std::string>> others;  // each series of the family, parsed once
  for (const std::string& other : family_series) others.push_back(params_of(other));
  std::string differing;
  for (const std::string& param : params_of(series)) {
    const bool shared = std::all_of(others.begin(), others.end(), [&](const auto& ps) {
      return std::find(ps.begin(), ps.end(), param) != ps.end();
    });
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

extern const char* const kModesNote;
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

extern const char* const kTimeNote;
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

extern const char* const kTimeHead[5];
const char* const kTimeHead[5] = {"units", "wall s", "shared forward s", "reference s", "own s"};

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
    if (a.parts.family == "bf16" && a.first_token_kl) floor_kls.push_back(*a.first_token_kl);
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
    r.parts = list.front()->parts;
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
  for (const Row& r : b.rows) family_series[r.parts.family].insert(r.parts.series);
  std::map<std::string, int> seen;
  std::vector<std::string> shorts;
  for (const Row& r : b.rows) {
    // The variant may be cut; the budget and mode after it stay readable.
    std::string s = truncate(variant_name(r.parts.family, r.parts.series, family_series[r.parts.family]), 24);
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


namespace {

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

}  // namespace

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

}  // namespace kvbench::board
