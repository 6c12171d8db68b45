#include "reports/regression_check.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "common/input_error.h"
#include "common/json_input.h"

namespace kvbench {

namespace {

using nlohmann::json;
using Key = std::tuple<std::string, std::string, std::string, std::string>;

Key key_of(const Aggregate& a) { return {a.method, a.task, a.mode, a.budget}; }

}  // namespace

Tolerances parse_tolerances(const std::string& text) {
  Tolerances t;
  std::stringstream in(text);
  std::string item;
  const std::string form = " (form: accuracy=0,fidelity=0.05,memory=0.05,speed=0.3)";
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw InputError("--tolerance '" + text + "': '" + item + "' has no value" + form);
    const std::string name = item.substr(0, eq);
    double value = 0;
    try {
      size_t used = 0;
      const std::string number = item.substr(eq + 1);
      // A plain decimal: stod also reads "inf", "nan" and hexadecimal ("0x10").
      if (number.find_first_not_of("0123456789.eE+-") != std::string::npos) {
        throw std::invalid_argument("not decimal");
      }
      value = std::stod(number, &used);
      if (used != number.size() || !(value >= 0 && value <= 1e6)) throw std::invalid_argument("range");
    } catch (const std::exception&) {
      throw InputError("--tolerance '" + text + "': " + name + " must be a decimal number in [0, 1e6]" + form);
    }
    if (name == "accuracy") {
      t.accuracy = value;
    } else if (name == "fidelity") {
      t.fidelity = value;
    } else if (name == "memory") {
      t.memory = value;
    } else if (name == "speed") {
      t.speed = value;
    } else {
      throw InputError("--tolerance '" + text + "': unknown metric '" + name + "'" + form);
    }
  }
  return t;
}

std::string baseline_json(const std::vector<Aggregate>& rows) {
  json list = json::array();
  for (const Aggregate& a : rows) {
    json row = {{"method", a.method},          {"task", a.task},
                {"mode", a.mode},              {"budget", a.budget},
                {"kv_bytes", a.kv_bytes},      {"decode_tokens_per_s", a.decode_tokens_per_s},
                {"ttft_ms", a.ttft_ms}};
    row["accuracy"] = a.accuracy ? json(*a.accuracy) : json(nullptr);
    if (a.accuracy && a.accuracy_ci) {
      row["accuracy_low"] = a.accuracy_ci->low;
      row["accuracy_high"] = a.accuracy_ci->high;
      row["scored_turns"] = a.accuracy_ci->n;
    }
    row["top1_agreement"] = a.top1_agreement ? json(*a.top1_agreement) : json(nullptr);
    list.push_back(row);
  }
  return dump_json(json({{"kvbench_baseline", 1}, {"rows", list}}), 2) + "\n";
}

std::vector<Aggregate> parse_baseline(const std::string& json_text, const std::string& source) {
  const json root = parse_json_input(json_text, source);
  // Compared as JSON values: a string or null version is "not a baseline", not a type error.
  if (!root.is_object() || !root.contains("kvbench_baseline") || root["kvbench_baseline"] != 1 ||
      !root.contains("rows") || !root["rows"].is_array()) {
    throw InputError(source + ": not a kvbench baseline (expected {\"kvbench_baseline\": 1, \"rows\": [...]})");
  }
  std::vector<Aggregate> out;
  size_t i = 0;
  for (const json& row : root["rows"]) {
    const std::string where = source + ": rows[" + std::to_string(i++) + "]";
    // Numbers are checked for type and range before use: nlohmann converts a float to an
    // integer with a plain cast, undefined outside the integer's range.
    const auto number = [&](const char* key, double lo, double hi) {
      const json& v = row.at(key);
      if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
        throw InputError(where + ": " + key + " must be a number in [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "]");
      }
      return v.get<double>();
    };
    const auto fraction = [&](const char* key) { return number(key, 0, 1); };
    constexpr double kHuge = 1e300;
    try {
      Aggregate a;
      a.method = row.at("method").get<std::string>();
      a.task = row.at("task").get<std::string>();
      a.mode = row.at("mode").get<std::string>();
      a.budget = row.at("budget").get<std::string>();
      a.kv_bytes = number("kv_bytes", 0, kHuge);
      a.decode_tokens_per_s = number("decode_tokens_per_s", 0, kHuge);
      a.ttft_ms = number("ttft_ms", 0, kHuge);
      if (!row.at("accuracy").is_null()) {
        a.accuracy = fraction("accuracy");
        if (!row.contains("accuracy_low")) {
          throw InputError(where + ": has no accuracy interval (a baseline from before "
                           "intervals); regenerate it with kvbench check DB --write-baseline");
        }
        const json& turns = row.at("scored_turns");
        if (!turns.is_number_integer() || turns.get<int64_t>() < 1) {
          throw InputError(where + ": scored_turns must be a positive integer");
        }
        a.accuracy_ci = Interval{*a.accuracy, fraction("accuracy_low"), fraction("accuracy_high"),
                                 turns.get<int64_t>()};
        if (!(a.accuracy_ci->low <= *a.accuracy && *a.accuracy <= a.accuracy_ci->high)) {
          throw InputError(where + ": accuracy must lie in [accuracy_low, accuracy_high]");
        }
      }
      if (!row.at("top1_agreement").is_null()) a.top1_agreement = fraction("top1_agreement");
      out.push_back(a);
    } catch (const json::exception& e) {
      throw InputError(where + ": missing or mistyped field (" + std::string(e.what()).substr(0, 120) + ")");
    }
  }
  if (out.empty()) {
    throw InputError(source + ": the baseline has no rows; a gate against nothing would pass "
                     "any run");
  }
  return out;
}

