// `kvbench serve`: an OpenAI-compatible server with continuous batching in a fixed KV memory
// pool (serve/engine.h), every request through a cache method of its own or the server's.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/cli/commands.h"
#include "harness/head_probe.h"
#include "harness/model/known_models.h"
#include "harness/model/llama_model.h"
#include "harness/model_cache.h"
#include "serve/engine.h"
#include "serve/http_server.h"

namespace kvbench {

namespace {

struct ServeArgs {
  ServerOptions server;
  int64_t pool_mib = 1024;
  int32_t max_seqs = 16;
  int32_t max_queue = 1024;
  int32_t prefill_chunk = 256;
  std::string prompt_packing = "chunk";
  double grace_s = 30;
};

// SIGTERM and SIGINT reach a handler that only writes their number down a pipe (a signal may
// land on any thread, OpenBLAS's own included); a watcher thread reads it and stops the server.
int signal_pipe[2] = {-1, -1};

void on_stop_signal(int signal) {
  const char byte = static_cast<char>(signal);
  [[maybe_unused]] const ssize_t n = write(signal_pipe[1], &byte, 1);
}

void run_serve(const ModelOptions& model_options, ServeArgs args) {
  const ResolvedSpec method = resolve_method_spec(args.server.method);  // before the model loads
  check_runs_on(method, model_device(model_options));
  apply_thread_option(model_options);
  const std::string path = resolve_model_path(model_options);
  auto model = load_model(path, model_options);
  prepare_head_retrieval(*model, path, {method});
  const std::string name = known_model_name(path);
  if (args.server.model_id.empty()) {
    args.server.model_id = name.empty() ? std::filesystem::path(path).filename().string() : name;
  }
  EngineOptions engine_options;
  engine_options.pool_bytes = args.pool_mib << 20;
  engine_options.max_seqs = args.max_seqs;
  engine_options.max_waiting = args.max_queue;
  engine_options.prefill_chunk = args.prefill_chunk;
  engine_options.pack_prompt_chunks = args.prompt_packing == "chunk";
  ServingEngine engine(*model, engine_options);
  HttpServer server(*model, engine, args.server);

  warm_up(*model);
  const int port = server.bind();
  std::thread engine_thread([&] { engine.run(); });
  if (pipe(signal_pipe) != 0) throw std::runtime_error("serve: cannot make the signal pipe");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::thread([&engine, &server, grace = args.grace_s] {
    char signal = 0;
    while (read(signal_pipe[0], &signal, 1) != 1) {
    }
    std::fprintf(stderr, "kvbench serve: %s: no new requests; %.0f s for those running\n",
                 signal == SIGTERM ? "SIGTERM" : "SIGINT", grace);
    engine.stop(std::chrono::milliseconds(static_cast<int64_t>(grace * 1000)));
    // Every sequence ended, then every response written whole (at most 10 s more), then the
    // listening socket closes: httplib's stop() would cut a stream mid-way. A second signal
    // meanwhile cancels what runs now.
    fcntl(signal_pipe[0], F_SETFL, O_NONBLOCK);
    while (!engine.finished()) {
      if (read(signal_pipe[0], &signal, 1) == 1) engine.stop(std::chrono::milliseconds(0));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int i = 0; i < 500 && server.in_flight() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    server.stop();
  }).detach();
  std::printf("kvbench serve: %s, method %s, KV pool %lld MiB, at most %d sequences; "
              "listening on http://%s:%d\n",
              args.server.model_id.c_str(), method.canonical.c_str(),
              static_cast<long long>(args.pool_mib), args.max_seqs, args.server.host.c_str(), port);
  std::fflush(stdout);
  server.serve();  // returns once stopped and every request in flight is answered
  engine_thread.join();
  const EngineMetrics m = engine.metrics();
  std::fprintf(stderr,
               "kvbench serve: stopped; %lld requests answered, %lld cancelled, %lld refused, "
               "%lld tokens generated\n",
               static_cast<long long>(m.requests_finished),
               static_cast<long long>(m.requests_cancelled),
               static_cast<long long>(m.requests_refused),
               static_cast<long long>(m.generated_tokens));
}

}  // namespace

void add_serve_command(CLI::App& app, ModelOptions& model) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "An OpenAI-compatible server: continuous batching in a fixed KV memory pool, "
               "a cache method per request");
  cmd->add_option("--method", args->server.method,
                  "The server's cache method (default full); a request may name its own in "
                  "\"kvbench\": {\"method\": SPEC}");
  cmd->add_option("--kv-pool-mib", args->pool_mib,
                  "KV memory pool in MiB: requests start when their cache fits (default 1024)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--max-seqs", args->max_seqs, "Most sequences running at once (default 16)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-queue", args->max_queue,
                  "Most requests waiting; more are refused with 503 (default 1024)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prefill-chunk", args->prefill_chunk,
                  "Prompt tokens prefilled between two decode steps (default 256)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--prompt-packing", args->prompt_packing,
                  "chunk (default): a store that packs by blocks (KIVI) packs each prompt chunk "
                  "as it comes in, later chunks attending over the packed ones, as a serving "
                  "engine's quantized cache does; end: the prompt attends over itself at fp32 "
                  "and is packed at its end, as KIVI's code and the sweeps do (held whole at "
                  "fp32 meanwhile)")
      ->check(CLI::IsMember({"chunk", "end"}));
  cmd->add_option("--host", args->server.host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", args->server.port, "Port (default 8080; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--served-model-name", args->server.model_id,
                  "The model's name in the API (default the short name or the file name)");
  cmd->add_option("--grace", args->grace_s,
                  "Seconds running requests get to finish after SIGTERM or SIGINT, then they are "
                  "cancelled (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->callback([&model, args] { run_serve(model, *args); });
}

}  // namespace kvbench
