// `kvbench session`: runs SCBench-style samples (JSONL) through one or more cache methods,
// multi-turn or multi-request, with the full cache first as the fidelity reference (run
// once per sample and shared by every method), and prints a table per sample and method:
// TTFT, TPOT, KV bytes, tokens kept, first-token KL, top-1 agreement, answers.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "cache/registry.h"
#include "common/files.h"
#include "common/input_error.h"
#include "common/json_input.h"
#include "datasets/sample.h"
#include "harness/cli/commands.h"
#include "harness/cli/turn_table.h"
#include "harness/evaluation.h"
#include "harness/head_probe.h"
#include "harness/model/llama_model.h"
#include "harness/model_cache.h"
#include "harness/session.h"
#include "harness/session_mode.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

struct SessionArgs {
  std::string sample_path;
  std::vector<std::string> methods;
  std::string mode;
  std::string append = "gold";
  int32_t max_new = 0;  // 0: the sample's task's length, 64 for a sample without a task
  int32_t turns = 0;
  std::string sample_id;
  bool no_fidelity = false;
  QuerySettingArgs query;
  std::string out;  // JSONL of every turn, for scripts; empty: none
};

// One turn of a unit as one JSON line: what a script comparing kvbench with another tool
// needs (scripts/kvpress_side_by_side.py --samples reads it).
std::string turn_line(const UnitResult& unit, size_t i) {
  const TurnRecord& t = unit.session.turns[i];
  nlohmann::json row = {{"sample", unit.session.sample_id},
                        {"method", unit.session.method},
                        {"mode", to_string(unit.session.mode)},
                        {"turn", t.turn},
                        {"prediction", t.prediction},
                        {"reference", t.reference},
                        {"stop", t.stop_reason},
                        {"prompt_tokens", t.prompt_tokens},
                        {"output_tokens", t.output_tokens},
                        {"ttft_ms", t.ttft_ms},
                        {"kv_bytes", t.kv_bytes}};
  if (!unit.scores.empty()) row["score"] = unit.scores[i];
  if (unit.session.fidelity) {
    row["first_token_kl"] = t.first_token_kl;
    row["top1_agreement"] = t.top1_agreement;
  }
  return dump_json(row);
}

void run_session_command(const ModelOptions& model_options, const SessionArgs& args) {
  apply_thread_option(model_options);
  // Everything a user can get wrong is checked before the model loads.
  SessionOptions options;
  options.mode = parse_session_mode(args.mode);
  options.append = parse_answer_source(args.append);
  options.max_new_tokens = args.max_new;
  options.max_turns = args.turns;
  check_turn_gap(args.query, options.mode);
  options.query = query_setting(args.query);
  options.turn_gap_s = args.query.turn_gap_s;
  std::vector<ResolvedSpec> specs;
  for (const std::string& method : args.methods) {
    specs.push_back(resolve_method_spec(method));
    check_runs_on(specs.back(), model_device(model_options));
    check_query_setting(specs.back(), options.query);
  }
  std::vector<Sample> samples = load_samples_jsonl(args.sample_path);
  if (!args.out.empty()) {
    check_output_file(args.out, {args.sample_path}, "--out");
    check_writable(args.out, "--out");
  }
  if (!args.sample_id.empty()) {
    const auto it = std::find_if(samples.begin(), samples.end(),
                                 [&](const Sample& s) { return s.id == args.sample_id; });
    if (it == samples.end()) {
      throw InputError("no sample with id '" + args.sample_id + "' in " + args.sample_path);
    }
    samples = {*it};
  }
  // A sample that names its task (`kvbench list tasks --export`) is scored by that task's
  // scorer and decoded to its length, as a sweep does; an SCBench task's file needs its
  // template first (kvbench run --task NAME --data FILE).
  for (const Sample& sample : samples) {
    const TaskFormat* format = named_task(sample, args.sample_path);
    if (format && format->source != TaskSource::Generated) {
      throw InputError(args.sample_path + ": sample '" + sample.id + "' names the SCBench task '" +
                       sample.task + "': run it with kvbench run --task " + sample.task +
                       " --data FILE");
    }
  }
  auto model = load_model(resolve_model_path(model_options), model_options);
  prepare_head_retrieval(*model, resolve_model_path(model_options), specs);
  EvaluationOptions evaluation;
  evaluation.session = options;
  evaluation.fidelity = !args.no_fidelity;
  check_samples_fit(*model, samples, evaluation);

  std::printf("methods:");
  for (const ResolvedSpec& spec : specs) std::printf(" %s", spec.canonical.c_str());
  std::printf("\nmode: %s, append %s, query %s", to_string(options.mode),
              to_string(options.append), to_string(options.query));
  if (options.turn_gap_s > 0) std::printf(", turn gap %g s (simulated)", options.turn_gap_s);
  if (options.max_new_tokens > 0) std::printf(", max-new %d", options.max_new_tokens);
  std::printf(", %zu sample(s) from %s\n", samples.size(),
              args.sample_path.c_str());
  std::printf(args.no_fidelity
                  ? "fidelity: off (--no-fidelity)\n"
                  : "fidelity: against the full cache, run once per sample in the same mode\n");
  std::fflush(stdout);

  std::string lines;
  evaluate(*model, samples, specs, evaluation, [&](const UnitResult& unit) {
    print_unit(unit);
    for (size_t i = 0; i < unit.session.turns.size(); ++i) lines += turn_line(unit, i) + "\n";
  });
  if (!args.out.empty()) write_file_atomically(args.out, lines, "session output");
}

}  // namespace

