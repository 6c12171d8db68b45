// `kvbench calibrate`: the full cache's accuracy per generated task setting and context
// length on the current model, stored with the model's sha256 in
// configs/calibration/<model>.json; sweeps with "min_full_accuracy" run only the settings
// the model can do (harness/calibration.h).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "datasets/generator.h"
#include "harness/calibration.h"
#include "harness/cli/commands.h"
#include "harness/evaluation.h"
#include "common/files.h"
#include "common/input_error.h"
#include "harness/model/known_models.h"
#include "harness/model/llama_model.h"
#include "harness/sweep.h"
#include "reports/intervals.h"
#include "common/sha256.h"

namespace kvbench {

SweepTask parse_task_label(const std::string& label) {
  SweepTask task;
  const size_t open = label.find('[');
  task.name = label.substr(0, open);
  if (open != std::string::npos) {
    if (label.back() != ']') {
      throw InputError("--task '" + label + "' must be name or name[knob=value,...]");
    }
    const std::string inner = label.substr(open + 1, label.size() - open - 2);
    size_t start = 0;
    while (start <= inner.size()) {
      const size_t comma = std::min(inner.find(',', start), inner.size());
      const std::string knob = inner.substr(start, comma - start);
      const size_t eq = knob.find('=');
      if (eq == 0 || eq == std::string::npos || eq + 1 == knob.size()) {
        throw InputError("--task '" + label + "': knob '" + knob + "' must be name=value");
      }
      task.knobs[knob.substr(0, eq)] = knob.substr(eq + 1);
      start = comma + 1;
    }
  }
  bool generated = false;
  for (const TaskInfo& t : task_registry()) generated = generated || t.name == task.name;
  if (!generated) {
    throw InputError("--task '" + task.name + "' is not a generated task (kvbench list tasks)");
  }
  return task;
}

namespace {

struct CalibrateArgs {
  std::vector<std::string> tasks;  // labels: "retr_kv" or "retr_kv[key_length=8]"
  std::vector<int64_t> lengths = {512, 1024, 2048};
  int32_t samples = 5;
  int32_t turns = 5;
  uint64_t seed = 0;
  std::string output;  // default: calibration_path(model)
};


void run_calibrate(const ModelOptions& model_options, const CalibrateArgs& args) {
  apply_thread_option(model_options);
  std::vector<SweepTask> tasks;
  for (const std::string& label : args.tasks) tasks.push_back(parse_task_label(label));
  if (tasks.empty()) {
    for (const TaskInfo& t : task_registry()) tasks.push_back({t.name, {}, ""});
  }
  const std::string model_path = resolve_model_path(model_options);
  const std::string path = args.output.empty() ? calibration_path(model_path) : args.output;
  check_output_file(path, {model_path}, "-o");
  check_writable(path, "calibration file");  // before a cell is computed, not after
  const std::string sha = sha256_model(model_path);
  const std::string name = known_model_name(model_path);
  const std::string model_name =
      name.empty() ? std::filesystem::path(model_path).filename().string() : name;
  Calibration calibration;
  const auto same_model_and_seed = [&](const Calibration& c) {
    return c.model_sha256 == sha && c.seed == args.seed && c.model == model_name;
  };
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    calibration = load_calibration(path);
    if (!same_model_and_seed(calibration)) {
      throw InputError(path + ": holds a calibration of another model (name or file) or seed; "
                       "move it away or write elsewhere with -o");
    }
  } else {
    calibration.model = model_name;
    calibration.model_sha256 = sha;
    calibration.seed = args.seed;
  }
  auto model = load_model(model_path, model_options);
  // Before any sample is built: a 16M-token context took 30 s and gigabytes to refuse after.
  const int64_t window = model->config().context_length;
  for (const int64_t length : args.lengths) {
    if (length >= window) {
      throw InputError("--lengths " + std::to_string(length) + ": not shorter than the model's "
                       "context window of " + std::to_string(window) + " tokens");
    }
  }

