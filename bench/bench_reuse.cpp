// Put and get throughput of each reuse tier on one encoded block of SmolLM2-135M's size
// (30 layers x K,V x 256 tokens x 3 kv heads x 64 x fp32 = 11.8 MB) of normal floats, which
// compress as little as real KV does. Bytes/s count the block's raw bytes.
//
// Disk gets read from the page cache (the file was just written): they measure zstd and the
// copy, not the drive. Redis runs on loopback in a redis-server this binary starts; its
// cases are skipped when none can be started.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "reuse/disk_tier.h"
#include "reuse/memory_tier.h"
#include "reuse/redis_tier.h"
#include "tests/redis_server.h"

namespace {

using kvbench::Bytes;
using kvbench::SharedBytes;

constexpr size_t kBlockBytes = size_t{30} * 2 * 256 * 3 * 64 * sizeof(float);
constexpr int kKeys = 4;  // puts rotate over a few keys: rewrites, as a long run does

SharedBytes block() {
  static const SharedBytes bytes = [] {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> floats(kBlockBytes / sizeof(float));
    for (float& x : floats) x = normal(rng);
    auto out = std::make_shared<Bytes>(kBlockBytes);
    std::memcpy(out->data(), floats.data(), kBlockBytes);
    return out;
  }();
  return bytes;
}

std::string key(int64_t i) { return "block-" + std::to_string(i % kKeys); }

std::string bench_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/kvbench-bench-reuse";
}

// A redis-server child on loopback for the whole run, started by the first Redis case; port
// 0 when none could be started (not installed).
int redis_port() {
  static kvbench::testing::RedisServer server;
  static const bool started = server.start(10);
  return started ? server.port() : 0;
}

void BM_MemoryPut(benchmark::State& state) {
  kvbench::MemoryTier tier("cpu");
  const SharedBytes value = block();
  int64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(tier.put(key(i++), value));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

void BM_MemoryGet(benchmark::State& state) {
  kvbench::MemoryTier tier("cpu");
  for (int k = 0; k < kKeys; ++k) tier.put(key(k), block());
  int64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(tier.get(key(i++)));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

// Argument: zstd level.
void BM_DiskPut(benchmark::State& state) {
  kvbench::DiskTier tier(bench_dir(), static_cast<int>(state.range(0)));
  const SharedBytes value = block();
  int64_t i = 0, stored = 0;
  for (auto _ : state) stored = tier.put(key(i++), value).value_or(-1);
  if (stored < 0) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
  state.counters["stored/raw"] = static_cast<double>(stored) / kBlockBytes;
}

void BM_DiskGet(benchmark::State& state) {
  kvbench::DiskTier tier(bench_dir(), static_cast<int>(state.range(0)));
  for (int k = 0; k < kKeys; ++k) tier.put(key(k), block());
  int64_t i = 0;
  bool ok = true;
  for (auto _ : state) ok = tier.get(key(i++)) != nullptr && ok;
  if (!ok) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

void BM_RedisPut(benchmark::State& state) {
  if (redis_port() == 0) {
    state.SkipWithError("no redis-server could be started");
    return;
  }
  kvbench::RedisTier tier("127.0.0.1:" + std::to_string(redis_port()));
  const SharedBytes value = block();
  int64_t i = 0;
  bool ok = true;
  for (auto _ : state) ok = tier.put(key(i++), value).has_value() && ok;
  if (!ok) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

void BM_RedisGet(benchmark::State& state) {
  if (redis_port() == 0) {
    state.SkipWithError("no redis-server could be started");
    return;
  }
  kvbench::RedisTier tier("127.0.0.1:" + std::to_string(redis_port()));
  for (int k = 0; k < kKeys; ++k) tier.put(key(k), block());
  int64_t i = 0;
  bool ok = true;
  for (auto _ : state) ok = tier.get(key(i++)) != nullptr && ok;
  if (!ok) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

// Few iterations: each disk or Redis call moves 11.8 MB. Real time, since Redis works in
// another process.
BENCHMARK(BM_MemoryPut)->Iterations(1000)->UseRealTime();
BENCHMARK(BM_MemoryGet)->Iterations(1000)->UseRealTime();
BENCHMARK(BM_DiskPut)->Arg(1)->Arg(3)->Iterations(8)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiskGet)->Arg(1)->Iterations(8)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RedisPut)->Iterations(8)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RedisGet)->Iterations(8)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
