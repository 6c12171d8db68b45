#include "harness/sweep_config.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>

#include "cache/registry.h"
#include "common/files.h"
#include "common/input_error.h"
#include "common/json_input.h"
#include "harness/plugins.h"
#include "harness/session_mode.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw InputError(source + ": " + what);
}

std::string value_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  return "";
}

// "budget=128" / "ratio=0.25" from a number or a string; "" when it is neither, or out of
// range (a budget of at least one token, a ratio in (0, 1]).
std::string budget_text(const json& v) {
  std::string s;
  if (v.is_number_integer() || v.is_number_unsigned()) {
    s = "budget=" + v.dump();
  } else if (v.is_string()) {
    s = v.get<std::string>();
  }
  const bool tokens = s.rfind("budget=", 0) == 0;
  if (!tokens && s.rfind("ratio=", 0) != 0) return "";
  const std::string number = s.substr(s.find('=') + 1);
  try {
    size_t used = 0;
    if (tokens) {
      const long long n = std::stoll(number, &used);
      if (used == number.size() && n >= 1) return s;
    } else {
      const double r = std::stod(number, &used);
      if (used == number.size() && r > 0 && r <= 1) return s;
    }
  } catch (const std::exception&) {
  }
  return "";
}

// The budget part of a resolved eviction spec ("budget=1024" or "ratio=0.25"), "" for full.
// The component a sweep's budget goes to: the first that takes one ("snapkv" in
// "snapkv+kivi:bits=2" and in "adakv+snapkv"), or -1.
int budget_component(const ResolvedSpec& spec) {
  for (size_t i = 0; i < spec.components.size(); ++i) {
    for (const ParamInfo& p : spec.components[i].first->params) {
      if (p.name == "budget") return static_cast<int>(i);
    }
  }
  return -1;
}

std::string budget_of(const ResolvedSpec& spec) {
  const int i = budget_component(spec);
  if (i < 0) return "";
  const MethodParams& p = spec.components[i].second;
  if (p.has("ratio")) return "ratio=" + p.get("ratio");
  if (p.has("budget")) return "budget=" + p.get("budget");
  return "";
}

SweepTask parse_task(const json& v, const std::string& source, size_t index) {
  const std::string where = "tasks[" + std::to_string(index) + "]";
  SweepTask task;
  if (v.is_string()) {
    task.name = v.get<std::string>();
  } else if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      if (key == "task") {
        if (!value.is_string()) fail(source, where + ".task must be a string");
        task.name = value.get<std::string>();
      } else if (key == "data") {
        if (!value.is_string() || value.get<std::string>().empty()) {
          fail(source, where + ".data must be a string (a JSONL file)");
        }
        // Relative to the config's folder, as plugins are.
        std::filesystem::path file = value.get<std::string>();
        if (file.is_relative()) file = std::filesystem::path(source).parent_path() / file;
        task.data = file.string();
      } else if (key == "knobs") {
        if (!value.is_object()) fail(source, where + ".knobs must be an object of name: value");
        for (const auto& [name, knob] : value.items()) {
          const std::string text = value_text(knob);
          if (text.empty()) {
            fail(source, where + ".knobs." + name + " must be a string or an integer");
          }
          task.knobs[name] = text;
        }
      } else {
        fail(source, where + ": unknown key '" + key + "' (keys: task, knobs, data)");
      }
    }
    if (task.name.empty()) fail(source, where + " has no 'task'");
  } else {
    fail(source, where + " must be a task name or an object {\"task\", \"knobs\", \"data\"}");
  }
  try {
    const TaskFormat& format = task_format(task.name);
    if (format.source == TaskSource::Scbench && task.data.empty()) {
      fail(source, where + ": " + task.name + " is an SCBench task and needs \"data\": FILE.jsonl");
    }
    if (format.source == TaskSource::Generated && !task.data.empty()) {
      fail(source, where + ": " + task.name + " is generated; \"data\" is for SCBench tasks");
    }
    if (format.source == TaskSource::Scbench && !task.knobs.empty()) {
      fail(source, where + ": knobs are for generated tasks, not " + task.name);
    }
  } catch (const InputError& e) {
    const std::string what = e.what();
    if (what.rfind(source + ":", 0) == 0) throw;
    fail(source, where + ": " + what);
  }
  return task;
}

