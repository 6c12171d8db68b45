// `kvbench run`: generates a task's samples (or loads an SCBench task file), runs them
// through cache methods with the full cache as the fidelity reference, scores every turn
// by its task, and prints per-turn tables and a summary per (task, method).
#include <CLI/CLI.hpp>

#include <chrono>
#include <map>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "datasets/generator.h"
#include "datasets/sample.h"
#include "harness/cli/commands.h"
#include "harness/cli/turn_table.h"
#include "harness/evaluation.h"
#include "harness/head_probe.h"
#include "harness/model/llama_model.h"
#include "harness/model/model_config.h"
#include "harness/model_cache.h"
#include "harness/sweep.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

struct RunArgs {
  std::vector<std::string> tasks;
  std::vector<std::string> methods;
  std::string mode = "multi-turn";
  std::string append = "gold";
  std::string data;  // an SCBench task file
  int32_t samples = 0;  // 0: the generator's default (1), or every sample of a file
  int32_t turns = 0;    // 0: the generator's default (5), or every turn of a file
  int64_t context_tokens = 0;  // 0: the generator's default
  uint64_t seed = 0;
  std::vector<std::string> knobs;  // name=value
  int32_t max_new = 0;             // 0: the task's
  bool no_fidelity = false;
  bool summary_only = false;
  QuerySettingArgs query;
  std::string db;  // --task: store the run in this db
  std::string out = "kvbench-out";  // the default sweep's folder: results.db and the report
};

// What the generator-only options were given as, to refuse them for a task file.
struct GivenOptions {
  bool context_tokens = false, seed = false, knobs = false;
};

std::map<std::string, std::string> parse_knobs(const std::vector<std::string>& knobs) {
  std::map<std::string, std::string> out;
  for (const std::string& k : knobs) {
    const size_t eq = k.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == k.size()) {
      throw InputError("--knob '" + k + "' must be name=value (see kvbench list tasks)");
    }
    if (!out.emplace(k.substr(0, eq), k.substr(eq + 1)).second) {
      throw InputError("--knob '" + k.substr(0, eq) + "' given twice");
    }
  }
  return out;
}

// The SCBench task file's samples, formatted for the task: at most `samples` of them.
std::vector<Sample> load_task_file(const std::string& task, const RunArgs& args) {
  std::vector<Sample> raw = load_samples_jsonl(args.data);
  if (args.samples > 0 && static_cast<size_t>(args.samples) < raw.size()) raw.resize(args.samples);
  std::vector<Sample> out;
  for (const Sample& s : raw) out.push_back(format_scbench_sample(task, s));
  return out;
}

