// kvbench's sub-commands. Each adds itself to the CLI11 app and runs when chosen.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace kvbench {

// Options every command that loads a model shares.
struct ModelOptions {
  std::string model_path;  // --model; empty: $KVBENCH_MODEL, else the bundled default
  int threads = 0;         // --threads; 0: OpenMP's default
};

// Sets the compute thread count from --threads (before any kernel runs).
void apply_thread_option(const ModelOptions& options);

// The model file to load; throws InputError with set-up advice when it does not exist.
std::string resolve_model_path(const ModelOptions& options);

void add_generate_command(CLI::App& app, ModelOptions& model);
void add_list_command(CLI::App& app, ModelOptions& model);
void add_session_command(CLI::App& app, ModelOptions& model);
void add_run_command(CLI::App& app, ModelOptions& model);

}  // namespace kvbench
