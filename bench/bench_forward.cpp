// Forward-pass speed of the default model: prefill (64, 512 and 2048 tokens; 64 is a
// typical turn of a multi-turn session) and one-token
// decode at 0, 2K and 4K tokens of context, reported as tokens/s. Then CacheBlend side by
// side with the full prefill it replaces: a 4K-token docs_kv context (8 documents) prefilled
// in full, and blended from its documents' cached KV (computed before timing) at 15%
// recompute and at 0% (naive reuse: gathering and re-rotation alone). decode_method: decode
// at a 4K context with full, snapkv, kivi and quest. In a CUDA build, prefill, decode and
// decode_method again with the model on a GPU (skipped without a device), the last at 4K and
// 32K with budgets of 1/8.
// Model: $KVBENCH_MODEL, else the bundled SmolLM2-135M-Instruct Q4_1.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_model.h"
#include "cache/full_cache.h"
#include "cache/registry.h"
#include "datasets/generator.h"
#include "harness/cache_blend.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "methods/builtin_methods.h"

using namespace kvbench;
using kvbench::bench::model_or_skip;
using kvbench::bench::some_tokens;

namespace {

// The full cache where `model` runs: host stores on the CPU, device stores on a GPU.
KvCache full_cache_for(const LlamaModel& model) {
  return new_cache(model, resolve_method_spec("full"));
}

void prefill(benchmark::State& state, ModelDevice device, ModelDtype dtype = ModelDtype::Fp32,
             Activations activations = Activations::Fp32) {
  LlamaModel* model = model_or_skip(state, device, dtype);
  if (!model) return;
  model->set_prefill_activations(activations);
  const auto tokens = some_tokens(state.range(0), 1);
  for (auto _ : state) {
    KvCache cache = full_cache_for(*model);
    cache.reserve(tokens.size());
    benchmark::DoNotOptimize(model->forward(tokens, cache));
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(tokens.size()),
                                               benchmark::Counter::kIsIterationInvariantRate);
  model->set_prefill_activations(Activations::Fp32);
}

// One-token decode after `context` tokens fed to a cache of `spec` (compressed at the end of
// the context, as a session does).
void decode(benchmark::State& state, ModelDevice device, const char* spec = "full",
            ModelDtype dtype = ModelDtype::Fp32,
            Activations activations = Activations::Fp32) {
  LlamaModel* model = model_or_skip(state, device, dtype);
  if (!model) return;
  const int64_t context = state.range(0);
  constexpr int kSteps = 16;
  if (context + kSteps * static_cast<int64_t>(state.max_iterations) >
      model->config().context_length) {
    state.SkipWithError("the context and the decoded tokens exceed the model's context length");
    return;
  }
  model->set_decode_activations(activations);
  KvCache cache = new_cache(*model, resolve_method_spec(spec));
  cache.reserve(context + 1 + kSteps * 64);
  if (context > 0) model->forward(some_tokens(context, 2), cache);
  cache.end_context();
  const auto next = some_tokens(kSteps, 3);
  // Each iteration decodes kSteps tokens; the context grows by kSteps per iteration,
  // so state.iterations() is capped to keep it near `context`.
  for (auto _ : state) {
    for (int i = 0; i < kSteps; ++i) benchmark::DoNotOptimize(model->decode(next[i], cache));
  }
  state.counters["tok/s"] =
      benchmark::Counter(kSteps, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ctx"] = static_cast<double>(cache.next_position());
  state.counters["KV_MiB"] = static_cast<double>(cache.bytes_resident()) / (1 << 20);
  state.counters["read_KiB"] = static_cast<double>(cache.stats().bytes_read_last_forward) / 1024;
  model->set_decode_activations(Activations::Fp32);
}

// `steps` batched decode steps of every cache per iteration, reported as tokens/s summed over
// the batch.
void time_batched_steps(benchmark::State& state, const LlamaModel& model,
                        std::vector<KvCache>& caches, int steps) {
  const int64_t batch = static_cast<int64_t>(caches.size());
  std::vector<KvCache*> rows;
  for (KvCache& c : caches) rows.push_back(&c);
  const auto next = some_tokens(steps * batch, 3);
  for (auto _ : state) {
    for (int s = 0; s < steps; ++s) {
      const std::vector<int32_t> tokens(next.begin() + s * batch, next.begin() + (s + 1) * batch);
      benchmark::DoNotOptimize(model.decode_batch(tokens, rows));
    }
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(steps * batch),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// One batched decode step of `batch` sequences, each after 128 tokens of context and each
// with its own full cache (serve/: continuous batching), reported as tokens/s summed over the
// batch: against batch 1, what batching buys. Arg 0: the batch, arg 1: 1 for int8 activations.
void BM_DecodeBatch(benchmark::State& state) {
  LlamaModel* model = model_or_skip(state, ModelDevice::Cpu);
  if (!model) return;
  const int64_t batch = state.range(0);
  constexpr int kSteps = 16;
  model->set_decode_activations(state.range(1) ? Activations::Int8 : Activations::Fp32);
  std::vector<KvCache> caches;
  for (int64_t i = 0; i < batch; ++i) {
    caches.push_back(full_cache_for(*model));
    caches.back().reserve(128 + 1 + kSteps * 64);
    model->forward(some_tokens(128, 10 + static_cast<int>(i)), caches.back());
    caches.back().end_context();
  }
  time_batched_steps(state, *model, caches, kSteps);
  model->set_decode_activations(Activations::Fp32);
}

// The pool experiment's decode (docs/serving.md): one batched step of `batch` sequences at
// a 4K-token context, each cache of `spec` (compressed at the context's end), int8
// activations, tok/s summed over the batch. One context prefilled and cloned: the step's cost
// does not depend on which tokens the caches hold. Arg: the batch.
void decode_batch_4k(benchmark::State& state, const char* spec) {
  LlamaModel* model = model_or_skip(state, ModelDevice::Cpu);
  if (!model) return;
  constexpr int64_t kContext = 4096 - 64;
  constexpr int kSteps = 8;
  const int64_t batch = state.range(0);
  if (kContext + kSteps * 8 > model->config().context_length) {
    state.SkipWithError("the context and the decoded tokens exceed the model's context length");
    return;
  }
  model->set_prefill_activations(Activations::Int8);
  model->set_decode_activations(Activations::Int8);
  KvCache first = new_cache(*model, resolve_method_spec(spec));
  first.reserve(kContext);
  model->forward(some_tokens(kContext, 2), first);
  first.end_context();
  std::vector<KvCache> caches;
  for (int64_t i = 0; i < batch; ++i) caches.push_back(first.clone());
  time_batched_steps(state, *model, caches, kSteps);
  state.counters["KV_MiB"] = static_cast<double>(first.bytes_resident()) / (1 << 20);
  model->set_prefill_activations(Activations::Fp32);
  model->set_decode_activations(Activations::Fp32);
}

// The end-to-end set side by side, on the CPU and (in a CUDA build) on a GPU.
void decode_method(benchmark::State& state, ModelDevice device, const char* spec) {
  decode(state, device, spec);
}

void BM_Prefill(benchmark::State& state) { prefill(state, ModelDevice::Cpu); }
// The same with the prefill GEMMs on int8 activations (--prefill-activations int8).
void BM_PrefillInt8(benchmark::State& state) {
  prefill(state, ModelDevice::Cpu, ModelDtype::Fp32, Activations::Int8);
}
void BM_Decode(benchmark::State& state) { decode(state, ModelDevice::Cpu); }
// The same with activations rounded to int8 for integer dot products (--decode-activations).
void BM_DecodeInt8(benchmark::State& state) {
  decode(state, ModelDevice::Cpu, "full", ModelDtype::Fp32, Activations::Int8);
}
// The same on a GPU (--device cuda: the full cache; skipped without a device).
void BM_PrefillCuda(benchmark::State& state) { prefill(state, ModelDevice::Cuda); }
void BM_DecodeCuda(benchmark::State& state) { decode(state, ModelDevice::Cuda); }
// And with bf16 weights and activations (--dtype bf16): half the weight bytes per step.
void BM_PrefillCudaBf16(benchmark::State& state) {
  prefill(state, ModelDevice::Cuda, ModelDtype::Bf16);
}
void BM_DecodeCudaBf16(benchmark::State& state) {
  decode(state, ModelDevice::Cuda, "full", ModelDtype::Bf16);
}

// A docs_kv context of about `tokens` tokens: its documents (each with its trailing blank
// line) tokenized apart and prefilled alone, as a document cache would hold them.
struct DocsContext {
  std::vector<int32_t> tokens;  // the documents' tokens, concatenated
  std::vector<CachedChunk> chunks;
};

const DocsContext& docs_context(const LlamaModel& model, int64_t tokens) {
  static std::map<int64_t, DocsContext> made;
  auto it = made.find(tokens);
  if (it != made.end()) return it->second;
  GeneratorOptions options;
  options.task = "docs_kv";
  options.context_tokens = tokens;
  options.turns = 1;
  const Sample sample = generate_samples(options, model.tokenizer()).front();
  DocsContext docs;
  for (const std::string& doc : sample.documents) {
    docs.chunks.push_back(prefill_chunk(model, model.tokenizer().encode(doc + "\n\n", false)));
    const auto& t = docs.chunks.back().tokens;
    docs.tokens.insert(docs.tokens.end(), t.begin(), t.end());
  }
  return made.emplace(tokens, std::move(docs)).first->second;
}

double full_docs_prefill_s = 0;  // the last BM_DocsFullPrefill time, for BM_DocsBlend's ratio

void BM_DocsFullPrefill(benchmark::State& state) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const DocsContext& docs = docs_context(*model, state.range(0));
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    KvCache cache = make_full_cache(model->kv_shape());
    cache.reserve(docs.tokens.size());
    benchmark::DoNotOptimize(model->forward(docs.tokens, cache));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  full_docs_prefill_s = seconds / static_cast<double>(state.iterations());
  state.counters["tokens"] = static_cast<double>(docs.tokens.size());
}

void BM_DocsBlend(benchmark::State& state) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const DocsContext& docs = docs_context(*model, state.range(0));
  const double ratio = static_cast<double>(state.range(1)) / 100.0;
  std::vector<const CachedChunk*> chunks;
  for (const CachedChunk& c : docs.chunks) chunks.push_back(&c);
  BlendStats stats;
  double seconds = 0, rotate_ms = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    KvCache cache = make_full_cache(model->kv_shape());
    cache.reserve(docs.tokens.size());
    stats = blend_chunks(*model, chunks, ratio, cache);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rotate_ms += stats.rotate_ms;
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["tokens"] = static_cast<double>(stats.tokens);
  state.counters["recomputed"] = static_cast<double>(stats.recomputed);
  state.counters["rotate_ms"] = rotate_ms / iterations;
  if (full_docs_prefill_s > 0) {
    state.counters["x_full"] = seconds / iterations / full_docs_prefill_s;
  }
}

}  // namespace

BENCHMARK(BM_Prefill)->Arg(64)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefillInt8)->Arg(64)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Decode)->Arg(0)->Arg(2048)->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_DecodeBatch)
    ->ArgsProduct({{1, 2, 4, 8, 16}, {0, 1}})
    ->Iterations(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(decode_batch_4k, full, "full")
    ->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(decode_batch_4k, kivi4, "kivi:bits=4")
    ->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeInt8)->Arg(0)->Arg(2048)->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(decode_method, cpu_full, ModelDevice::Cpu, "full")
    ->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(decode_method, cpu_snapkv, ModelDevice::Cpu, "snapkv:budget=512")
    ->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(decode_method, cpu_kivi, ModelDevice::Cpu, "kivi:bits=2")
    ->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(decode_method, cpu_quest, ModelDevice::Cpu, "quest:page=16,budget=512")
    ->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
