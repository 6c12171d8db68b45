// `kvbench sweep CONFIG --db DB [--shard i/n | --jobs N | --slurm DIR --shards N]` and
// `kvbench merge A.db B.db ... -o ALL.db`.
#include <CLI/CLI.hpp>

#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "common/sha256.h"
#include "harness/calibration.h"
#include "harness/cli/commands.h"
#include "harness/cli/prepared_sweep.h"
#include "harness/cli/slurm_sweep.h"
#include "harness/head_probe.h"
#include "harness/model/gguf.h"
#include "harness/model/hf_folder.h"
#include "harness/model/known_models.h"
#include "harness/model/llama_model.h"
#include "harness/model/model_config.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "harness/sweep.h"
#include "store/results_db.h"
#include "store/run_identity.h"
#include "store/writer_lock.h"

#include "git_sha.h"  // generated at build time (cmake/git_sha.cmake)

namespace kvbench {

namespace {

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? name : "unknown";
}

// The plan, before the first unit: units per task and the time the calibration's
// full-cache timings give them (harness/calibration.h, estimate_sweep).
void print_plan(const SweepProgress& p, const Calibration* timings) {
  std::printf("sweep: plan: %lld units to run (%lld already there)\n",
              static_cast<long long>(p.total), static_cast<long long>(p.skipped));
  for (const PlannedUnits& u : p.planned) {
    std::printf("sweep: plan:   %-40s %6lld units at %lld tokens\n", u.task.c_str(),
                static_cast<long long>(u.units), static_cast<long long>(u.context_tokens));
  }
  if (timings == nullptr) {
    std::printf("sweep: plan: no calibration of this model file: no time estimate\n");
  } else if (!p.planned.empty()) {
    const SweepEstimate e = estimate_sweep(p.planned, *timings);
    if (e.timed_units > 0) {
      std::printf("sweep: plan: about %s on one process for the %lld units with a calibration "
                  "timing (the full cache's prefill per sample and per unit that prefills on "
                  "its own, and its time per turn; methods that score or rebuild the cache take "
                  "longer)\n",
                  duration_text(e.seconds).c_str(), static_cast<long long>(e.timed_units));
    }
    for (const std::string& t : e.untimed) {
      std::printf("sweep: plan: no calibration timing for %s\n", t.c_str());
    }
  }
  std::fflush(stdout);
}

// A bar with ETA on a terminal; a plain line per unit otherwise (logs of batch jobs).
void print_progress(const SweepProgress& p) {
  const double eta = p.done > 0 ? p.elapsed_s / static_cast<double>(p.done) *
                                      static_cast<double>(p.total - p.done)
                                : 0;
  if (isatty(STDERR_FILENO)) {
    constexpr int kWidth = 30;
    const int filled = p.total > 0 ? static_cast<int>(kWidth * p.done / p.total) : kWidth;
    std::fprintf(stderr, "\r[%s%s] %lld/%lld units, %s elapsed, ETA %s   ",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(),
                 static_cast<long long>(p.done), static_cast<long long>(p.total),
                 duration_text(p.elapsed_s).c_str(), duration_text(eta).c_str());
    if (p.done == p.total) std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "sweep: %lld/%lld units (%s elapsed, ETA %s): %s\n",
                 static_cast<long long>(p.done), static_cast<long long>(p.total),
                 duration_text(p.elapsed_s).c_str(), duration_text(eta).c_str(),
                 p.last_unit.c_str());
  }
  std::fflush(stderr);
}

// A db that holds another sweep's runs is refused: resumed, its old units would sit under
// this config (or model) as if they were its own, and merge could never join it again.
void check_db_holds_this_sweep(const ResultsDb& db, const RunRecord& run) {
  for (const RunRecord& old : db.runs()) {
    const std::string config_difference =
        run_config_difference(old.config_json, run.config_json);
    const bool config_differs = !config_difference.empty();
    const bool model_differs = old.model_sha256 != run.model_sha256;
    if (!config_differs && !model_differs) continue;
    throw InputError(
        one_line(db.path()) + ": holds run " + std::to_string(old.id) + " of another " +
        (config_differs && model_differs ? config_difference + " and model"
         : config_differs               ? config_difference
                                        : "model (sha256 " + old.model_sha256.substr(0, 12) +
                                              ", this one " + run.model_sha256.substr(0, 12) +
                                              ")") +
        "; resuming would mix the two sweeps' results: write to a new db (another --db, or "
        "--out for kvbench run)");
  }
}

