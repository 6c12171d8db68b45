// `kvbench score`: another tool's answers scored by kvbench's own scorers. Given the samples
// (SCBench JSONL naming their task, as `kvbench list tasks --export` writes them) and a
// JSONL of predictions, one per line {"sample", "turn", "prediction", ...}, it writes each
// line back with its "score" and prints the mean per method. The same scorer as a sweep,
// so a side-by-side (scripts/kvpress_side_by_side.py --samples) compares answers, not two
// implementations of "contains".
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "common/files.h"
#include "common/input_error.h"
#include "common/json_input.h"
#include "datasets/sample.h"
#include "harness/cli/commands.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

struct ScoreArgs {
  std::string sample_path;
  std::string predictions_path;
  std::string out;  // empty: stdout
};

struct MethodTotal {
  double score = 0;
  int64_t turns = 0;
};

void run_score_command(const ScoreArgs& args) {
  if (!args.out.empty()) {
    check_output_file(args.out, {args.sample_path, args.predictions_path}, "--out");
    check_writable(args.out, "--out");
  }
  std::map<std::string, Sample> samples;
  for (Sample& sample : load_samples_jsonl(args.sample_path)) {
    if (!named_task(sample, args.sample_path)) {
      throw InputError(args.sample_path + ": sample '" + sample.id +
                       "' names no task kvbench scores (kvbench list tasks --export writes it)");
    }
    samples.emplace(sample.id, std::move(sample));
  }
  std::istringstream in(read_regular_file(args.predictions_path, "predictions file"));
  std::string line, text;
  std::map<std::string, MethodTotal> totals;
  std::vector<std::string> order;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = args.predictions_path + ":" + std::to_string(line_no);
    nlohmann::json row = parse_json_input(line, where);
    const auto field = [&](const char* name, bool (nlohmann::json::*is)() const noexcept,
                           const char* type) -> const nlohmann::json& {
      const auto it = row.is_object() ? row.find(name) : row.end();
      if (it == row.end() || !((*it).*is)()) {
        throw InputError(where + ": needs a field '" + name + "' (" + type + ")");
      }
      return *it;
    };
    const std::string id = field("sample", &nlohmann::json::is_string, "a string");
    const int64_t turn = field("turn", &nlohmann::json::is_number_integer, "an integer");
    const std::string prediction = field("prediction", &nlohmann::json::is_string, "a string");
    const auto sample = samples.find(id);
    if (sample == samples.end()) {
      throw InputError(where + ": no sample '" + id + "' in " + args.sample_path);
    }
    if (turn < 1 || turn > static_cast<int64_t>(sample->second.turns.size())) {
      throw InputError(where + ": sample '" + id + "' has no turn " + std::to_string(turn));
    }
    const double score = score_turn(sample->second,
                                    sample->second.turns[static_cast<size_t>(turn - 1)], prediction);
    row["score"] = score;
    text += dump_json(row) + "\n";
    const auto method = row.find("method");
    const std::string name = method != row.end() && method->is_string() ? method->get<std::string>()
                                                                        : "-";
    if (totals.find(name) == totals.end()) order.push_back(name);
    totals[name].score += score;
    totals[name].turns += 1;
  }
  if (order.empty()) throw InputError(args.predictions_path + ": no predictions (the file is empty)");
  if (args.out.empty()) {
    std::cout << text << std::flush;
  } else {
    write_file_atomically(args.out, text, "scored predictions");
  }
  for (const std::string& name : order) {
    const MethodTotal& t = totals[name];
    std::fprintf(stderr, "score: %-48s %6.1f%% of %lld turns\n", name.c_str(),
                 100.0 * t.score / static_cast<double>(t.turns), static_cast<long long>(t.turns));
  }
}

}  // namespace

void add_score_command(CLI::App& app) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* cmd = app.add_subcommand(
      "score", "Score another tool's answers to exported samples with kvbench's scorers");
  cmd->add_option("--sample", args->sample_path,
                  "JSONL samples naming their task (kvbench list tasks --export)")
      ->required();
  cmd->add_option("--predictions", args->predictions_path,
                  "JSONL, one answer a line: {\"sample\", \"turn\" (from 1), \"prediction\", "
                  "\"method\"?, ...}")
      ->required();
  cmd->add_option("-o,--out", args->out, "The predictions with their scores (default stdout)");
  cmd->callback([args] { run_score_command(*args); });
}

}  // namespace kvbench