#ifdef KVBENCH_WITH_CUDA
// On a GPU at 4K and 32K, the budgets as 1/8 of the context (issue 25's end-to-end figures).
// 32K needs a model of that context: KVBENCH_MODEL=$(build/tests/write_random_model 34000).
void cuda_contexts(benchmark::internal::Benchmark* b) {
  b->Arg(4096)->Arg(32768)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK_CAPTURE(decode_method, cuda_full, ModelDevice::Cuda, "full")->Apply(cuda_contexts);
BENCHMARK_CAPTURE(decode_method, cuda_snapkv, ModelDevice::Cuda, "snapkv:ratio=0.125")
    ->Apply(cuda_contexts);
BENCHMARK_CAPTURE(decode_method, cuda_kivi, ModelDevice::Cuda, "kivi:bits=2")
    ->Apply(cuda_contexts);
BENCHMARK_CAPTURE(decode_method, cuda_quest, ModelDevice::Cuda, "quest:page=16,ratio=0.125")
    ->Apply(cuda_contexts);
// Heads of their own (the device store's ragged heads), a narrow store, and an every-step
// eviction (H2O: scored on the device, one row moved in place per step).
BENCHMARK_CAPTURE(decode_method, cuda_adakv, ModelDevice::Cuda, "adakv+snapkv:ratio=0.125")
    ->Apply(cuda_contexts);
BENCHMARK_CAPTURE(decode_method, cuda_fp8, ModelDevice::Cuda, "fp8")
    ->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(decode_method, cuda_h2o, ModelDevice::Cuda, "h2o:ratio=0.125")
    ->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefillCuda)->Arg(64)->Arg(512)->Arg(2048)->Arg(8000)->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_DecodeCuda)->Arg(0)->Arg(2048)->Arg(4096)->Arg(8000)->Iterations(8)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefillCudaBf16)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeCudaBf16)->Arg(0)->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#endif
