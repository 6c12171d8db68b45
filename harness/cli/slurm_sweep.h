// `kvbench sweep CONFIG --slurm DIR --shards N`: the sweep handed to Slurm. One array task a
// shard (its own db and log under DIR), then a merge-and-report job that waits for all of
// them (afterok). The same command again submits only the shards that are not finished
// (they resume their dbs) and a new merge job; `--status` lists each shard. docs/cluster.md.
#pragma once

#include <string>
#include <vector>

#include "harness/cli/commands.h"
#include "harness/sweep_config.h"

namespace kvbench {

struct SlurmArgs {
  std::string dir;                          // --slurm: dbs, logs, scripts, merged db, report
  int shards = 0;                           // --shards (0: the submission's, on a rerun)
  bool status = false;                      // --status: list, submit nothing
  std::string time;                         // --time: Slurm's form; default from the estimate
  std::string mem;                          // --mem: Slurm's form; default from the model
  std::vector<std::string> sbatch_options;  // --sbatch-option, repeated: passed to sbatch
};

void run_slurm_sweep(const ModelOptions& model, const std::string& config_path,
                     const SweepConfig& config, const SlurmArgs& args);

}  // namespace kvbench