// `sweep --rerun NAME`: the units of the sweep's methods that NAME picks (a spec, or a method
// name: every spec with that component) are deleted from the db, which takes this sweep's
// config, so that the resume after it runs them again beside every other unit as it was (the
// researcher's loop: rebuild a plugin, rerun its method, keep the baselines). Refused, with
// nothing deleted, when the db holds another sweep in anything but its plugins' bytes, or
// when a method of a rebuilt plugin is not picked (its old units would pass as the new one's).
void forget_for_rerun(ResultsDb& db, const PreparedSweep& prepared,
                      const std::vector<std::string>& names) {
  std::vector<ResolvedSpec> specs;
  for (const SweepMethod& m : prepared.methods) specs.push_back(m.spec);
  std::set<std::string> picked;
  for (const std::string& name : names) {
    bool matched = false;
    for (const ResolvedSpec& spec : specs) {
      const bool named = std::any_of(spec.components.begin(), spec.components.end(),
                                     [&](const auto& c) { return c.first->name == name; });
      if (named || spec.canonical == name) {
        picked.insert(spec.canonical);
        matched = true;
      }
    }
    if (!matched) {
      std::string listed;
      for (const ResolvedSpec& spec : specs) listed += (listed.empty() ? "" : ", ") + spec.canonical;
      throw InputError("sweep --rerun " + one_line(name) +
                       ": not a method of this sweep, nor a part of one (its methods: " + listed +
                       ")");
    }
  }
  const RunRecord& run = prepared.run;
  std::set<std::string> rebuilt;  // plugin sha256s that no run of the db was made with
  for (const RunRecord& old : db.runs()) {
    if (old.model_sha256 != run.model_sha256 ||
        !same_apart_from_plugins(old.config_json, run.config_json)) {
      check_db_holds_this_sweep(db, run);  // names what differs, and throws
    }
    const std::set<std::string> before = run_config_plugins(old.config_json);
    for (const std::string& sha : run_config_plugins(run.config_json)) {
      if (!before.count(sha)) rebuilt.insert(sha);
    }
  }
  for (const ResolvedSpec& spec : specs) {
    for (const auto& [info, params] : spec.components) {
      if (rebuilt.count(info->plugin_sha256) && !picked.count(spec.canonical)) {
        throw InputError("sweep --rerun: " + spec.canonical + " comes from the rebuilt plugin " +
                         info->plugin + " too: name it with --rerun, or its units of the old "
                         "plugin would pass as the new one's");
      }
    }
  }
  const int64_t deleted = db.forget_methods(picked, run.config_json);
  std::printf("sweep: --rerun: %lld unit%s of %zu method%s deleted from %s, to run again\n",
              static_cast<long long>(deleted), deleted == 1 ? "" : "s", picked.size(),
              picked.size() == 1 ? "" : "s", db.path().c_str());
  std::fflush(stdout);
}

// The workers of `sweep --jobs`: a SIGINT or SIGTERM to the parent goes to each of them, and
// the parent waits for them before it dies of the signal itself.
pid_t g_workers[256];
volatile sig_atomic_t g_worker_count = 0;
volatile sig_atomic_t g_stop_signal = 0;

void forward_to_workers(int sig) {
  g_stop_signal = sig;
  for (sig_atomic_t i = 0; i < g_worker_count; ++i) kill(g_workers[i], sig);
}