// Full prefill first: BM_DocsBlend reports its time as a fraction of it (x_full).
BENCHMARK(BM_DocsFullPrefill)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DocsBlend)->Args({4096, 15})->Args({4096, 0})->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// KVBENCH_BENCH_CONTEXTS=4096,8192,16384 (scripts/compare_speed.sh) adds prefill and decode
// (each with fp32 and int8 activations) at those lengths, one iteration each: left out by default, as
// a 16K-token prefill takes minutes on a 2-core machine.
int main(int argc, char** argv) {
  kvbench::register_builtin_methods();
  if (const char* contexts = std::getenv("KVBENCH_BENCH_CONTEXTS"); contexts && *contexts) {
    std::stringstream list(contexts);
    for (std::string item; std::getline(list, item, ',');) {
      char* end = nullptr;
      const long n = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || n < 1 || n > 1 << 20) {
        std::fprintf(stderr, "KVBENCH_BENCH_CONTEXTS='%s': not a list of token counts\n", contexts);
        return 2;
      }
      benchmark::RegisterBenchmark("BM_Prefill", BM_Prefill)
          ->Arg(n)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark("BM_PrefillInt8", BM_PrefillInt8)
          ->Arg(n)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark("BM_Decode", BM_Decode)
          ->Arg(n)->Iterations(4)->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark("BM_DecodeInt8", BM_DecodeInt8)
          ->Arg(n)->Iterations(4)->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
