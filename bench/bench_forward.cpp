// Forward-pass speed of the default model: prefill (64, 512 and 2048 tokens; 64 is a
// typical turn of a multi-turn session) and one-token
// decode at 0, 2K and 4K tokens of context, reported as tokens/s.
// Model: $KVBENCH_MODEL, else the bundled SmolLM2-135M-Instruct Q4_1.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>

#include "bench/bench_model.h"
#include "harness/model/llama_model.h"
#include "methods/full_cache.h"

using namespace kvbench;
using kvbench::bench::model_or_skip;
using kvbench::bench::some_tokens;

namespace {

void BM_Prefill(benchmark::State& state) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const auto tokens = some_tokens(state.range(0), 1);
  for (auto _ : state) {
    KvCache cache = make_full_cache(model->kv_shape());
    cache.reserve(tokens.size());
    benchmark::DoNotOptimize(model->forward(tokens, cache));
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(tokens.size()),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Decode(benchmark::State& state) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const int64_t context = state.range(0);
  constexpr int kSteps = 16;
  KvCache cache = make_full_cache(model->kv_shape());
  cache.reserve(context + 1 + kSteps * 64);
  if (context > 0) model->forward(some_tokens(context, 2), cache);
  const auto next = some_tokens(kSteps, 3);
  // Each iteration decodes kSteps tokens; the context grows by kSteps per iteration,
  // so state.iterations() is capped to keep it near `context`.
  for (auto _ : state) {
    for (int i = 0; i < kSteps; ++i) benchmark::DoNotOptimize(model->forward({next[i]}, cache));
  }
  state.counters["tok/s"] =
      benchmark::Counter(kSteps, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ctx"] = static_cast<double>(cache.next_position());
}

}  // namespace

BENCHMARK(BM_Prefill)->Arg(64)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Decode)->Arg(0)->Arg(2048)->Arg(4096)->Iterations(8)->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