// `kvbench sweep --jobs N`: N worker processes of this kvbench, each running shard i/N of
// the sweep into the same db (WAL: the writers take turns per unit) with its own share of
// the cores, so each keeps its own threads. A unit is computed as it would be in one
// process; resume works as for shards. The parent checks the db and holds its writer lock,
// which the workers inherit. Returns when every worker has exited; throws InputError naming
// a worker that failed.
void run_sweep_jobs(const ModelOptions& model, const std::string& config_path,
                    const SweepConfig& config, const std::string& db_path, int jobs,
                    const std::vector<std::string>& rerun) {
  const PreparedSweep prepared = prepare_sweep(model, config, /*print=*/false);
  const auto db = ResultsDb::open(db_path);  // an unwritable or corrupt db fails here
  const WriterLock lock(db_path);
  if (!rerun.empty()) forget_for_rerun(*db, prepared, rerun);
  check_db_holds_this_sweep(*db, prepared.run);
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const int threads = model.threads > 0 ? model.threads
                                        : static_cast<int>(std::max(1L, cores / jobs));
  std::vector<std::string> environment = {lock.environment_entry()};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "KVBENCH_DB_LOCK_FD=", 19) != 0) environment.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  struct sigaction forward {}, old_int {}, old_term {};
  forward.sa_handler = forward_to_workers;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  const pid_t parent = getpid();
  for (int i = 0; i < jobs && g_stop_signal == 0; ++i) {
    const std::string shard = std::to_string(i) + "/" + std::to_string(jobs);
    ModelOptions worker = model;
    worker.threads = threads;
    std::vector<std::string> args = shard_command("kvbench", worker, config_path, db_path, shard);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
      forward_to_workers(SIGTERM);
      break;
    }
    if (pid == 0) {
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      // A worker dies with its parent, whatever kills the parent (SIGKILL and SIGHUP
      // included, which the forwarding above cannot see): it may not go on writing the db.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) std::_Exit(1);  // the parent died before the line above
      lock.keep_across_exec();
      execve("/proc/self/exe", argv.data(), envp.data());
      std::_Exit(127);
    }
    g_workers[g_worker_count] = pid;
    g_worker_count = g_worker_count + 1;
  }
  std::string failed;
  for (sig_atomic_t i = 0; i < g_worker_count; ++i) {
    int status = 0;
    while (waitpid(g_workers[i], &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed += (failed.empty() ? "" : ", ") + std::to_string(i) + "/" + std::to_string(jobs);
    }
  }
  const int stop = g_stop_signal;
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  g_worker_count = 0;
  if (stop != 0) raise(stop);  // the workers are gone: die of the signal as asked
  if (!failed.empty()) {
    throw InputError("sweep --jobs " + std::to_string(jobs) + ": worker " + failed +
                     " failed (see its lines above); rerun to resume");
  }
  std::printf("sweep: %d workers done into %s\n", jobs, db_path.c_str());
}

}  // namespace

std::string duration_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else {
    std::snprintf(text, sizeof text, "%ldm%02lds", s / 60, s % 60);
  }
  return text;
}

PreparedSweep prepare_sweep(const ModelOptions& model_options, SweepConfig config, bool print) {
  ModelOptions options = model_options;
  if (!config.model.empty()) {
    if (!options.model_path.empty() &&
        model_path_of(options.model_path) != model_path_of(config.model)) {
      throw InputError("the sweep config runs model " + config.model + ", --model " +
                       options.model_path + " another: give one of them");
    }
    options.model_path = config.model;
  }
  PreparedSweep p;
  p.run.model_path = resolve_model_path(options);
  p.methods = sweep_methods(config);
  for (const SweepMethod& m : p.methods) check_runs_on(m.spec, model_device(options));
  p.run.model_sha256 = sha256_model(p.run.model_path);
  // The calibration: which tasks run (min_full_accuracy) and the plan's time estimate. A
  // sweep that needs it fails on a bad file; one that only reads timings goes without.
  const std::string calibration_file = calibration_path(p.run.model_path);
  std::error_code exists_error;
  if (config.min_full_accuracy > 0) {
    p.calibration = load_calibration(calibration_file);
  } else if (std::filesystem::exists(calibration_file, exists_error)) {
    try {
      p.calibration = load_calibration(calibration_file);
    } catch (const InputError&) {
      // no estimate
    }
  }
  if (config.min_full_accuracy > 0) {
    const std::string known = known_model_name(p.run.model_path);
    const std::string name =
        known.empty() ? std::filesystem::path(p.run.model_path).filename().string() : known;
    if (p.calibration->model != name) {
      throw InputError(calibration_file + ": a calibration of model '" + p.calibration->model +
                       "', not of " + name + "; rerun kvbench calibrate");
    }
    apply_calibration(config, *p.calibration, p.run.model_sha256, calibration_file);
    for (const ExcludedTask& t : config.excluded_tasks) {
      if (print) std::printf("sweep: left out %s: %s\n", t.task.c_str(), t.reason.c_str());
    }
    std::fflush(stdout);
  }
  p.run.config_json =
      run_config_json(config, model_dtype(options), cpu_activations(options));
  p.config = std::move(config);
  return p;
}

std::vector<std::string> shard_command(const std::string& program, const ModelOptions& model,
                                       const std::string& config_path, const std::string& db_path,
                                       const std::string& shard) {
  std::vector<std::string> args = {program, "--threads", std::to_string(model.threads),
                                   "--device", model.device, "--dtype", model.dtype,
                                   "--decode-activations", model.decode_activations,
                                   "--prefill-activations", model.prefill_activations};
  if (!model.model_path.empty()) args.insert(args.end(), {"--model", model.model_path});
  for (const std::string& plugin : model.plugins) args.insert(args.end(), {"--plugin", plugin});
  args.insert(args.end(), {"sweep", config_path, "--db", db_path, "--shard", shard});
  return args;
}