template <typename T>
T number_field(const json& v, const std::string& source, const std::string& key, T lo, T hi) {
  if (!v.is_number_integer() && !v.is_number_unsigned()) fail(source, key + " must be an integer");
  // An unsigned value past int64's range would wrap to a negative one: compared as unsigned,
  // and the error shows the number as the file wrote it.
  const bool too_large = v.is_number_unsigned() &&
                         v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const auto x = too_large ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
  if (too_large || x < static_cast<int64_t>(lo) || x > static_cast<int64_t>(hi)) {
    fail(source, key + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], not " + v.dump());
  }
  return static_cast<T>(x);
}

const json& list_field(const json& v, const std::string& source, const std::string& key) {
  if (!v.is_array()) fail(source, key + " must be a list");
  if (v.empty()) fail(source, key + " is an empty list");
  return v;
}

}  // namespace

std::string SweepTask::label() const {
  if (knobs.empty()) return name;
  std::string out = name + "[";
  bool first = true;
  for (const auto& [k, v] : knobs) {
    out += (first ? "" : ",") + k + "=" + v;
    first = false;
  }
  return out + "]";
}


SweepConfig default_sweep_config() {
  return load_sweep_config(std::string(KVBENCH_SOURCE_DIR) + "/" + kDefaultSweepConfig);
}

SweepConfig parse_sweep_config(const std::string& json_text, const std::string& source) {
  const json root = parse_json_input(json_text, source);
  if (!root.is_object()) fail(source, "the config must be a JSON object");
  SweepConfig config;
  bool has_tasks = false, has_methods = false;
  for (const auto& [key, v] : root.items()) {
    if (key == "tasks") {
      has_tasks = true;
      const json& list = list_field(v, source, key);
      for (size_t i = 0; i < list.size(); ++i) config.tasks.push_back(parse_task(list[i], source, i));
    } else if (key == "methods") {
      has_methods = true;
      for (const json& m : list_field(v, source, key)) {
        if (!m.is_string()) fail(source, "methods must be a list of spec strings");
        config.methods.push_back(m.get<std::string>());
      }
    } else if (key == "budgets") {
      for (const json& b : list_field(v, source, key)) {
        const std::string text = budget_text(b);
        if (text.empty()) {
          std::string shown = dump_json(b);
          if (shown.size() > 80) shown = shown.substr(0, 80) + "...";
          fail(source, "budgets must be token counts >= 1 (128) or \"ratio=r\" with r in (0, 1], not " +
                           shown);
        }
        config.budgets.push_back(text);
      }
    } else if (key == "modes") {
      config.modes.clear();
      for (const json& m : list_field(v, source, key)) {
        if (!m.is_string()) fail(source, "modes must be a list of strings");
        try {
          config.modes.push_back(to_string(parse_session_mode(m.get<std::string>())));
        } catch (const InputError& e) {
          fail(source, std::string("modes: ") + e.what());
        }
      }
    } else if (key == "query_settings") {
      config.query_settings.clear();
      for (const json& q : list_field(v, source, key)) {
        if (!q.is_string()) fail(source, "query_settings must be a list of strings");
        try {
          config.query_settings.push_back(to_string(parse_query_setting(q.get<std::string>())));
        } catch (const InputError& e) {
          fail(source, std::string("query_settings: ") + e.what());
        }
      }
    } else if (key == "turn_gaps_s") {
      config.turn_gaps_s.clear();
      for (const json& g : list_field(v, source, key)) {
        if (!g.is_number() || !(g.get<double>() >= 0) || !std::isfinite(g.get<double>())) {
          fail(source, "turn_gaps_s must be a list of seconds >= 0, not " + dump_json(g));
        }
        config.turn_gaps_s.push_back(g.get<double>());
      }
    } else if (key == "seeds") {
      config.seeds.clear();
      for (const json& s : list_field(v, source, key)) {
        config.seeds.push_back(number_field<uint64_t>(s, source, "seeds[]", 0, uint64_t{1} << 62));
      }
    } else if (key == "samples") {
      config.samples = number_field<int32_t>(v, source, key, 1, 100000);
    } else if (key == "turns") {
      config.turns = number_field<int32_t>(v, source, key, 1, 1000);
    } else if (key == "context_tokens") {
      config.context_tokens = number_field<int64_t>(v, source, key, 1, int64_t{1} << 24);
    } else if (key == "max_new") {
      config.max_new = number_field<int32_t>(v, source, key, 0, 1 << 20);
    } else if (key == "fidelity") {
      if (!v.is_boolean()) fail(source, "fidelity must be true or false");
      config.fidelity = v.get<bool>();
    } else if (key == "shared_prefill") {
      if (!v.is_boolean()) fail(source, "shared_prefill must be true or false");
      config.shared_prefill = v.get<bool>();
    } else if (key == "plugins") {
      for (const json& p : list_field(v, source, key)) {
        if (!p.is_string() || p.get<std::string>().empty()) {
          fail(source, "plugins must be a list of shared-object paths");
        }
        std::filesystem::path file = p.get<std::string>();
        if (file.is_relative()) file = std::filesystem::path(source).parent_path() / file;
        try {
          load_plugin(file.string());
        } catch (const InputError& e) {
          fail(source, e.what());
        }
      }
    } else if (key == "model") {
      if (!v.is_string() || v.get<std::string>().empty()) {
        fail(source, "model must be a short name (kvbench list models) or a GGUF path");
      }
      config.model = v.get<std::string>();
    } else if (key == "min_full_accuracy") {
      if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1)) {
        fail(source, "min_full_accuracy must be a number in [0, 1]");
      }
      config.min_full_accuracy = v.get<double>();
    } else if (key == "max_no_context_accuracy") {
      if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1)) {
        fail(source, "max_no_context_accuracy must be a number in [0, 1]");
      }
      config.max_no_context_accuracy = v.get<double>();
    } else {
      fail(source, "unknown key '" + key + "' (keys: tasks, methods, budgets, modes, "
                   "query_settings, turn_gaps_s, seeds, samples, turns, context_tokens, "
                   "max_new, fidelity, shared_prefill, model, min_full_accuracy, "
                   "max_no_context_accuracy, plugins)");
    }
  }
  if (!has_tasks) fail(source, "missing 'tasks'");
  if (!has_methods) fail(source, "missing 'methods'");
  // An entry given twice would compute its units and then fail to write them again: refused
  // before any work.
  const auto distinct = [&](const auto& values, const char* key) {
    for (size_t i = 0; i < values.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (values[i] == values[j]) {
          fail(source, std::string(key) + ": " + dump_json(json(values[i])) + " is listed twice");
        }
      }
    }
  };
  distinct(config.methods, "methods");
  distinct(config.budgets, "budgets");
  distinct(config.modes, "modes");
  distinct(config.query_settings, "query_settings");
  distinct(config.turn_gaps_s, "turn_gaps_s");
  distinct(config.seeds, "seeds");
  std::set<std::string> labels;
  for (const SweepTask& t : config.tasks) {
    if (!labels.insert(t.label()).second) fail(source, "task " + t.label() + " is listed twice");
  }
  try {
    // Every spec, with every budget, must resolve, and run in every query setting.
    for (const SweepMethod& m : sweep_methods(config)) {
      for (const std::string& q : config.query_settings) {
        check_query_setting(m.spec, parse_query_setting(q));
      }
    }
  } catch (const InputError& e) {
    fail(source, e.what());
  }
  return config;
}