void add_session_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<SessionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "session", "Run shared-context samples (SCBench JSONL) through cache methods");
  cmd->add_option("--sample", args->sample_path, "JSONL file: {id, context, multi_turns}")
      ->required();
  cmd->add_option("--method", args->methods,
                  "Method spec, e.g. full or snapkv:budget=256; repeat to compare several "
                  "against one reference run")
      ->required();
  cmd->add_option("--mode", args->mode, "multi-turn or multi-request")->required();
  cmd->add_option("--append", args->append,
                  "What a multi-turn turn appends: gold (the reference answer) or model");
  cmd->add_option("--max-new", args->max_new,
                  "Most tokens to decode per turn (default: the sample's task's, as a sweep "
                  "decodes it; 64 for a sample without a task)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--turns", args->turns, "Run at most this many turns per sample (0: all)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--sample-id", args->sample_id, "Run only the sample with this id");
  cmd->add_flag("--no-fidelity", args->no_fidelity,
                "Skip the full-cache reference run (KL and top-1 are not measured)");
  add_query_setting_options(cmd, args->query);
  cmd->add_option("--out", args->out,
                  "Also write every turn as a JSON line (sample, method, turn, prediction, "
                  "reference, score, KL, top-1, ...) to this file, once all have run");
  cmd->callback([&model, args] { run_session_command(model, *args); });
}

void add_query_setting_options(CLI::App* cmd, QuerySettingArgs& args) {
  cmd->add_flag("--query-aware", args.query_aware,
                "Compress the context after the first turn's query (multi-request: after each "
                "request's query), not before any question");
  args.gap = cmd->add_option("--turn-gap", args.turn_gap_s,
                             "Multi-request: simulated seconds between requests, read by TTLs "
                             "(apc_ttl, tiers policy=ttl); nothing sleeps (default 0)");
}

QuerySetting query_setting(const QuerySettingArgs& args) {
  return args.query_aware ? QuerySetting::Aware : QuerySetting::Agnostic;
}

void check_turn_gap(const QuerySettingArgs& args, SessionMode mode) {
  if (!(args.turn_gap_s >= 0) || !std::isfinite(args.turn_gap_s)) {
    throw InputError("--turn-gap " + args.gap->as<std::string>() + ": expected seconds >= 0");
  }
  if (args.gap->count() > 0 && mode != SessionMode::MultiRequest) {
    throw InputError("--turn-gap is the time between requests: it needs --mode multi-request");
  }
}

}  // namespace kvbench
