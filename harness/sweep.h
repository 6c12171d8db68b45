// Sweeps: the units of a config (harness/sweep_config.h) run into a results db one
// (sample, method) unit at a time, resumable (a rerun skips finished units) and split
// deterministically into shards (one db per shard, joined by merge_results).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/calibration.h"
#include "harness/evaluation.h"
#include "harness/model/model_dtype.h"
#include "harness/sweep_config.h"
#include "store/results_db.h"

namespace kvbench {

class LlamaModel;
class ResultsDb;
class Tokenizer;

struct Calibration;

// With min_full_accuracy set, moves every generated task whose calibrated full-cache
// accuracy at the sweep's context length is below it (or that has no calibration there)
// from tasks to excluded_tasks, with the reason. InputError when the calibration was
// measured on another model file (sha256 differs) or every task is left out.
void apply_calibration(SweepConfig& config, const Calibration& calibration,
                       const std::string& model_sha256, const std::string& calibration_file);

// The config as a run records it (RunRecord::config_json): canonical_config_json, plus
// "numerics" when the forward does not run the defaults (fp32 weights and activations), so
// that a db refuses to mix runs of different numerics and a report can say which ran.
std::string run_config_json(const SweepConfig& config, ModelDtype dtype,
                            CpuActivations activations);

struct SweepProgress {
  int64_t done = 0;     // units finished in this invocation
  int64_t total = 0;    // units this invocation runs (this shard, minus finished ones)
  int64_t skipped = 0;  // units of this shard already in the db
  double elapsed_s = 0;
  std::string last_unit;
  PrefillCount prefill;  // context tokens prefilled so far, shared and by units alone
  // This invocation's units per task, for the plan printed before the first unit: progress
  // is called once with done 0 before anything runs.
  std::vector<PlannedUnits> planned;
};

// The model a sweep runs on, loaded only once the shard has a unit to run: the samples are
// made with its tokenizer and window alone, so a resumed shard or a `--jobs` worker with
// nothing left never reads the weights.
struct SweepModel {
  const Tokenizer& tokenizer;
  int64_t context_length = 0;
  std::function<const LlamaModel&()> load;  // called at most once, before the first unit
};

// What each of `count` shards of a sweep runs, made from the samples alone (no weights
// loaded): its unit keys (a shard is finished when its db holds all of them) and its units
// per task (for estimate_sweep). The split is run_sweep's.
struct ShardPlan {
  std::vector<std::string> unit_keys;
  std::vector<PlannedUnits> planned;
};
std::vector<ShardPlan> plan_shards(const SweepModel& model, const SweepConfig& config,
                                   int32_t count);

// Runs the shard's units that the db does not have yet. Units are grouped by (task, seed,
// sample, mode) so a sample's full reference runs once for all its methods; groups go to
// shards round-robin in a fixed order. Each finished unit is committed to the db at once.
// `run` is the run record, its config_json as run_config_json gives it for the model's
// numerics; after each unit is committed, `on_unit` sees its result (e.g. to print its
// table) and `progress` the counts. Returns the final counts.
SweepProgress run_sweep(const SweepModel& model, const SweepConfig& config, const Shard& shard,
                        ResultsDb& db, const RunRecord& run,
                        const std::function<void(const SweepProgress&)>& progress,
                        const UnitSink& on_unit = nullptr);

// The same on a model already loaded (run.config_json set here from its numerics).
SweepProgress run_sweep(const LlamaModel& model, const SweepConfig& config, const Shard& shard,
                        ResultsDb& db, RunRecord run,
                        const std::function<void(const SweepProgress&)>& progress,
                        const UnitSink& on_unit = nullptr);

}  // namespace kvbench