  EvaluationOptions evaluation;  // multi-turn with gold answers appended: the sweeps' mode
  evaluation.session.max_new_tokens = 0;  // each task's decode budget, as sweeps use
  evaluation.fidelity = false;
  std::printf("calibrate: %s, full cache, multi-turn, %d samples x %d turns per cell, seed %llu; "
              "then the same questions without the context (no ctx)\n",
              calibration.model.c_str(), args.samples, args.turns,
              static_cast<unsigned long long>(args.seed));
  std::printf("%-36s %7s %7s %15s %9s %15s %6s %8s\n", "task", "tokens", "acc %", "95% interval",
              "no ctx %", "95% interval", "turns", "seconds");
  std::fflush(stdout);
  for (const SweepTask& task : tasks) {
    for (const int64_t length : args.lengths) {
      GeneratorOptions g;
      g.task = task.name;
      g.knobs = task.knobs;
      g.context_tokens = length;
      g.turns = args.turns;
      g.samples = args.samples;
      g.seed = args.seed;
      const std::vector<Sample> samples = generate_samples(g, model->tokenizer());
      check_samples_fit(*model, samples, evaluation);
      std::vector<std::vector<double>> scores;  // per sample, per turn
      const auto start = std::chrono::steady_clock::now();
      double prefill_ms = 0;  // the contexts' prefills, for the sweeps' time estimates
      evaluate(*model, samples, {full_cache_spec()}, evaluation, [&](const UnitResult& unit) {
        scores.push_back(unit.scores);
        prefill_ms += unit.session.context_prefill_ms;
      });
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // The control: the same questions with the context removed.
      std::vector<std::vector<double>> alone;
      evaluate(*model, without_context(samples), {full_cache_spec()}, evaluation,
               [&](const UnitResult& unit) { alone.push_back(unit.scores); });
      const Interval control = accuracy_interval(alone);
      CalibrationCell cell;
      cell.task = task.label();
      cell.context_tokens = length;
      cell.samples = args.samples;
      cell.turns = args.turns;
      const Interval interval = accuracy_interval(scores);
      cell.accuracy = interval.mean;
      cell.low = interval.low;
      cell.high = interval.high;
      cell.seconds = seconds;
      cell.prefill_seconds = prefill_ms / 1000;
      cell.no_context_accuracy = control.mean;
      cell.no_context_low = control.low;
      cell.no_context_high = control.high;
      // After every cell, so a stopped run keeps its cells; over the file as it is now, so
      // the cells another calibration of the model wrote meanwhile are kept too. The read,
      // the update and the write under one lock: otherwise two calibrations that read the
      // same file each write it back without the other's new cell.
      {
        const FolderLock lock(path, "calibration file");
        if (std::filesystem::exists(path, ec)) {
          Calibration now = load_calibration(path);
          if (same_model_and_seed(now)) calibration = std::move(now);
        }
        calibration.put(cell);
        save_calibration(calibration, path);
      }
      char bounds[32];
      std::snprintf(bounds, sizeof bounds, "%.1f-%.1f", 100 * cell.low, 100 * cell.high);
      char control_bounds[32];
      std::snprintf(control_bounds, sizeof control_bounds, "%.1f-%.1f", 100 * control.low,
                    100 * control.high);
      std::printf("%-36.36s %7lld %7.1f %15s %9.1f %15s %6d %8.1f\n", cell.task.c_str(),
                  static_cast<long long>(length), 100 * cell.accuracy, bounds,
                  100 * control.mean, control_bounds, cell.samples * cell.turns, cell.seconds);
      std::fflush(stdout);
    }
  }
  std::printf("calibrate: written to %s\n", path.c_str());
}

}  // namespace

void add_calibrate_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "The full cache's accuracy per task setting and context length on the model, "
                   "stored for sweeps with min_full_accuracy");
  cmd->add_option("--task", args->tasks,
                  "A generated task, optionally with knobs: retr_kv[key_length=8]; repeatable "
                  "(default: every generated task)");
  cmd->add_option("--lengths", args->lengths, "Context lengths in tokens (default 512 1024 2048)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  cmd->add_option("--samples", args->samples, "Samples per cell (default 5)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--turns", args->turns, "Turns per sample (default 5)")->check(CLI::Range(1, 1000));
  cmd->add_option("--seed", args->seed, "Seed of the generated samples (default 0)");
  cmd->add_option("-o,--output", args->output,
                  "Calibration file (default configs/calibration/<model>.json); cells of the "
                  "same setting are replaced, others kept");
  cmd->callback([&model, args] { run_calibrate(model, *args); });
}

}  // namespace kvbench