SweepConfig load_sweep_config(const std::string& path) {
  return parse_sweep_config(read_regular_file(path, "sweep config"), path);
}

std::string canonical_config_json(const SweepConfig& config) {
  json tasks = json::array();
  for (const SweepTask& t : config.tasks) {
    json task = {{"task", t.name}, {"knobs", t.knobs}};
    if (!t.data.empty()) task["data"] = t.data;
    tasks.push_back(task);
  }
  json methods = json::array();
  for (const SweepMethod& m : sweep_methods(config)) methods.push_back(m.spec.canonical);
  json root = {{"tasks", tasks},
               {"methods", methods},
               {"modes", config.modes},
               {"seeds", config.seeds},
               {"samples", config.samples},
               {"turns", config.turns},
               {"context_tokens", config.context_tokens},
               {"max_new", config.max_new},
               {"fidelity", config.fidelity}};
  if (!config.shared_prefill) root["shared_prefill"] = false;  // the default left out
  // Left out at their defaults too, so a config from before them compares equal.
  if (config.query_settings != std::vector<std::string>{"agnostic"}) {
    root["query_settings"] = config.query_settings;
  }
  if (config.turn_gaps_s != std::vector<double>{0}) root["turn_gaps_s"] = config.turn_gaps_s;
  if (!config.model.empty()) root["model"] = config.model;
  if (config.min_full_accuracy > 0) root["min_full_accuracy"] = config.min_full_accuracy;
  if (config.max_no_context_accuracy != kDefaultMaxNoContextAccuracy) {
    root["max_no_context_accuracy"] = config.max_no_context_accuracy;
  }
  if (!config.excluded_tasks.empty()) {
    json excluded = json::array();
    for (const ExcludedTask& t : config.excluded_tasks) {
      excluded.push_back({{"task", t.task}, {"reason", t.reason}});
    }
    root["excluded_tasks"] = excluded;
  }
  if (!config.calibrated_tasks.empty()) {
    json calibrated = json::array();
    for (const CalibratedTask& t : config.calibrated_tasks) {
      calibrated.push_back({{"task", t.task},
                            {"accuracy", t.accuracy},
                            {"no_context_accuracy", t.no_context_accuracy}});
    }
    root["calibrated_tasks"] = calibrated;
  }
  return dump_json(root);  // nlohmann's object keys are sorted
}

