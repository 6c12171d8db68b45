// Put and get throughput of each reuse tier on one KV block of SmolLM2-135M's size
// (30 layers x K,V x 256 tokens x 3 kv heads x 64 x fp32 = 11.8 MB) of normal floats, which
// compress as little as real KV does, and of each codec alone (encode, decode). Bytes/s
// count the block's raw bytes; stored/raw is what the tier or codec keeps of them.
//
// Disk gets read from the page cache (the file was just written): they measure the codec
// and the copy, not the drive. Redis runs on loopback in a redis-server this binary starts;
// its cases are skipped when none can be started. Argument of the disk, Redis and codec
// cases: the codec (0 raw, 1 zstd, 2 cachegen).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "methods/builtin_methods.h"
#include "reuse/block_codec.h"
#include "reuse/disk_tier.h"
#include "reuse/kv_block.h"
#include "reuse/memory_tier.h"
#include "reuse/redis_tier.h"
#include "tests/redis_server.h"

namespace {

using kvbench::Bytes;
using kvbench::Codec;
using kvbench::SharedBytes;

constexpr kvbench::KvBlockShape kShape{30, 3, 64};
constexpr int64_t kTokens = 256;
const size_t kBlockBytes = static_cast<size_t>(kvbench::kv_block_bytes(kShape, kTokens));
constexpr int kKeys = 4;  // puts rotate over a few keys: rewrites, as a long run does

SharedBytes block() {
  static const SharedBytes bytes = [] {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.f, 1.f);
    const std::vector<int32_t> tokens(kTokens, 1);
    kvbench::KvBlockWriter writer(std::string(64, 'k'), std::string(64, 'm'), kShape,
                                  tokens.data(), kTokens, 0);
    for (int32_t l = 0; l < kShape.n_layers; ++l) {
      for (float* rows : {writer.k(l), writer.v(l)}) {
        for (int64_t i = 0; i < kTokens * kShape.kv_width(); ++i) rows[i] = normal(rng);
      }
    }
    return writer.finish();
  }();
  return bytes;
}

Codec codec_of(const benchmark::State& state) { return static_cast<Codec>(state.range(0)); }

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

void BM_DiskPut(benchmark::State& state) {
  kvbench::DiskTier tier(bench_dir(), codec_of(state));
  const SharedBytes value = block();
  int64_t i = 0, stored = 0;
  for (auto _ : state) stored = tier.put(key(i++), value).value_or(-1);
  if (stored < 0) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
  state.counters["stored/raw"] = static_cast<double>(stored) / kBlockBytes;
}

void BM_DiskGet(benchmark::State& state) {
  kvbench::DiskTier tier(bench_dir(), codec_of(state));
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
  kvbench::RedisTier tier("127.0.0.1:" + std::to_string(redis_port()), 2.0, 1.0,
                         codec_of(state));
  const SharedBytes value = block();
  int64_t i = 0, stored = 0;
  for (auto _ : state) stored = tier.put(key(i++), value).value_or(-1);
  if (stored < 0) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
  state.counters["stored/raw"] = static_cast<double>(stored) / kBlockBytes;
}

void BM_RedisGet(benchmark::State& state) {
  if (redis_port() == 0) {
    state.SkipWithError("no redis-server could be started");
    return;
  }
  kvbench::RedisTier tier("127.0.0.1:" + std::to_string(redis_port()), 2.0, 1.0,
                         codec_of(state));
  for (int k = 0; k < kKeys; ++k) tier.put(key(k), block());
  int64_t i = 0;
  bool ok = true;
  for (auto _ : state) ok = tier.get(key(i++)) != nullptr && ok;
  if (!ok) state.SkipWithError(tier.stats().last_fault.c_str());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

void BM_CodecEncode(benchmark::State& state) {
  const auto codec = kvbench::make_block_codec(codec_of(state));
  const SharedBytes value = block();
  SharedBytes encoded;
  for (auto _ : state) {
    if (!codec->encode(value, &encoded).empty()) state.SkipWithError("encode failed");
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
  state.counters["stored/raw"] = static_cast<double>(encoded->size()) / kBlockBytes;
}

void BM_CodecDecode(benchmark::State& state) {
  const auto codec = kvbench::make_block_codec(codec_of(state));
  SharedBytes encoded, decoded;
  codec->encode(block(), &encoded);
  for (auto _ : state) {
    if (!codec->decode(encoded, kBlockBytes, &decoded).empty()) {
      state.SkipWithError("decode failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBlockBytes));
}

// Few iterations: each disk or Redis call moves 11.8 MB. Real time, since Redis works in
// another process.
BENCHMARK(BM_MemoryPut)->Iterations(1000)->UseRealTime();
BENCHMARK(BM_MemoryGet)->Iterations(1000)->UseRealTime();
void per_codec(benchmark::internal::Benchmark* b) {
  b->ArgName("codec")->Arg(0)->Arg(1)->Arg(2)->Iterations(8)->UseRealTime()->Unit(
      benchmark::kMillisecond);
}
BENCHMARK(BM_CodecEncode)->Apply(per_codec);
BENCHMARK(BM_CodecDecode)->Apply(per_codec);
BENCHMARK(BM_DiskPut)->Apply(per_codec);
BENCHMARK(BM_DiskGet)->Apply(per_codec);
BENCHMARK(BM_RedisPut)->Apply(per_codec);
BENCHMARK(BM_RedisGet)->Apply(per_codec);

}  // namespace

int main(int argc, char** argv) {
  kvbench::register_builtin_methods();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
