// `kvbench probe-heads`: the needle probe that ranks duo_attention's KV heads
// (harness/head_probe.h) at a length of the user's choosing, written in the DuoAttention
// authors' gate format, so that a sweep at that length pins its heads with
// `duo_attention:pattern=FILE` (a file in the tree) rather than the cached probe of about
// 265 tokens.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>

#include "common/files.h"
#include "common/input_error.h"
#include "harness/cli/commands.h"
#include "harness/head_probe.h"
#include "harness/model/llama_model.h"

namespace kvbench {

namespace {

struct ProbeHeadsArgs {
  int64_t context_tokens = 0;  // 0: the default probe (ProbeTexts)
  uint32_t seed = ProbeTexts{}.seed;
  std::string out;  // empty: stdout
};

void run_probe_heads(const ModelOptions& model_options, const ProbeHeadsArgs& args) {
  apply_thread_option(model_options);
  const std::string model_path = resolve_model_path(model_options);
  if (!args.out.empty()) {
    check_output_file(args.out, {model_path}, "-o");
    check_writable(args.out, "head pattern file");
  }
  auto model = load_model(model_path, model_options);
  ProbeTexts texts;
  texts.seed = args.seed;
  if (args.context_tokens > 0) {
    texts.filler_sentences =
        filler_sentences_for(model->tokenizer(), args.context_tokens, texts.seed);
  }
  const int64_t tokens = probe_context_tokens(model->tokenizer(), texts);
  // The probe with its question and answer must fit the model's window (checked before it runs).
  if (tokens + 32 > model->config().context_length) {
    throw InputError("--context-tokens " + std::to_string(args.context_tokens) +
                     ": the probes (about " + std::to_string(tokens) +
                     " tokens) do not fit the model's context of " +
                     std::to_string(model->config().context_length));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> scores = probe_retrieval_heads(*model, texts);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const KvShape shape = model->kv_shape();
  const std::string tsv = head_scores_tsv(scores, shape.n_layers, shape.n_kv_heads);
  if (args.out.empty()) {
    std::cout << tsv << std::flush;
  } else {
    write_file_atomically(args.out, tsv, "head pattern file");
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  std::fprintf(stderr,
               "probe-heads: 4 probes of about %lld tokens (%d filler sentences, seed %u), "
               "%d x %d KV heads scored in %.1f s%s%s; highest:",
               static_cast<long long>(tokens), texts.filler_sentences, texts.seed, shape.n_layers,
               shape.n_kv_heads, seconds, args.out.empty() ? "" : ", written to ",
               args.out.c_str());
  for (size_t i = 0; i < std::min<size_t>(5, order.size()); ++i) {
    std::fprintf(stderr, " layer %zu head %zu (%.3f)", order[i] / shape.n_kv_heads,
                 order[i] % shape.n_kv_heads, static_cast<double>(scores[order[i]]));
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

void add_probe_heads_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<ProbeHeadsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "probe-heads",
      "Rank the model's KV heads by retrieval with duo_attention's needle probe, at a chosen "
      "length, as a gate file for duo_attention:pattern=FILE");
  cmd->add_option("--context-tokens", args->context_tokens,
                  "Length of each of the 4 probes in tokens (default: about 265, the probe "
                  "duo_attention runs without a pattern)")
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 20));
  cmd->add_option("--seed", args->seed, "Seed of the pass keys and filler (default 21)");
  cmd->add_option("-o,--output", args->out,
                  "The gate file (one line per layer, a tab-separated score per KV head); "
                  "default stdout");
  cmd->callback([&model, args] { run_probe_heads(model, *args); });
}

}  // namespace kvbench