void run_run_command(const ModelOptions& model_options, const RunArgs& args,
                     const GivenOptions& given) {
  apply_thread_option(model_options);
  // Everything that can be checked without the model is checked before it loads.
  EvaluationOptions evaluation;
  evaluation.session.mode = parse_session_mode(args.mode);
  evaluation.session.append = parse_answer_source(args.append);
  evaluation.session.max_new_tokens = args.max_new;
  evaluation.session.query = query_setting(args.query);
  evaluation.session.turn_gap_s = args.query.turn_gap_s;
  evaluation.fidelity = !args.no_fidelity;
  std::vector<ResolvedSpec> specs;
  for (const std::string& m : args.methods) {
    specs.push_back(resolve_method_spec(m));
    check_query_setting(specs.back(), evaluation.session.query);
    check_runs_on(specs.back(), model_device(model_options));
  }
  const auto knobs = parse_knobs(args.knobs);

  std::vector<std::string> generated;
  std::string file_task;
  for (const std::string& name : args.tasks) {
    const TaskFormat& format = task_format(name);
    if (format.source == TaskSource::Scbench) {
      if (args.tasks.size() > 1) {
        throw InputError("--task " + name + " reads an SCBench file (--data) and runs alone, "
                         "not with other tasks");
      }
      file_task = name;
    } else {
      generated.push_back(name);
    }
  }
  std::vector<Sample> samples;
  if (!file_task.empty()) {
    if (args.data.empty()) {
      throw InputError("--task " + file_task + " is an SCBench task: give its file with --data "
                       "FILE.jsonl (SCBench's data is not bundled)");
    }
    if (given.context_tokens || given.seed || given.knobs) {
      throw InputError("--context-tokens, --seed and --knob size generated tasks; --task " +
                       file_task + " reads its samples from " + args.data);
    }
    samples = load_task_file(file_task, args);
    evaluation.session.max_turns = args.turns;
  } else if (!args.data.empty()) {
    throw InputError("--data is for SCBench tasks; --task " + generated.front() +
                     " is generated (see kvbench list tasks)");
  }

  auto model = load_model(resolve_model_path(model_options), model_options);
  prepare_head_retrieval(*model, resolve_model_path(model_options), specs);
  const int64_t window = model->config().context_length;
  GeneratorOptions defaults;
  for (const std::string& task : generated) {
    GeneratorOptions g;
    g.task = task;
    if (args.context_tokens > 0) g.context_tokens = args.context_tokens;
    if (args.turns > 0) g.turns = args.turns;
    if (args.samples > 0) g.samples = args.samples;
    g.seed = args.seed;
    g.knobs = knobs;
    if (g.context_tokens >= window) {
      throw InputError("--context-tokens " + std::to_string(g.context_tokens) +
                       " is not shorter than the model's context window of " +
                       std::to_string(window) + " tokens");
    }
    for (Sample& s : generate_samples(g, model->tokenizer())) samples.push_back(std::move(s));
  }

  check_samples_fit(*model, samples, evaluation);

  std::printf("tasks:");
  for (const std::string& t : args.tasks) std::printf(" %s", t.c_str());
  if (!file_task.empty()) std::printf(" (%s)", args.data.c_str());
  std::printf("\nmethods:");
  for (const ResolvedSpec& m : specs) std::printf(" %s", m.canonical.c_str());
  std::printf("\nmode: %s, append %s, query %s", args.mode.c_str(), args.append.c_str(),
              to_string(evaluation.session.query));
  if (args.query.turn_gap_s > 0) {
    std::printf(", turn gap %g s (simulated)", args.query.turn_gap_s);
  }
  std::printf(", %zu sample(s)", samples.size());
  if (!generated.empty()) {
    std::printf(", context %lld tokens, seed %llu",
                static_cast<long long>(args.context_tokens > 0 ? args.context_tokens
                                                               : defaults.context_tokens),
                static_cast<unsigned long long>(args.seed));
  }
  std::printf("\n%s\n", args.no_fidelity
                            ? "fidelity: off (--no-fidelity)"
                            : "fidelity: against the full cache, run once per sample in the same mode");
  std::fflush(stdout);

  SummaryTable summary;
  const size_t units = samples.size() * specs.size();
  size_t done = 0;
  auto last = std::chrono::steady_clock::now();
  evaluate(*model, samples, specs, evaluation, [&](const UnitResult& unit) {
    ++done;
    summary.add(unit);
    if (!args.summary_only) {
      print_unit(unit);
      return;
    }
    double score = 0;
    for (double s : unit.scores) score += s;
    const auto now = std::chrono::steady_clock::now();
    std::printf("[%zu/%zu] %s %s: score %.2f over %zu turns (%.1f s)\n", done, units,
                unit.sample->id.c_str(), unit.session.method.c_str(),
                unit.scores.empty() ? 0.0 : score / static_cast<double>(unit.scores.size()),
                unit.scores.size(), std::chrono::duration<double>(now - last).count());
    std::fflush(stdout);
    last = now;
  });
  summary.print();
}

// `run --task ... --db FILE`: the same run as a one-off sweep into the db (resumable: a
// rerun skips finished units), with the per-turn tables and the summary printed.
void run_into_db(const ModelOptions& model, const RunArgs& args, const GivenOptions& given) {
  parse_session_mode(args.mode);
  if (parse_answer_source(args.append) != AnswerSource::Gold) {
    throw InputError("--append model is not stored in a results db; run it without --db");
  }
  const auto knobs = parse_knobs(args.knobs);
  SweepConfig config;
  bool file = false;
  for (const std::string& name : args.tasks) {
    const bool scbench = task_format(name).source == TaskSource::Scbench;
    if (scbench && args.data.empty()) {
      throw InputError("--task " + name + " is an SCBench task: give its file with --data FILE.jsonl");
    }
    if (!scbench && !args.data.empty()) {
      throw InputError("--data is for SCBench tasks; --task " + name + " is generated");
    }
    if (scbench && (given.context_tokens || given.seed || given.knobs)) {
      throw InputError("--context-tokens, --seed and --knob size generated tasks; --task " + name +
                       " reads its samples from " + args.data);
    }
    file = file || scbench;
    config.tasks.push_back({name, scbench ? std::map<std::string, std::string>{} : knobs,
                            scbench ? args.data : ""});
  }
  config.methods = args.methods;
  config.modes = {to_string(parse_session_mode(args.mode))};
  config.query_settings = {to_string(query_setting(args.query))};
  config.turn_gaps_s = {args.query.turn_gap_s};
  config.seeds = {args.seed};
  config.samples = args.samples > 0 ? args.samples : (file ? 100000 : GeneratorOptions{}.samples);
  if (args.turns > 0) config.turns = args.turns;
  if (args.context_tokens > 0) config.context_tokens = args.context_tokens;
  config.max_new = args.max_new;
  config.fidelity = !args.no_fidelity;
  for (const SweepMethod& m : sweep_methods(config)) {  // every spec resolves, before the model loads
    check_query_setting(m.spec, parse_query_setting(config.query_settings[0]));
  }
  SummaryTable summary;
  run_sweep_into(model, config, Shard{}, args.db, [&](const UnitResult& unit) {
    summary.add(unit);
    if (!args.summary_only) print_unit(unit);
  });
  summary.print();
}

}  // namespace