void fill_provenance(RunRecord& run) {
  run.kvbench_version = KVBENCH_VERSION;
  run.git_sha = KVBENCH_GIT_SHA;  // the binary's commit (cmake/git_sha.cmake), not the tree's
  run.host = host_name();
  run.command_line = command_line();
}

namespace {

// run_sweep_into once its config is prepared: the db opened (created where missing), locked
// and checked, the model loaded, the units run.
void run_prepared_sweep(const ModelOptions& model_options, const PreparedSweep& prepared,
                        const Shard& shard, const std::string& db_path,
                        const std::function<void(const UnitResult&)>& on_unit,
                        const std::vector<std::string>& rerun) {
  const RunRecord& run_record = prepared.run;
  // An unwritable, corrupt, busy or foreign db fails before the model loads.
  auto db = ResultsDb::open(db_path);
  const WriterLock lock(db_path);
  if (!rerun.empty()) forget_for_rerun(*db, prepared, rerun);
  check_db_holds_this_sweep(*db, run_record);
  // The samples need the tokenizer and the window only; the weights (about 0.8 GB for
  // Qwen2.5-0.5B) load when there is a unit to run.
  const std::unique_ptr<GgufFile> file = open_model_file(run_record.model_path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(*file);
  std::unique_ptr<LlamaModel> model;
  const SweepModel source{tokenizer, ModelConfig::from_gguf(*file).context_length,
                          [&]() -> const LlamaModel& {
                            model = load_model(run_record.model_path, model_options);
                            std::vector<ResolvedSpec> specs;
                            for (const SweepMethod& m : prepared.methods) specs.push_back(m.spec);
                            // duo_attention's probe
                            prepare_head_retrieval(*model, run_record.model_path, specs);
                            return *model;
                          }};
  RunRecord run = run_record;
  fill_provenance(run);
  // Timings of another model file would mislead: none then.
  const std::optional<Calibration>& calibration = prepared.calibration;
  const Calibration* timings =
      calibration && calibration->model_sha256 == run.model_sha256 ? &*calibration : nullptr;
  const auto progress = [timings](const SweepProgress& p) {
    if (p.done == 0) {
      print_plan(p, timings);
    } else {
      print_progress(p);
    }
  };
  const SweepProgress done = run_sweep(source, prepared.config, shard, *db, run, progress, on_unit);
  std::printf("sweep: %lld unit%s written to %s (shard %d/%d; %lld already there%s)\n",
              static_cast<long long>(done.done), done.done == 1 ? "" : "s", db_path.c_str(),
              shard.index, shard.count, static_cast<long long>(done.skipped),
              model ? "" : "; nothing to run, the model not loaded");
  const PrefillCount& p = done.prefill;
  std::printf("sweep: %lld context tokens prefilled: %lld in %lld shared prefills, %lld by "
              "units on their own%s\n",
              static_cast<long long>(p.total()), static_cast<long long>(p.shared_tokens),
              static_cast<long long>(p.shared_prefills), static_cast<long long>(p.unit_tokens),
              prepared.config.shared_prefill ? "" : " (shared_prefill off)");
  std::fflush(stdout);
}

}  // namespace

void run_sweep_into(const ModelOptions& model_options, SweepConfig config, const Shard& shard,
                    const std::string& db_path,
                    const std::function<void(const UnitResult&)>& on_unit,
                    const std::vector<std::string>& rerun) {
  apply_thread_option(model_options);
  const PreparedSweep prepared = prepare_sweep(model_options, std::move(config), /*print=*/true);
  // A db this sweep creates and then refuses to fill (a fake model, a context past the
  // window) is removed again: a refused command leaves nothing behind.
  struct stat existing {};
  const bool created = ::stat(db_path.c_str(), &existing) != 0;
  try {
    run_prepared_sweep(model_options, prepared, shard, db_path, on_unit, rerun);
  } catch (const InputError&) {
    bool untouched = created;
    if (created) {
      try {
        untouched = ResultsDb::open(db_path, true)->runs().empty();
      } catch (const InputError&) {
      }
    }
    if (untouched) {
      for (const char* suffix : {"", "-wal", "-shm"}) std::remove((db_path + suffix).c_str());
    }
    throw;
  }
}

void add_sweep_command(CLI::App& app, ModelOptions& model) {
  struct SweepArgs {
    std::string config, db = "results.db", shard;
    std::vector<std::string> rerun;
    bool separate_prefill = false;
    int jobs = 1;
    SlurmArgs slurm;
  };
  auto args = std::make_shared<SweepArgs>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Run tasks x methods x budgets x modes x seeds from a JSON config into a results db");
  cmd->add_option("config", args->config, "Sweep config (JSON; see README)")->required();
  cmd->add_option("--db", args->db, "Results db (SQLite; created, or resumed: finished units "
                                    "are skipped)");
  cmd->add_option("--shard", args->shard,
                  "i/n: run shard i of n (default: from SLURM_ARRAY_TASK_ID/COUNT or "
                  "JOB_COMPLETION_INDEX with KVBENCH_SHARD_COUNT, else 0/1)");
  cmd->add_flag("--separate-prefill", args->separate_prefill,
                "Every unit prefills its own context (as before one prefill served many "
                "methods; for timing the two side by side)");
  cmd->add_option("--rerun", args->rerun,
                  "Delete this method's units from the db and run them again, keeping the "
                  "others (a spec, or a method name for every spec with it; repeatable; after "
                  "a plugin is rebuilt, name each of its methods)");
  cmd->add_option("--jobs", args->jobs,
                  "Worker processes, each running 1/N of the samples with its share of the "
                  "cores (default 1)")
      ->check(CLI::Range(1, 256));
  CLI::Option* slurm = cmd->add_option(
      "--slurm", args->slurm.dir,
      "Submit to Slurm: a job array of --shards tasks (dbs and logs in DIR) and a merge-and-report "
      "job after them; again: resubmits the shards not finished (docs/cluster.md)");
  cmd->add_option("--shards", args->slurm.shards, "With --slurm: the array's tasks")
      ->check(CLI::Range(1, 100000));
  cmd->add_flag("--status", args->slurm.status,
                "With --slurm: each shard's state and units, the merge's; submits nothing");
  cmd->add_option("--time", args->slurm.time,
                  "With --slurm: a shard's time limit, as sbatch takes it (default: from the "
                  "calibration's estimate)");
  cmd->add_option("--mem", args->slurm.mem,
                  "With --slurm: a shard's memory, as sbatch takes it (default: from the model "
                  "and the contexts)");
  cmd->add_option("--sbatch-option", args->slurm.sbatch_options,
                  "With --slurm: passed to sbatch, e.g. --sbatch-option=--partition=gpu "
                  "(repeatable)");
  cmd->callback([&model, args, slurm] {
    SweepConfig config = load_sweep_config(args->config);
    const bool slurm_given = slurm->count() > 0;
    const SlurmArgs& s = args->slurm;
    if (!slurm_given && (s.status || s.shards > 0 || !s.time.empty() || !s.mem.empty() ||
                         !s.sbatch_options.empty())) {
      throw InputError(
          "sweep: --shards, --status, --time, --mem and --sbatch-option go with --slurm DIR");
    }
    if (slurm_given) {
      if (args->jobs > 1 || !args->shard.empty() || args->separate_prefill ||
          !args->rerun.empty()) {
        throw InputError("sweep: --slurm runs the shards as Slurm tasks: no --jobs, --shard, "
                         "--separate-prefill or --rerun with it");
      }
      run_slurm_sweep(model, args->config, config, args->slurm);
      return;
    }
    if (args->jobs > 1) {
      if (!args->shard.empty()) throw InputError("sweep: give --jobs or --shard, not both");
      if (args->separate_prefill) {
        throw InputError("sweep: --separate-prefill is for one process (set \"shared_prefill\": "
                         "false in the config for --jobs)");
      }
      run_sweep_jobs(model, args->config, config, args->db, args->jobs, args->rerun);
      return;
    }
    if (args->separate_prefill) config.shared_prefill = false;
    const Shard shard = args->shard.empty() ? shard_from_environment() : parse_shard(args->shard);
    run_sweep_into(model, config, shard, args->db, nullptr, args->rerun);
  });

  struct MergeArgs {
    std::vector<std::string> inputs;
    std::string output;
    bool allow_mixed_commits = false;
  };
  auto merge = std::make_shared<MergeArgs>();
  CLI::App* m = app.add_subcommand("merge", "Join the results dbs of a sweep's shards into one");
  m->add_option("inputs", merge->inputs, "Shard dbs")->required();
  m->add_option("-o,--output", merge->output, "The merged db (must not exist)")->required();
  m->add_flag("--allow-mixed-commits", merge->allow_mixed_commits,
              "Merge shards made by different kvbench commits (refused by default: one table, "
              "one code); the report then lists each commit with its units");
  m->callback([merge] {
    merge_results(merge->inputs, merge->output, merge->allow_mixed_commits);
    std::printf("merge: %zu dbs into %s\n", merge->inputs.size(), merge->output.c_str());
  });
}

}  // namespace kvbench
