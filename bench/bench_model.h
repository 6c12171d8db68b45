// What the model benchmarks share: the default model (or a skip with the reason) and
// deterministic text-like token ids.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"

namespace kvbench::bench {

// $KVBENCH_MODEL, else the bundled SmolLM2-135M-Instruct Q4_1, loaded once per device and
// dtype; null (and the benchmark marked skipped with the load error, e.g. no CUDA device)
// when it cannot be loaded.
inline LlamaModel* model_or_skip(benchmark::State& state,
                                       ModelDevice device = ModelDevice::Cpu,
                                       ModelDtype dtype = ModelDtype::Fp32) {
  struct Loaded {
    std::unique_ptr<LlamaModel> model;
    std::string error;
    bool warm = false;
  };
  static Loaded on_cpu, on_cuda, on_cuda_bf16;
  Loaded& loaded = device == ModelDevice::Cpu    ? on_cpu
                   : dtype == ModelDtype::Fp32 ? on_cuda
                                               : on_cuda_bf16;
  if (!loaded.model && loaded.error.empty()) {
    const char* env = std::getenv("KVBENCH_MODEL");
    try {
      loaded.model =
          LlamaModel::load(env && *env ? env : KVBENCH_DEFAULT_MODEL, device, dtype);
    } catch (const std::exception& e) {
      loaded.error = e.what();
    }
  }
  if (!loaded.model) {
    state.SkipWithError(loaded.error.c_str());
  } else if (!loaded.warm && device == ModelDevice::Cpu) {
    warm_up(*loaded.model);  // not in any timing
    loaded.warm = true;
  }
  return loaded.model.get();
}

// Deterministic ordinary-text-like ids (no control tokens).
inline std::vector<int32_t> some_tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(200, 20000);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = id(rng);
  return tokens;
}

}  // namespace kvbench::bench
