// `kvbench load`: kvbench's shared-context tasks as concurrent multi-round sessions against
// any OpenAI-compatible endpoint (serve/load_generator.h), at one or more concurrency levels,
// into a results db as a serving run; a line per level on stdout.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/input_error.h"
#include "common/sha256.h"
#include "datasets/generator.h"
#include "harness/cli/commands.h"
#include "harness/model/gguf.h"
#include "harness/model/hf_folder.h"
#include "harness/model/known_models.h"
#include "harness/model/tokenizer.h"
#include "harness/sweep_config.h"
#include "reports/serving_report.h"
#include "store/results_db.h"
#include "store/writer_lock.h"
#include "serve/load_generator.h"

namespace kvbench {

namespace {

struct LoadArgs {
  std::string endpoint = "http://127.0.0.1:8080";
  std::string served_model;
  std::string method;
  std::string label;
  std::string task = "retr_kv";
  int64_t context_tokens = 1024;
  int32_t users = 8;
  int32_t turns = 3;
  uint64_t seed = 0;
  std::vector<int32_t> concurrency = {1, 2, 4, 8};
  int32_t max_new = 0;
  bool ignore_eos = false;
  double timeout_s = 600;
  std::string db = "kvbench-out/serving.db";
};

void run_load_command(const ModelOptions& model_options, const LoadArgs& args) {
  // Everything checked before the endpoint sees a request.
  const SweepTask task = parse_task_label(args.task);
  std::vector<int32_t> levels = args.concurrency;
  std::sort(levels.begin(), levels.end());
  if (std::adjacent_find(levels.begin(), levels.end()) != levels.end()) {
    throw InputError("--concurrency: a level is given twice");
  }
  const std::string model_path = resolve_model_path(model_options);
  const EndpointInfo info = probe_endpoint(args.endpoint);
  // The samples are sized with the served model's tokenizer: --model names its GGUF (or its
  // Hugging Face folder).
  const Tokenizer tokenizer = Tokenizer::from_gguf(*open_model_file(model_path));
  GeneratorOptions g;
  g.task = task.name;
  g.knobs = task.knobs;
  g.context_tokens = args.context_tokens;
  g.turns = args.turns;
  g.samples = args.users;
  g.seed = args.seed;
  const std::vector<Sample> samples = generate_samples(g, tokenizer);

  std::error_code ec;
  const std::filesystem::path db_folder = std::filesystem::path(args.db).parent_path();
  if (!db_folder.empty()) std::filesystem::create_directories(db_folder, ec);
  auto db = ResultsDb::open(args.db);
  const WriterLock lock(args.db);
  LoadOptions options;
  options.endpoint = args.endpoint;
  options.model = args.served_model.empty() ? info.model : args.served_model;
  options.method = args.method;
  options.label = !args.label.empty()             ? args.label
                  : info.method.empty()           ? "server at " + args.endpoint
                  : args.method.empty()           ? "kvbench serve " + info.method
                                                  : "kvbench serve " + args.method;
  options.max_tokens = args.max_new;
  options.ignore_eos = args.ignore_eos;
  options.pool_bytes = info.pool_bytes;
  options.timeout_s = args.timeout_s;

  RunRecord run;
  const std::string name = known_model_name(model_path);
  run.model_path = name.empty() ? model_path : name;
  run.model_sha256 = sha256_model(model_path);
  nlohmann::json config{{"serving",
                                    {{"endpoint", args.endpoint},
                                     {"label", options.label},
                                     {"method", args.method},
                                     {"server_method", info.method},
                                     {"pool_bytes", info.pool_bytes},
                                     {"task", task.label()},
                                     {"context_tokens", args.context_tokens},
                                     {"users", args.users},
                                     {"turns", args.turns},
                                     {"seed", args.seed},
                                     {"max_new", args.max_new},
                                     {"concurrency", levels}}}};
  if (args.ignore_eos) config["serving"]["ignore_eos"] = true;
  run.config_json = config.dump();
  fill_provenance(run);
  const int64_t run_id = db->begin_run(run);
  std::printf("load: %s (%s), %d users x %d turns of %s at %lld tokens; into %s\n",
              options.label.c_str(), options.model.c_str(), args.users, args.turns,
              task.label().c_str(), static_cast<long long>(args.context_tokens), args.db.c_str());
  std::printf("%11s %8s %7s %10s %9s %9s %9s %8s %15s\n", "concurrency", "requests", "failed",
              "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "wall s", "accuracy %");
  std::fflush(stdout);
  for (const int32_t level : levels) {
    options.concurrency = level;
    const std::vector<ServingRow> rows = run_load(samples, options);
    db->write_serving(run_id, rows);
    const ServingPoint p = serving_point(rows);
    char accuracy[32];
    std::snprintf(accuracy, sizeof accuracy, "%.1f ±%.1f", 100 * p.accuracy.mean,
                  50 * (p.accuracy.high - p.accuracy.low));
    std::printf("%11d %8lld %7lld %10.1f %9.0f %9.0f %9.1f %8.1f %15s\n", level,
                static_cast<long long>(p.requests), static_cast<long long>(p.failed),
                p.output_tokens_per_s, p.ttft_p50_ms, p.ttft_p99_ms, p.itl_p50_ms, p.wall_s,
                accuracy);
    std::fflush(stdout);
  }
  db->finish_run(run_id);
}

}  // namespace

void add_load_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<LoadArgs>();
  CLI::App* cmd = app.add_subcommand(
      "load", "kvbench's shared-context tasks as concurrent multi-round sessions against an "
              "OpenAI-compatible endpoint, into a results db");
  cmd->add_option("--endpoint", args->endpoint,
                  "The server: http://HOST:PORT (default http://127.0.0.1:8080)");
  cmd->add_option("--served-model", args->served_model,
                  "The model's name in the API (default the endpoint's first in /v1/models)");
  cmd->add_option("--method", args->method,
                  "A kvbench cache method for every request (kvbench serve's extension; "
                  "default: none, the server's own)");
  cmd->add_option("--label", args->label, "The run's name in the report (default from the "
                                          "endpoint and method)");
  cmd->add_option("--task", args->task,
                  "A generated task, optionally with knobs: retr_kv[key_length=8] (default "
                  "retr_kv)");
  cmd->add_option("--context-tokens", args->context_tokens,
                  "Each user's context in tokens (default 1024)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  cmd->add_option("--users", args->users, "Users, one sample each (default 8)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--turns", args->turns, "Questions per user (default 3)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--seed", args->seed, "Seed of the generated samples (default 0)");
  cmd->add_option("--concurrency", args->concurrency,
                  "Sessions in flight at once, one run per level (default 1 2 4 8)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-new", args->max_new,
                  "Most tokens per answer (default: each task's decode budget)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--ignore-eos", args->ignore_eos,
                "Every answer runs to --max-new (ignore_eos sent): fixed output lengths; the "
                "score reads the text up to where kvbench serve says the answer would have "
                "ended");
  cmd->add_option("--timeout", args->timeout_s, "A request's read timeout in seconds (600)")
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("--db", args->db, "Results db (default kvbench-out/serving.db)");
  cmd->callback([&model, args] { run_load_command(model, *args); });
}

}  // namespace kvbench
