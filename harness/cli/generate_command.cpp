// `kvbench generate`: chat with the model through any cache method (the full cache by
// default); a smoke test that also prints prefill/decode speed, TTFT and the KV bytes held.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cache/registry.h"
#include "harness/cli/commands.h"
#include "harness/generate.h"
#include "harness/head_probe.h"
#include "harness/model/chat_template.h"
#include "harness/model/gguf.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"

namespace kvbench {

namespace {

struct GenerateArgs {
  std::string prompt;
  std::string system;
  std::string method = "full";
  bool raw = false;
  GenerateOptions options;
};

void run_generate(const ModelOptions& model_options, const GenerateArgs& args) {
  const ResolvedSpec method = resolve_method_spec(args.method);  // before the model loads
  check_runs_on(method, model_device(model_options));
  apply_thread_option(model_options);
  auto model = load_model(resolve_model_path(model_options), model_options);
  prepare_head_retrieval(*model, resolve_model_path(model_options), {method});
  const std::string jinja = model->file().get_string("tokenizer.chat_template", "");
  const ChatFormat format = detect_chat_format(jinja);
  std::string text = args.prompt;
  if (!args.raw) {
    std::vector<ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", args.prompt});
    text = render_chat(format, messages, true, default_system_prompt(jinja));
  }
  const std::vector<int32_t> prompt = model->tokenizer().encode(text);
  // The prompt is the shared context: the method compresses it before the first token.
  KvCache cache = new_cache(*model, method);
  const GenerateResult r = generate(*model, cache, prompt, args.options);

  std::cout << r.text << "\n\n";
  std::printf("prefill: %lld tokens, %.1f tok/s | decode: %zu tokens, %.1f tok/s | TTFT %.1f ms\n",
              static_cast<long long>(r.prompt_tokens), r.prefill_tokens_per_s, r.tokens.size(),
              r.decode_tokens_per_s, r.ttft_ms);
  int64_t kept = 0;
  for (int64_t n : r.cache.tokens_per_layer) kept = std::max(kept, n);
  std::printf("KV cache (%s): %lld bytes resident (%.2f MiB, peak %lld), at most %lld of %lld "
              "tokens kept per layer x %d layers; stop: %s\n",
              method.canonical.c_str(), static_cast<long long>(r.cache.bytes_resident),
              r.cache.bytes_resident / 1048576.0, static_cast<long long>(r.cache.bytes_peak),
              static_cast<long long>(kept), static_cast<long long>(r.cache.tokens_seen),
              model->config().n_layers, r.stop_reason.c_str());
}

}  // namespace

void add_generate_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Answer one prompt through a cache method");
  cmd->add_option("--prompt", args->prompt, "User message")->required();
  cmd->add_option("--system", args->system, "System message");
  cmd->add_option("--method", args->method,
                  "Cache method spec, e.g. snapkv:budget=64 (default full; kvbench list methods)");
  cmd->add_flag("--raw", args->raw, "Feed the prompt as is, without the chat template");
  cmd->add_option("--max-new", args->options.max_new_tokens, "Most tokens to generate")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->options.temperature, "0 for greedy")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--seed", args->options.seed, "Sampling seed");
  cmd->callback([&model, args] { run_generate(model, *args); });
}

}  // namespace kvbench