namespace {

// How much faster or slower this db's machine ran than the baseline's, per task and mode: the
// median over the rows both have of db / baseline (TTFT; tok/s likewise), so a host faster or
// slower as a whole (shared, noisy machines) moves every limit alike, one noisy row moves
// none, and a method that slowed beside the others still stands out. Fewer than three rows: 1
// (as measured).
class MachineScale {
 public:
  MachineScale(const std::map<Key, const Aggregate*>& now, const std::vector<Aggregate>& baseline) {
    for (const Aggregate& b : baseline) {
      const auto it = now.find(key_of(b));
      if (it == now.end()) continue;
      if (b.ttft_ms > 0 && it->second->ttft_ms > 0) {
        ttft_[{b.task, b.mode}].push_back(it->second->ttft_ms / b.ttft_ms);
      }
      if (b.decode_tokens_per_s > 0 && it->second->decode_tokens_per_s > 0) {
        tps_[{b.task, b.mode}].push_back(it->second->decode_tokens_per_s / b.decode_tokens_per_s);
      }
    }
  }
  double ttft(const Aggregate& b) const { return median(ttft_, b); }
  double decode(const Aggregate& b) const { return median(tps_, b); }

 private:
  using Ratios = std::map<std::pair<std::string, std::string>, std::vector<double>>;
  static double median(const Ratios& ratios, const Aggregate& b) {
    const auto it = ratios.find({b.task, b.mode});
    if (it == ratios.end() || it->second.size() < 3) return 1.0;
    std::vector<double> r = it->second;
    std::sort(r.begin(), r.end());
    const size_t n = r.size();
    return n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
  }
  Ratios ttft_, tps_;
};

std::map<Key, const Aggregate*> index_rows(const std::vector<Aggregate>& rows) {
  std::map<Key, const Aggregate*> out;
  for (const Aggregate& a : rows) out[key_of(a)] = &a;
  return out;
}

}  // namespace

std::vector<Regression> find_regressions(const std::vector<Aggregate>& current,
                                         const std::vector<Aggregate>& baseline,
                                         const Tolerances& tol) {
  const auto now = index_rows(current);
  const MachineScale machine(now, baseline);
  std::vector<Regression> out;
  for (const Aggregate& b : baseline) {
    auto add = [&](const char* metric, double base, double cur, double limit) {
      out.push_back({b.method, b.task, b.mode, b.budget, metric, base, cur, limit});
    };
    const auto it = now.find(key_of(b));
    if (it == now.end()) {
      add("missing", 0, 0, 0);
      continue;
    }
    const Aggregate& c = *it->second;
    if (b.accuracy) {
      // Intervals, not means: a regression is when the db's whole 95% interval lies below the
      // baseline's (less the tolerance), so one flipped answer in a small cell is not one.
      const double limit = b.accuracy_ci->low - tol.accuracy;
      const double cur = c.accuracy_ci ? c.accuracy_ci->high : 0.0;
      if (cur < limit - 1e-12) add("accuracy", *b.accuracy, cur, limit);
    }
    if (b.top1_agreement) {
      const double limit = *b.top1_agreement - tol.fidelity;
      const double cur = c.top1_agreement.value_or(0.0);
      if (cur < limit - 1e-12) add("top-1", *b.top1_agreement, cur, limit);
    }
    const double kv_limit = b.kv_bytes * (1 + tol.memory);
    if (c.kv_bytes > kv_limit + 0.5) add("KV bytes", b.kv_bytes, c.kv_bytes, kv_limit);
    // The baseline's speed carried over to this machine.
    if (b.decode_tokens_per_s > 0) {
      const double limit = b.decode_tokens_per_s * machine.decode(b) * (1 - tol.speed);
      if (c.decode_tokens_per_s < limit) add("decode tok/s", b.decode_tokens_per_s, c.decode_tokens_per_s, limit);
    }
    if (b.ttft_ms > 0) {
      const double limit = b.ttft_ms * machine.ttft(b) * (1 + tol.speed);
      if (c.ttft_ms > limit) add("TTFT ms", b.ttft_ms, c.ttft_ms, limit);
    }
  }
  return out;
}

