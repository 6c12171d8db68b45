// kvbench's sub-commands. Each adds itself to the CLI11 app and runs when chosen.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/llama_model.h"
#include "harness/session_mode.h"

namespace CLI {
class App;
class Option;
}

namespace kvbench {

// Options every command that loads a model shares.
struct ModelOptions {
  std::string model_path;  // --model; empty: $KVBENCH_MODEL, else the bundled default
  int threads = 0;         // --threads; 0: OpenMP's default
  std::string device = "cpu";  // --device: cpu or cuda
  std::string dtype = "fp32";  // --dtype: fp32, or bf16 with --device cuda
  std::string decode_activations = "fp32";  // --decode-activations: fp32, or int8 on the CPU
  std::string prefill_activations = "fp32";  // --prefill-activations: the same for prefill GEMMs
  std::vector<std::string> plugins;  // --plugin, repeated: loaded before any command runs
};

// --device as the model's device.
ModelDevice model_device(const ModelOptions& options);
// --dtype as the model's dtype.
ModelDtype model_dtype(const ModelOptions& options);
// --decode-activations as the model's setting.
CpuActivations cpu_activations(const ModelOptions& options);
// Throws InputError naming --dtype when it asks for bf16 without --device cuda, and
// --decode-activations when it asks for int8 with it.
void check_dtype_option(const ModelOptions& options);
// Loads the model at `path` as the options say: device, dtype and decode activations.
std::unique_ptr<LlamaModel> load_model(const std::string& path, const ModelOptions& options);

// Sets the compute thread count from --threads (before any kernel runs).
void apply_thread_option(const ModelOptions& options);

// The model file to load; throws InputError with set-up advice when it does not exist.
std::string resolve_model_path(const ModelOptions& options);

// A run's provenance: kvbench's version and git sha, the host and the command line.
struct RunRecord;
void fill_provenance(RunRecord& run);

// A generated task as --task names it: "name" or "name[knob=value,...]" (SweepTask::label()).
// Throws InputError for another form or a task that is not generated.
struct SweepTask;
SweepTask parse_task_label(const std::string& label);

// Thrown by a command whose check failed after printing why: exit code 1.
struct CheckFailed {};

// The command line as given (main records it): stored with every run in a results db.
void set_command_line(int argc, char** argv);
const std::string& command_line();

struct SweepConfig;
struct Shard;
struct UnitResult;

// Runs `config` (shard `shard`) into the results db at `db_path`, printing progress to
// stderr (a bar with ETA on a terminal, a plain line per unit otherwise). Loads the model.
// `on_unit` (optional) sees every unit as it is committed.
// A config with "model" runs that model; with "min_full_accuracy", the tasks its
// calibration puts below it are left out (printed, and recorded in the run's config).
// `rerun` (sweep --rerun): methods whose units are deleted first and run again.
void run_sweep_into(const ModelOptions& model, SweepConfig config, const Shard& shard,
                    const std::string& db_path,
                    const std::function<void(const UnitResult&)>& on_unit = nullptr,
                    const std::vector<std::string>& rerun = {});

// Writes leaderboard.md and leaderboard.html for the db into out_dir and prints their paths;
// reference: "bf16" or "fp32" (reports/aggregate.h, KvReference).
void write_reports_for(const std::string& db_path, const std::string& out_dir,
                       const std::string& reference = "bf16");
// The `--reference bf16|fp32` option of the commands that write reports.
void add_reference_option(CLI::App* cmd, std::string& reference);

// `--query-aware` and `--turn-gap`, as `run` and `session` take them.
struct QuerySettingArgs {
  bool query_aware = false;          // the first query inside the compressed span
  double turn_gap_s = 0;             // multi-request: simulated seconds between requests
  const CLI::Option* gap = nullptr;  // --turn-gap, once added
};
void add_query_setting_options(CLI::App* cmd, QuerySettingArgs& args);
QuerySetting query_setting(const QuerySettingArgs& args);
// InputError for a --turn-gap below 0 or not finite, or one given outside multi-request.
void check_turn_gap(const QuerySettingArgs& args, SessionMode mode);

void add_calibrate_command(CLI::App& app, ModelOptions& model);
void add_generate_command(CLI::App& app, ModelOptions& model);
void add_list_command(CLI::App& app, ModelOptions& model);
void add_session_command(CLI::App& app, ModelOptions& model);
// `kvbench score`: another tool's answers scored by kvbench's scorers.
void add_score_command(CLI::App& app);
void add_run_command(CLI::App& app, ModelOptions& model);
void add_sweep_command(CLI::App& app, ModelOptions& model);  // sweep, merge
void add_report_command(CLI::App& app);                       // report, check
void add_serve_command(CLI::App& app, ModelOptions& model);
void add_load_command(CLI::App& app, ModelOptions& model);
// `kvbench probe-heads`: duo_attention's head probe at a chosen length, as a gate file.
void add_probe_heads_command(CLI::App& app, ModelOptions& model);

}  // namespace kvbench
