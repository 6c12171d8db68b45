// A sweep's config: tasks x methods x budgets x modes x seeds from JSON, parsed and checked
// without the model (harness/sweep.h runs it), and the shard a process runs.
//
// Config (every key but tasks and methods optional):
//   {"tasks":   ["retr_kv", {"task": "multihop_vt", "knobs": {"hops": 2}},
//                {"task": "scbench_kv", "data": "scbench_kv.jsonl"}],
//    "methods": ["full", "snapkv", "h2o:recent=0.25"],
//    "budgets": [128, 256, "ratio=0.25"],   // applied to every method with a budget
//    "modes":   ["multi-turn", "multi-request"],      // default ["multi-turn"]
//    "query_settings": ["agnostic", "aware"],          // default ["agnostic"]
//    "turn_gaps_s": [0, 60],         // multi-request: simulated seconds between requests
//                                    // (default [0]; multi-turn runs at 0 only)
//    "seeds":   [0, 1],                                // default [0]
//    "samples": 1, "turns": 5,       // per (task, seed); a task file: its first N, cut to turns
//    "context_tokens": 512,          // generated tasks
//    "max_new": 0,                                     // 0: each task's
//    "fidelity": true,
//    "model": "qwen2.5-0.5b",        // a short name or GGUF path; default: --model's
//    "min_full_accuracy": 0.8,       // leave out task settings the model's calibration
//                                    // (harness/calibration.h) puts below this
//    "max_no_context_accuracy": 0.2} // ... or, without the context, above this (default)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cache/registry.h"

namespace kvbench {

constexpr double kDefaultMaxNoContextAccuracy = 0.2;

struct SweepTask {
  std::string name;                          // a task of tasks/task_catalog.h
  std::map<std::string, std::string> knobs;  // generated tasks
  std::string data;                          // SCBench tasks: the JSONL file
  // "retr_kv", or with knobs "retr_kv[hops=2]": the task column of the results.
  std::string label() const;
};

// A task a sweep left out because the model cannot do it with the full cache.
struct ExcludedTask {
  std::string task;    // its label
  std::string reason;  // "full cache 40.0% (28-53) at 1024 tokens in calibration, below 80%"
};

// A task setting the calibration let in, with the numbers that let it in.
struct CalibratedTask {
  std::string task;  // its label
  double accuracy = 0;             // the full cache's, with the context
  double no_context_accuracy = 0;  // and without it
};

struct SweepConfig {
  std::vector<SweepTask> tasks;
  std::vector<std::string> methods;  // as given (budgets not yet applied)
  std::vector<std::string> budgets;  // "budget=128" / "ratio=0.25"; empty: methods as given
  std::vector<std::string> modes = {"multi-turn"};
  // "agnostic" (the context compressed before any question) and/or "aware" (after the
  // first query: harness/session.h, QuerySetting).
  std::vector<std::string> query_settings = {"agnostic"};
  std::vector<double> turn_gaps_s = {0};  // multi-request groups run each; multi-turn: 0
  std::vector<uint64_t> seeds = {0};
  int32_t samples = 1;
  int32_t turns = 5;
  int64_t context_tokens = 512;
  int32_t max_new = 0;
  bool fidelity = true;
  // Prefill each sample's context once for every method that can start from it
  // (harness/shared_prefill.h); false: every unit prefills its own.
  bool shared_prefill = true;
  std::string model;             // "" : the command's --model (or the default model)
  double min_full_accuracy = 0;  // 0: every task runs, calibrated or not
  // With min_full_accuracy: a setting the model answers this well without the context (the
  // calibration's no-context control) does not measure a cache, and is left out too.
  double max_no_context_accuracy = kDefaultMaxNoContextAccuracy;
  std::vector<ExcludedTask> excluded_tasks;  // filled by apply_calibration
  std::vector<CalibratedTask> calibrated_tasks;  // likewise, the tasks it kept
  // A config's "plugins" (shared objects whose methods it may name, paths relative to the
  // config) are loaded as it is read (harness/plugins.h) and kept nowhere here: a run records
  // the plugins its methods came from, by sha256 (harness/sweep.h, run_config_json).
};

// `kvbench run` with no task runs this config of the source tree.
inline constexpr const char* kDefaultSweepConfig = "configs/default.json";
SweepConfig default_sweep_config();

// Parses and validates a config; InputError naming `source` and the key for an unknown key,
// a wrong type, an empty list, an unknown task, mode or method, a budget that is not a
// positive integer or ratio=r, or a method spec that is invalid with a budget applied.
SweepConfig parse_sweep_config(const std::string& json_text, const std::string& source);
SweepConfig load_sweep_config(const std::string& path);  // InputError for an unreadable file

// The config as canonical JSON (sorted keys, defaults written out): stored with every run,
// and what merge compares between shards.
std::string canonical_config_json(const SweepConfig& config);

// The methods a sweep runs, each resolved once here with its budget text ("" for full or a
// method given without budgets): methods x budgets, full once, in config order. The sweep,
// its sessions and the db writer take them as they are.
struct SweepMethod {
  ResolvedSpec spec;
  std::string budget;  // "budget=128" / "ratio=0.25" / ""
};
std::vector<SweepMethod> sweep_methods(const SweepConfig& config);

struct Shard {
  int32_t index = 0;
  int32_t count = 1;
};

// "i/n" with 0 <= i < n; InputError otherwise.
Shard parse_shard(const std::string& text);
// The shard of an array job: SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT (minus
// SLURM_ARRAY_TASK_MIN, when set), else Kubernetes' JOB_COMPLETION_INDEX with
// KVBENCH_SHARD_COUNT; 0/1 when neither is set. InputError for malformed values.
Shard shard_from_environment();

}  // namespace kvbench