std::vector<SweepMethod> sweep_methods(const SweepConfig& config) {
  std::vector<SweepMethod> out;
  std::set<std::string> seen;
  auto add = [&](ResolvedSpec spec) {
    if (!seen.insert(spec.canonical).second) return;
    std::string budget = budget_of(spec);
    out.push_back({std::move(spec), std::move(budget)});
  };
  for (const std::string& method : config.methods) {
    const MethodSpec written = parse_method_spec(method);
    ResolvedSpec base = resolve_method_spec(written);
    const int at = budget_component(base);
    if (base.is_full() || config.budgets.empty() || at < 0) {
      add(std::move(base));
      continue;
    }
    const MethodParams& given = base.components[at].second;
    if (given.given("budget") || given.given("ratio")) {
      throw InputError("method '" + method + "' sets its own budget; the sweep's budgets apply to "
                       "methods given without one");
    }
    for (const std::string& budget : config.budgets) {
      add(resolve_method_spec(with_method_param(written, at, parse_method_param(budget))));
    }
  }
  return out;
}

Shard parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  Shard shard;
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    size_t used = 0;
    shard.index = std::stoi(text.substr(0, slash), &used);
    if (used != slash) throw std::invalid_argument("index");
    const std::string count = text.substr(slash + 1);
    shard.count = std::stoi(count, &used);
    if (used != count.size()) throw std::invalid_argument("count");
  } catch (const std::exception&) {
    throw InputError("shard '" + text + "' must be i/n with 0 <= i < n (e.g. 0/4)");
  }
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count) {
    throw InputError("shard '" + text + "' must be i/n with 0 <= i < n (e.g. 0/4)");
  }
  return shard;
}

Shard shard_from_environment() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  auto number = [](const std::string& name, const std::string& value) {
    try {
      size_t used = 0;
      const int n = std::stoi(value, &used);
      if (used == value.size()) return n;
    } catch (const std::exception&) {
    }
    throw InputError("environment variable " + name + "='" + value + "' is not an integer");
  };
  const std::string slurm_id = env("SLURM_ARRAY_TASK_ID");
  if (!slurm_id.empty()) {
    const std::string count = env("SLURM_ARRAY_TASK_COUNT");
    if (count.empty()) throw InputError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not");
    const std::string min = env("SLURM_ARRAY_TASK_MIN");
    // In 64 bits: the difference of two ints can overflow an int (parse_shard then refuses
    // an index outside the count).
    const int64_t index = int64_t{number("SLURM_ARRAY_TASK_ID", slurm_id)} -
                          (min.empty() ? 0 : number("SLURM_ARRAY_TASK_MIN", min));
    return parse_shard(std::to_string(index) + "/" +
                       std::to_string(number("SLURM_ARRAY_TASK_COUNT", count)));
  }
  const std::string k8s_index = env("JOB_COMPLETION_INDEX");
  if (!k8s_index.empty()) {
    const std::string count = env("KVBENCH_SHARD_COUNT");
    if (count.empty()) {
      throw InputError("JOB_COMPLETION_INDEX is set but KVBENCH_SHARD_COUNT (the Job's "
                       "completions) is not");
    }
    return parse_shard(std::to_string(number("JOB_COMPLETION_INDEX", k8s_index)) + "/" +
                       std::to_string(number("KVBENCH_SHARD_COUNT", count)));
  }
  return Shard{};
}

}  // namespace kvbench