SpeedMargins speed_margins(const std::vector<Aggregate>& current,
                           const std::vector<Aggregate>& baseline) {
  const auto now = index_rows(current);
  const MachineScale machine(now, baseline);
  SpeedMargins out;
  for (const Aggregate& b : baseline) {
    const auto it = now.find(key_of(b));
    if (it == now.end()) continue;
    const Aggregate& c = *it->second;
    const auto at = [&](double ratio) {
      return SpeedMargin{b.method, b.task, b.mode, b.budget, ratio};
    };
    if (b.ttft_ms > 0 && c.ttft_ms > 0) {
      const double r = c.ttft_ms / (b.ttft_ms * machine.ttft(b));
      if (!out.ttft || r > out.ttft->ratio) out.ttft = at(r);
    }
    if (b.decode_tokens_per_s > 0 && c.decode_tokens_per_s > 0) {
      const double r = c.decode_tokens_per_s / (b.decode_tokens_per_s * machine.decode(b));
      if (!out.decode || r < out.decode->ratio) out.decode = at(r);
    }
  }
  return out;
}

std::string render_speed_margins(const SpeedMargins& m, const Tolerances& tol) {
  std::string out;
  char line[512];
  const auto row = [&](const char* metric, const std::optional<SpeedMargin>& s, double limit) {
    if (!s) return;
    std::snprintf(line, sizeof line,
                  "check: worst %s beside the run's others: %.2fx its baseline (limit %.2fx), %s "
                  "%s %s%s%s\n",
                  metric, s->ratio, limit, s->method.c_str(), s->task.c_str(), s->mode.c_str(),
                  s->budget.empty() ? "" : " ", s->budget.c_str());
    out += line;
  };
  row("TTFT", m.ttft, 1 + tol.speed);
  row("decode tok/s", m.decode, 1 - tol.speed);
  return out;
}

std::string render_regressions(const std::vector<Regression>& regressions, size_t compared) {
  std::string out;
  char line[512];
  if (regressions.empty()) {
    std::snprintf(line, sizeof line, "check: no regressions in %zu baseline rows\n", compared);
    return line;
  }
  std::snprintf(line, sizeof line, "check: %zu regression%s in %zu baseline rows\n",
                regressions.size(), regressions.size() == 1 ? "" : "s", compared);
  out += line;
  std::snprintf(line, sizeof line, "%-40s %-20s %-13s %-14s %-13s %14s %14s %14s\n", "method",
                "task", "mode", "budget", "metric", "baseline", "now", "limit");
  out += line;
  for (const Regression& r : regressions) {
    if (r.metric == "missing") {
      std::snprintf(line, sizeof line, "%-40s %-20s %-13s %-14s %-13s %14s %14s %14s\n",
                    r.method.c_str(), r.task.c_str(), r.mode.c_str(), r.budget.c_str(),
                    "missing", "-", "not in db", "-");
    } else {
      std::snprintf(line, sizeof line, "%-40s %-20s %-13s %-14s %-13s %14.4f %14.4f %14.4f\n",
                    r.method.c_str(), r.task.c_str(), r.mode.c_str(), r.budget.c_str(),
                    r.metric.c_str(), r.baseline, r.current, r.limit);
    }
    out += line;
  }
  for (const Regression& r : regressions) {
    if (r.metric != "accuracy") continue;
    out += "accuracy: now is the top of the db's 95% interval, limit the bottom of the "
           "baseline's less the tolerance\n";
    break;
  }
  return out;
}

}  // namespace kvbench
