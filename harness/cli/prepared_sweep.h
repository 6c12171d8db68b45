// What `kvbench sweep` checks before anything runs, shared by its three ways of running: one
// process, `--jobs N` worker processes, and `--slurm DIR` (a job array, harness/cli/slurm_sweep.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/calibration.h"
#include "harness/cli/commands.h"
#include "harness/sweep_config.h"
#include "store/results_db.h"

namespace kvbench {

// A sweep's config and run record as they will be stored, before the model loads: the
// model resolved and hashed, the calibration applied (its left-out tasks printed).
struct PreparedSweep {
  SweepConfig config;
  std::vector<SweepMethod> methods;  // sweep_methods(config): every spec resolved once, here
  RunRecord run;  // model path and sha256, config_json
  std::optional<Calibration> calibration;
};

PreparedSweep prepare_sweep(const ModelOptions& model_options, SweepConfig config, bool print);

// The command line that runs shard `shard` ("i/n") of the sweep at config_path into db_path
// with these model options, argv[0] being `program`.
std::vector<std::string> shard_command(const std::string& program, const ModelOptions& model,
                                       const std::string& config_path, const std::string& db_path,
                                       const std::string& shard);

// "1h05m" or "12m30s".
std::string duration_text(double seconds);

}  // namespace kvbench
