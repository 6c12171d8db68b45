// A real-size model's forward pass on a GPU against the same model on the CPU: logits of a
// prompt longer than one prefill chunk, greedy decoding, and the cache's bytes (the same
// stores' growth, in the "device" tier). The model is $KVBENCH_MODEL, else a random-weight
// GGUF of SmolLM2-135M's shape written by the test (testing::gpu_model_path). Without a CUDA
// device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_device.h"
#include "harness/generate.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "methods/registry.h"
#include "model_path.h"

using namespace kvbench;

namespace {

std::vector<int32_t> long_prompt(const LlamaModel& model) {
  std::string text;
  std::vector<int32_t> tokens;
  for (int i = 0; tokens.size() < 1000; ++i) {  // two prefill chunks, whatever the vocabulary
    text += "Note " + std::to_string(i) + ": the access code of room " + std::to_string(100 + i) +
            " is " + std::to_string(7919 * (i + 3) % 10000) + ". ";
    tokens = model.tokenizer().encode(text);
  }
  return tokens;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST_CASE("the model on a GPU gives the CPU's logits and greedy tokens", "[gpu]") {
  testing::require_device();
  const std::string path = testing::gpu_model_path();
  const auto cpu = LlamaModel::load(path);
  const auto gpu = LlamaModel::load(path, ModelDevice::Cuda);
  REQUIRE(gpu->device() == ModelDevice::Cuda);
  const ResolvedSpec full = resolve_method_spec("full");
  const std::vector<int32_t> prompt = long_prompt(*cpu);
  REQUIRE(prompt.size() > 600);

  KvCache cpu_cache = new_cache(*cpu, full);
  KvCache gpu_cache = new_cache(*gpu, full);
  const std::vector<float> cpu_logits = cpu->forward(prompt, cpu_cache, true);
  const std::vector<float> gpu_logits = gpu->forward(prompt, gpu_cache, true);
  REQUIRE(gpu_logits.size() == cpu_logits.size());
  // fp32 on both, summed in different orders (cuBLAS vs OpenBLAS): logits of about 10-30.
  CHECK(max_abs_diff(gpu_logits, cpu_logits) < 2e-2f);

  const CacheStats cpu_stats = cpu_cache.stats(), gpu_stats = gpu_cache.stats();
  CHECK(gpu_stats.bytes_resident == cpu_stats.bytes_resident);
  CHECK(gpu_stats.tokens_per_layer == cpu_stats.tokens_per_layer);
  REQUIRE(gpu_stats.tiers.size() == 1);
  CHECK(gpu_stats.tiers[0].tier == "device");

  // Decoding from the cache: the same greedy tokens.
  GenerateOptions options;
  options.max_new_tokens = 24;
  KvCache a = new_cache(*cpu, full), b = new_cache(*gpu, full);
  const GenerateResult on_cpu = generate(*cpu, a, prompt, options);
  const GenerateResult on_gpu = generate(*gpu, b, prompt, options);
  CHECK(on_gpu.tokens == on_cpu.tokens);
  CHECK(on_gpu.text == on_cpu.text);
}

TEST_CASE("eviction methods, Quest and KIVI on a GPU decide as on the CPU", "[gpu]") {
  testing::require_device();
  const std::string path = testing::gpu_model_path();
  const auto cpu = LlamaModel::load(path);
  const auto gpu = LlamaModel::load(path, ModelDevice::Cuda);
  const std::vector<int32_t> prompt = long_prompt(*cpu);
  // Once-only (snapkv), every step (h2o, streamingllm), decode-time retrieval (quest), packed
  // storage (kivi) and eviction before packing.
  for (const char* method : {"snapkv:budget=256", "h2o:budget=256", "streamingllm:budget=128",
                             "quest:page=16,budget=128", "kivi:bits=4",
                             "snapkv:budget=256+kivi:bits=2"}) {
    INFO(method);
    const ResolvedSpec spec = resolve_method_spec(method);
    KvCache a = new_cache(*cpu, spec), b = new_cache(*gpu, spec);
    GenerateOptions options;
    options.max_new_tokens = 12;
    const GenerateResult on_cpu = generate(*cpu, a, prompt, options);
    const GenerateResult on_gpu = generate(*gpu, b, prompt, options);
    CHECK(on_gpu.tokens == on_cpu.tokens);
    CHECK(on_gpu.cache.tokens_per_layer == on_cpu.cache.tokens_per_layer);
    CHECK(on_gpu.cache.bytes_read_last_forward == on_cpu.cache.bytes_read_last_forward);
  }
}

TEST_CASE("a model on a GPU refuses what it cannot run", "[gpu]") {
  testing::require_device();
  const auto gpu = LlamaModel::load(testing::gpu_model_path(), ModelDevice::Cuda);
  CHECK_THROWS_WITH(new_cache(*gpu, resolve_method_spec("snapkv:budget=64+prefix")),
                    Catch::Contains("does not run on --device cuda"));
  KvCache cache = new_cache(*gpu, resolve_method_spec("full"));
  const std::vector<float> k(10 * 576);
  CHECK_THROWS_WITH(gpu->forward_blend({1, 2, 3}, k.data(), k.data(), 0.15, 1, cache),
                    Catch::Contains("CPU only"));
}
