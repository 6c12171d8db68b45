// `kvbench list models|methods|tasks`: the GGUF files kvbench can run, with their shape;
// the registered cache methods with their parameters, defaults and papers; the generated
// tasks with their knobs.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "cache/registry.h"
#include "common/files.h"
#include "common/input_error.h"
#include "datasets/corpus.h"
#include "datasets/generator.h"
#include "harness/cli/commands.h"
#include "harness/model/gguf.h"
#include "harness/model/hf_folder.h"
#include "harness/model/known_models.h"
#include "harness/model/model_config.h"
#include "harness/model/tokenizer.h"
#include "harness/sweep_config.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

void list_models(const ModelOptions& options) {
  // Setup's models by short name (fetched or not), then any other GGUF file in sight.
  std::vector<std::pair<std::string, std::string>> models;  // (short name or "", path)
  std::set<std::string> seen;
  for (const KnownModel& m : known_models()) {
    models.emplace_back(m.name, model_path_of(m.name));
    seen.insert(models.back().second);
  }
  std::set<std::string> others;
  if (!options.model_path.empty()) others.insert(model_path_of(options.model_path));
  const char* env = std::getenv("KVBENCH_MODEL");
  if (env && *env) others.insert(model_path_of(env));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(models_dir(), ec)) {
    if (entry.path().extension() == ".gguf" || is_hf_folder(entry.path().string())) {
      others.insert(entry.path().string());
    }
  }
  for (const std::string& path : others) {
    if (seen.insert(path).second) models.emplace_back("", path);
  }
  std::printf("%-13s %-40s %-6s %7s %6s %5s %5s %8s  %s\n", "--model", "name", "arch", "params",
              "layers", "heads", "ctx", "MiB", "path");
  for (const auto& [short_name, path] : models) {
    const char* shown = short_name.empty() ? "-" : short_name.c_str();
    if (!std::filesystem::exists(path, ec)) {
      const KnownModel* m = find_known_model(short_name);
      if (m && m->on_demand) {
        std::printf("%-13s not fetched: fetched on first use, %.0f MiB (%s)  %s\n", shown,
                    m->bytes / 1048576.0, m->source.c_str(), path.c_str());
      } else {
        std::printf("%-13s not fetched: run ./scripts/setup.sh (%s)  %s\n", shown,
                    m ? m->source.c_str() : "?", path.c_str());
      }
      continue;
    }
    try {
      // A Hugging Face folder is read as its GGUF would be (hf_folder.h); its size is its
      // tensors' bytes.
      const bool folder = is_hf_folder(path);
      const std::unique_ptr<GgufFile> file = open_model_file(path);
      const ModelConfig c = ModelConfig::from_gguf(*file);
      int64_t params = 0, bytes = 0;
      for (const auto& t : file->tensors()) {
        params += t.n_elements();
        bytes += t.n_bytes();
      }
      if (!folder) bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
      std::printf("%-13s %-40.40s %-6s %6.0fM %6d %2d/%-2d %5d %8.1f  %s%s\n", shown,
                  c.name.c_str(), std::string(c.arch->name).c_str(), params / 1e6, c.n_layers, c.n_heads,
                  c.n_kv_heads, c.context_length, bytes / 1048576.0, path.c_str(),
                  folder ? " (Hugging Face folder)" : "");
    } catch (const InputError& e) {
      std::printf("%-13s unusable: %s\n", shown, e.what());
    }
  }
}

const char* type_name(ParamType type) {
  switch (type) {
    case ParamType::Int: return "int";
    case ParamType::Float: return "float";
    case ParamType::Choice: return "choice";
    case ParamType::Text: return "text";
    case ParamType::Bytes: return "bytes";
  }
  return "";
}

void list_methods() {
  for (const MethodInfo& m : method_registry()) {
    std::printf("%s\n  %s\n  stage: %s\n", m.name.c_str(), m.summary.c_str(), m.stage.c_str());
    if (!m.plugin.empty()) {
      std::printf("  plugin: %s (sha256 %s)\n", m.plugin.c_str(), m.plugin_sha256.c_str());
    }
    if (m.paper != "-") std::printf("  paper: %s\n", m.paper.c_str());
    for (const std::string& choice : m.choices) std::printf("  choice: %s\n", choice.c_str());
    for (const ParamInfo& p : m.params) {
      std::string rule;
      if (p.type == ParamType::Choice) {
        for (const auto& c : p.choices) rule += (rule.empty() ? "" : "|") + c;
      } else if (p.type == ParamType::Text || p.type == ParamType::Bytes) {
        rule = type_name(p.type);
      } else {
        // Integers as integers; "max" only when there is one worth printing.
        const auto num = [&](double x) {
          char b[32];
          std::snprintf(b, sizeof(b), p.type == ParamType::Int ? "%.0f" : "%g", x);
          return std::string(b);
        };
        rule = std::string(type_name(p.type)) + " ";
        if (p.max >= 1e9) {
          rule += (p.min_exclusive ? "> " : ">= ") + num(p.min);
        } else {
          rule += std::string("in ") + (p.min_exclusive ? "(" : "[") + num(p.min) + ", " +
                  num(p.max) + "]";
        }
      }
      const std::string def = p.default_value.empty() ? "unset" : p.default_value;
      std::printf("    %-8s %-6s %-18s %s\n", p.name.c_str(), def.c_str(), rule.c_str(),
                  p.help.c_str());
    }
  }
  std::printf("\nspec: %s\n", kSpecForm);
}

