// The real model for `model`-labelled tests: $KVBENCH_MODEL, else the bundled default.
// When it is absent the test process exits 77, which ctest reports as skipped.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gguf_writer.h"

namespace kvbench::testing {

// Exits 77 (skipped) unless `path` exists.
inline std::string existing_model_or_skip(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    std::printf("model not found at %s (run ./scripts/setup.sh): skipped\n", path.c_str());
    std::exit(77);
  }
  return path;
}

inline std::string model_path_or_skip() {
  const char* env = std::getenv("KVBENCH_MODEL");
  return existing_model_or_skip(env && *env ? env : KVBENCH_DEFAULT_MODEL);
}

// The model of the `gpu` tests: $KVBENCH_MODEL, else a random-weight GGUF of SmolLM2-135M's
// shape that the tests write themselves, so a GPU machine needs no model download. On the
// host emulation (scripts/test --emulated-gpu) the same widths with 4 layers, not 30: the
// emulation checks the host code and each kernel's bounds, which every layer repeats, and
// under ASan the 30 layers took 11 minutes.
inline std::string gpu_model_path() {
  const char* env = std::getenv("KVBENCH_MODEL");
  if (env && *env) return existing_model_or_skip(env);
#ifdef KVBENCH_TEST_EMULATED_GPU
  return random_smollm2_gguf(8192, 4);
#else
  return random_smollm2_gguf();
#endif
}

// The second model setup fetches (qwen2 architecture: q/k/v biases, NeoX RoPE, untied head),
// next to the bundled default.
inline std::string qwen_model_path_or_skip() {
  const std::filesystem::path dir = std::filesystem::path(KVBENCH_DEFAULT_MODEL).parent_path();
  return existing_model_or_skip((dir / "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf").string());
}

// The third model (Qwen2.5-Coder-1.5B), which kvbench fetches on its first use
// (scripts/fetch_model.sh qwen2.5-1.5b); tests skip without it rather than download 1.1 GB.
inline std::string qwen_1_5b_model_path_or_skip() {
  const std::filesystem::path dir = std::filesystem::path(KVBENCH_DEFAULT_MODEL).parent_path();
  return existing_model_or_skip((dir / "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf").string());
}

}  // namespace kvbench::testing