void add_run_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run", "The default sweep and its report (no --task), or one task through cache methods, "
             "scored, with tables");
  cmd->add_option("--task", args->tasks,
                  "Task (kvbench list tasks); repeat for several generated tasks. Without "
                  "--task and --method: the default sweep into --db, then the report");
  cmd->add_option("--method", args->methods,
                  "Method spec, e.g. full or snapkv:budget=256; repeat to compare several "
                  "against one reference run");
  cmd->add_option("--db", args->db,
                  "With --task, also store the run in this results db (a rerun skips "
                  "finished units)");
  auto* out = cmd->add_option("--out", args->out,
                              "The default sweep's folder: results.db and leaderboard.md/.html "
                              "(default kvbench-out)");
  cmd->add_option("--mode", args->mode, "multi-turn (default) or multi-request");
  cmd->add_option("--append", args->append,
                  "What a multi-turn turn appends: gold (default, the reference answer) or model");
  cmd->add_option("--data", args->data, "SCBench task file (JSONL) for an scbench_* task");
  cmd->add_option("--samples", args->samples,
                  "Samples to generate (default 1), or the first N of a task file")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--turns", args->turns, "Turns per sample (default 5; a file's: all)")
      ->check(CLI::Range(1, 1000));
  auto* ctx = cmd->add_option("--context-tokens", args->context_tokens,
                              "Context length of generated samples, in tokens (default 512)")
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  auto* seed = cmd->add_option("--seed", args->seed, "Seed of the generated samples (default 0)");
  auto* knob = cmd->add_option("--knob", args->knobs,
                               "A task knob as name=value (e.g. hops=2); repeatable");
  cmd->add_option("--max-new", args->max_new, "Most tokens to decode per turn (default: the task's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--no-fidelity", args->no_fidelity,
                "Skip the full-cache reference run (KL and top-1 are not measured)");
  add_query_setting_options(cmd, args->query);
  cmd->add_flag("--summary-only", args->summary_only,
                "One progress line per (sample, method) instead of per-turn tables");
  cmd->callback([&model, args, cmd, ctx, seed, knob, out] {
    if (args->tasks.empty() && args->methods.empty()) {
      // The default sweep: only --out and the global options apply.
      for (const CLI::Option* o : cmd->get_options()) {
        if (o->count() > 0 && o != out && o->get_name() != "--help") {
          throw InputError("the default sweep (kvbench run without --task) takes only --out, "
                           "not " + o->get_name());
        }
      }
      std::error_code ec;
      std::filesystem::create_directories(args->out, ec);
      if (ec) throw InputError("--out " + args->out + ": cannot create the folder (" + ec.message() + ")");
      const std::string db_path = (std::filesystem::path(args->out) / "results.db").string();
      std::printf("kvbench run: the default sweep (%s) into %s/\n", kDefaultSweepConfig,
                  args->out.c_str());
      std::fflush(stdout);
      run_sweep_into(model, default_sweep_config(), Shard{}, db_path);
      write_reports_for(db_path, args->out);
      return;
    }
    if (args->tasks.empty()) throw InputError("--method needs --task (or neither, for the default sweep)");
    if (args->methods.empty()) throw InputError("--task needs --method (e.g. --method full)");
    if (out->count() > 0) {
      throw InputError("--out belongs to the default sweep; write a report of a db with "
                       "kvbench report DB -o DIR");
    }
    check_turn_gap(args->query, parse_session_mode(args->mode));
    GivenOptions given;
    given.context_tokens = ctx->count() > 0;
    given.seed = seed->count() > 0;
    given.knobs = knob->count() > 0;
    if (!args->db.empty()) {
      run_into_db(model, *args, given);
    } else {
      run_run_command(model, *args, given);
    }
  });
}

}  // namespace kvbench