void list_tasks() {
  for (const TaskInfo& task : task_registry()) {
    const TaskFormat& format = kvbench::task_format(task.name);
    std::printf("%s\n  %s\n  scored by %s, at most %d new tokens per turn\n", task.name.c_str(),
                task.description.c_str(), scorer_name(format.scorer), format.max_new_tokens);
    for (const KnobInfo& knob : task.knobs) {
      std::printf("    %-14s %-20s %s\n", knob.name.c_str(), knob.default_value.c_str(),
                  knob.description.c_str());
    }
  }
  const GeneratorOptions defaults;
  std::printf("\nevery generated task: context_tokens %lld, turns %d, samples %d, seed %llu "
              "(defaults)\n",
              static_cast<long long>(defaults.context_tokens), defaults.turns, defaults.samples,
              static_cast<unsigned long long>(defaults.seed));
  std::printf("\ncorpora of niah and repoqa (pinned; scripts/setup.sh unpacks them into %s):\n",
              corpus_dir().c_str());
  for (const CorpusInfo& corpus : corpus_registry()) {
    std::printf("  %-16s %s\n  %-16s %s\n", corpus.name.c_str(), corpus.source.c_str(), "",
                corpus.content.c_str());
  }
  std::printf("\nSCBench task files (kvbench run --task NAME --data FILE.jsonl):\n");
  for (const TaskFormat& format : task_formats()) {
    if (format.source != TaskSource::Scbench) continue;
    std::printf("  %-28s %-12s %5d new tokens  %s\n", format.name.c_str(),
                scorer_name(format.scorer), format.max_new_tokens, format.summary.c_str());
  }
}

// `list tasks --export`: a generated task's samples as SCBench JSONL, the text exactly as a
// sweep feeds it to the model (context and queries; the chat template is the session's),
// with the task named so that `kvbench session --sample FILE` scores it as a sweep does.
// Another tool (scripts/kvpress_side_by_side.py --samples) can then run the same inputs.
struct ExportArgs {
  std::string task;  // a label: "niah" or "retr_kv[hops=2]"
  GeneratorOptions generator;
  std::string out;  // empty: stdout
};

void export_task(const ModelOptions& model_options, const ExportArgs& args) {
  const SweepTask task = parse_task_label(args.task);  // a generated task, or InputError
  if (!args.out.empty()) {
    check_output_file(args.out, {}, "--out");
    check_writable(args.out, "--out");
  }
  GeneratorOptions g = args.generator;
  g.task = task.name;
  g.knobs = task.knobs;
  // Samples are sized in the model's tokens: its tokenizer, not its weights.
  const std::unique_ptr<GgufFile> file = open_model_file(resolve_model_path(model_options));
  std::string text;
  for (Sample& sample : generate_samples(g, Tokenizer::from_gguf(*file))) {
    sample.task = task.name;
    text += sample_jsonl_line(sample) + "\n";
  }
  if (args.out.empty()) {
    std::cout << text << std::flush;
  } else {
    write_file_atomically(args.out, text, "sample file");
    std::fprintf(stderr, "list tasks: wrote %d %s sample(s) of %lld tokens to %s\n", g.samples,
                 args.task.c_str(), static_cast<long long>(g.context_tokens), args.out.c_str());
  }
}

}  // namespace

void add_list_command(CLI::App& app, ModelOptions& model) {
  CLI::App* cmd = app.add_subcommand("list", "List what kvbench can run");
  cmd->require_subcommand(1);
  cmd->add_subcommand("models",
                     "GGUF models and Hugging Face folders found (models/, $KVBENCH_MODEL, --model)")
      ->callback([&model] { list_models(model); });
  cmd->add_subcommand("methods", "Cache methods with their parameters, defaults and papers")
      ->callback([] { list_methods(); });
  auto exported = std::make_shared<ExportArgs>();
  CLI::App* tasks =
      cmd->add_subcommand("tasks", "Tasks: the generated ones with their knobs, and SCBench's task files");
  tasks->add_option("--export", exported->task,
                    "Write this generated task's samples as SCBench JSONL instead (a task "
                    "label, e.g. niah or retr_kv[hops=2]; sized with --model's tokenizer)");
  tasks->add_option("--samples", exported->generator.samples, "With --export: samples")
      ->check(CLI::Range(1, 100000));
  tasks->add_option("--context-tokens", exported->generator.context_tokens,
                    "With --export: context length in tokens")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  tasks->add_option("--turns", exported->generator.turns, "With --export: questions per sample")
      ->check(CLI::Range(1, 1000));
  tasks->add_option("--seed", exported->generator.seed, "With --export: the generator's seed");
  tasks->add_option("-o,--out", exported->out, "With --export: the JSONL file (default stdout)");
  tasks->callback([&model, tasks, exported] {
    if (exported->task.empty()) {
      for (const char* option : {"--samples", "--context-tokens", "--turns", "--seed", "--out"}) {
        if (tasks->count(option) > 0) throw InputError(std::string(option) + " needs --export TASK");
      }
      list_tasks();
    } else {
      export_task(model, *exported);
    }
  });
}

}  // namespace kvbench
