// Time to first token of a request whose context is cached (prefix reuse), against
// prefilling only its new tokens on a cache that already holds the context: the cost of
// loading blocks from each tier. Issue 8's goal: a full prefix hit from the device tier at
// most 1.2x the new tokens' prefill.
//   ./build/bench/bench_prefix --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <filesystem>
#include <string>

#include "bench_model.h"
#include "cache/full_cache.h"
#include "methods/builtin_methods.h"
#include "reuse/prefix_cache.h"

namespace kvbench::bench {
namespace {

constexpr int64_t kQueryTokens = 32;
constexpr int64_t kBlock = 256;

// The context (a whole number of blocks) followed by a query.
std::vector<int32_t> request_prompt(int64_t context) {
  std::vector<int32_t> prompt = some_tokens(context, 7);
  const std::vector<int32_t> query = some_tokens(kQueryTokens, 11);
  prompt.insert(prompt.end(), query.begin(), query.end());
  return prompt;
}

// The baseline: the context is in the cache already (a multi-turn conversation), and only
// the query is prefilled.
void BM_PrefillNewTokensOnly(benchmark::State& state) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const int64_t context = state.range(0);
  const std::vector<int32_t> prompt = request_prompt(context);
  KvCache prefilled = make_full_cache(model->kv_shape());
  prefilled.reserve(context + kQueryTokens);
  model->forward(std::vector<int32_t>(prompt.begin(), prompt.begin() + context), prefilled);
  const std::vector<int32_t> query(prompt.begin() + context, prompt.end());
  for (auto _ : state) {
    state.PauseTiming();
    KvCache cache = prefilled.clone();
    cache.reserve(context + kQueryTokens);
    state.ResumeTiming();
    benchmark::DoNotOptimize(model->forward(query, cache));
  }
}

// A full prefix hit: a fresh cache, the context's blocks loaded from one tier (0 device,
// 1 CPU memory, 2 disk), then the query prefilled.
void BM_PrefixHitTtft(benchmark::State& state) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const int64_t context = state.range(0);
  const int tier = static_cast<int>(state.range(1));
  const std::vector<int32_t> prompt = request_prompt(context);
  ReuseConfig config;
  config.block_tokens = kBlock;
  const std::string dir = (std::filesystem::temp_directory_path() / "kvbench_bench_prefix").string();
  // Device holds the whole context, or nothing (too small for a block: a lower tier serves).
  config.tiers.device_bytes = tier == 0 ? int64_t{4} << 30 : 1024;
  if (tier == 1) config.tiers.cpu_bytes = int64_t{4} << 30;
  if (tier == 2) {
    std::filesystem::create_directories(dir);
    config.tiers.disk_dir = dir;
  }
  PrefixCache reuse(config, "bench-model", model->kv_shape());
  {
    ReuseTurn first;
    KvCache cold = make_full_cache(model->kv_shape());
    cold.reserve(context + kQueryTokens);
    reuse.start_capture(cold, prompt, 0);
    model->forward(prompt, cold);
    reuse.store(cold, first);
  }
  ReuseTurn turn;
  for (auto _ : state) {
    state.PauseTiming();
    KvCache cache = make_full_cache(model->kv_shape());
    turn = ReuseTurn();
    state.ResumeTiming();
    cache.reserve(context + kQueryTokens);
    const int64_t loaded = reuse.load(prompt, cache, turn);
    benchmark::DoNotOptimize(
        model->forward(std::vector<int32_t>(prompt.begin() + loaded, prompt.end()), cache));
  }
  if (turn.tokens_reused != context) state.SkipWithError("the context was not all loaded");
  state.counters["load_ms"] = turn.load_ms;
  state.counters["loaded_MiB"] = static_cast<double>(turn.bytes_loaded) / (1 << 20);
  state.counters["load_GBps"] = turn.bytes_loaded / (turn.load_ms * 1e6);
  state.SetLabel(turn.served_by);
}

BENCHMARK(BM_PrefillNewTokensOnly)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefixHitTtft)
    ->Args({1024, 0})->Args({4096, 0})->Args({4096, 1})->Args({4096, 2})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace kvbench::bench

int main(int argc, char** argv) {
  kvbench::register_builtin_methods();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
