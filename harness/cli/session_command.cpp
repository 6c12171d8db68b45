// `kvbench session`: runs SCBench-style samples (JSONL) through one or more cache methods,
// multi-turn or multi-request, with the full cache first as the fidelity reference (run
// once per sample and shared by every method), and prints a table per sample and method:
// TTFT, TPOT, KV bytes, tokens kept, first-token KL, top-1 agreement, answers.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "datasets/sample.h"
#include "harness/cli/commands.h"
#include "harness/input_error.h"
#include "harness/model/llama_model.h"
#include "harness/session.h"
#include "methods/registry.h"

namespace kvbench {

namespace {

struct SessionArgs {
  std::string sample_path;
  std::vector<std::string> methods;
  std::string mode;
  std::string append = "gold";
  int32_t max_new = 64;
  int32_t turns = 0;
  std::string sample_id;
  bool no_fidelity = false;
};

double mib(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

// Answer text for one table cell: control characters escaped, at most `width` characters
// (UTF-8 aware), quoted.
std::string cell_text(const std::string& text, size_t width) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) {  // a character starts here
      if (chars == width) {
        out += "...";
        break;
      }
      ++chars;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      out += "?";
    } else {
      out += static_cast<char>(c);
    }
  }
  return "\"" + out + "\"";
}

std::string lower_trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  std::string t = s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  return t;
}

// A rough check for the table, not a task scorer: some accepted answer occurs in the
// prediction (case-insensitive).
bool answer_found(const std::string& prediction, const SampleTurn& turn) {
  const std::string p = lower_trimmed(prediction);
  for (const std::string& a : turn.answers) {
    const std::string t = lower_trimmed(a);
    if (!t.empty() && p.find(t) != std::string::npos) return true;
  }
  return false;
}

void print_sample(const Sample& sample, const SessionResult& r) {
  std::printf("\nsample %s: context %lld tokens", sample.id.c_str(),
              static_cast<long long>(r.context_tokens));
  if (r.mode == SessionMode::MultiTurn) {
    std::printf(" (prefill + compression %.1f ms)", r.context_prefill_ms);
  }
  std::printf(", %zu turn%s\n", r.turns.size(), r.turns.size() == 1 ? "" : "s");
  std::printf("%4s %7s %9s %8s %7s %8s %8s %10s %8s %6s %5s  %s\n", "turn", "prompt", "TTFT ms",
              "TPOT ms", "tok/s", "KV MiB", "peak MiB", "kept/layer", "KL", "top-1", "trunc",
              "prediction | reference");
  double ttft = 0, tpot = 0, kl = 0, top1 = 0;
  int64_t peak = 0;
  int found = 0, tpot_n = 0;
  for (const TurnRecord& t : r.turns) {
    char kl_text[32] = "-", top1_text[32] = "-";
    if (r.fidelity) {
      std::snprintf(kl_text, sizeof kl_text, "%.4f", t.first_token_kl);
      std::snprintf(top1_text, sizeof top1_text, "%.3f", t.top1_agreement);
    }
    const bool truncated = t.stop_reason != "end_of_turn";
    std::printf("%4d %7lld %9.1f %8.1f %7.1f %8.2f %8.2f %10.1f %8s %6s %5s  %s | %s\n", t.turn,
                static_cast<long long>(t.prompt_tokens), t.ttft_ms, t.tpot_ms,
                t.decode_tokens_per_s, mib(t.kv_bytes), mib(t.kv_bytes_peak), t.tokens_kept,
                kl_text, top1_text, truncated ? "yes" : "no", cell_text(t.prediction, 40).c_str(),
                cell_text(t.reference, 40).c_str());
    ttft += t.ttft_ms;
    if (t.tpot_ms > 0) {
      tpot += t.tpot_ms;
      ++tpot_n;
    }
    kl += t.first_token_kl;
    top1 += t.top1_agreement;
    peak = std::max(peak, t.kv_bytes_peak);
    found += answer_found(t.prediction, sample.turns[t.turn - 1]);
  }
  const double n = static_cast<double>(std::max<size_t>(r.turns.size(), 1));
  std::printf("summary %s: %zu turn%s | mean TTFT %.1f ms | mean TPOT %.1f ms | KV %.2f MiB after "
              "the last turn, peak %.2f MiB | ",
              sample.id.c_str(), r.turns.size(), r.turns.size() == 1 ? "" : "s", ttft / n, tpot_n ? tpot / tpot_n : 0.0,
              r.turns.empty() ? 0.0 : mib(r.turns.back().kv_bytes), mib(peak));
  if (r.fidelity) {
    std::printf("mean KL %.4f | mean top-1 %.3f | ", kl / n, top1 / n);
  } else {
    std::printf("no fidelity | ");
  }
  std::printf("answer found in prediction %d/%zu\n", found, r.turns.size());
  std::fflush(stdout);
}

void run_session_command(const ModelOptions& model_options, const SessionArgs& args) {
  apply_thread_option(model_options);
  // Everything a user can get wrong is checked before the model loads.
  SessionOptions options;
  options.mode = parse_session_mode(args.mode);
  options.append = parse_answer_source(args.append);
  options.max_new_tokens = args.max_new;
  options.max_turns = args.turns;
  std::vector<ResolvedSpec> specs;
  for (const std::string& method : args.methods) specs.push_back(resolve_method_spec(method));
  std::vector<Sample> samples = load_samples_jsonl(args.sample_path);
  if (!args.sample_id.empty()) {
    const auto it = std::find_if(samples.begin(), samples.end(),
                                 [&](const Sample& s) { return s.id == args.sample_id; });
    if (it == samples.end()) {
      throw InputError("no sample with id '" + args.sample_id + "' in " + args.sample_path);
    }
    samples = {*it};
  }
  auto model = LlamaModel::load(resolve_model_path(model_options));

  std::printf("methods:");
  for (const ResolvedSpec& spec : specs) std::printf(" %s", spec.canonical.c_str());
  std::printf("\nmode: %s, append %s, max-new %d, %zu sample(s) from %s\n",
              to_string(options.mode), to_string(options.append), options.max_new_tokens,
              samples.size(), args.sample_path.c_str());
  std::printf(args.no_fidelity
                  ? "fidelity: off (--no-fidelity)\n"
                  : "fidelity: against the full cache, run once per sample in the same mode\n");
  std::fflush(stdout);

  for (const Sample& sample : samples) {
    // The full-cache reference, once per sample for every method (full is its own).
    std::optional<SessionResult> full;
    if (!args.no_fidelity) full = run_session(*model, sample, "full", options, nullptr);
    for (const ResolvedSpec& spec : specs) {
      const bool is_full =
          spec.components.size() == 1 && spec.components[0].first->kind == MethodKind::Full;
      SessionResult result = is_full && full
                                 ? *full
                                 : run_session(*model, sample, spec.canonical, options, nullptr);
      if (full) apply_reference(result, reference_of(*full));
      std::printf("\nmethod: %s", result.method.c_str());
      print_sample(sample, result);
    }
  }
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
  cmd->add_option("--max-new", args->max_new, "Most tokens to decode per turn")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--turns", args->turns, "Run at most this many turns per sample (0: all)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--sample-id", args->sample_id, "Run only the sample with this id");
  cmd->add_flag("--no-fidelity", args->no_fidelity,
                "Skip the full-cache reference run (KL and top-1 are not measured)");
  cmd->callback([&model, args] { run_session_command(model, *args); });
}

}  // namespace kvbench
