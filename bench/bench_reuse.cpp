// Put and get throughput of each reuse tier on one encoded block of SmolLM2-135M's size
// (30 layers x K,V x 256 tokens x 3 kv heads x 64 x fp32 = 11.8 MB) of normal floats, which
// compress as little as real KV does. Bytes/s count the block's raw bytes.
//
// Disk gets read from the page cache (the file was just written): they measure zstd and the
// copy, not the drive. Redis runs on loopback in a redis-server this binary starts; its
// cases are skipped when none can be started.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reuse/disk_tier.h"
#include "reuse/memory_tier.h"
#include "reuse/redis_tier.h"

extern char** environ;

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

// A redis-server child on loopback for the whole run; port 0 when none could be started.
class RedisServer {
 public:
  RedisServer() {
    std::mt19937 rng(std::random_device{}());
    for (int attempt = 0; attempt < 10 && port_ == 0; ++attempt) {
      start(20000 + static_cast<int>(rng() % 40000));
    }
  }
  ~RedisServer() { stop(); }
  int port() const { return port_; }

 private:
  void start(int port) {
    const char* binary = "/usr/bin/redis-server";
    if (access(binary, X_OK) != 0) return;
    const std::string port_text = std::to_string(port);
    const char* argv[] = {
        binary,         "--port", port_text.c_str(), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no",     "--daemonize",     "no",     "--dir",     "/tmp",   nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&pid_, binary, &actions, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return;
    const std::string own = "process_id:" + std::to_string(pid_);
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) break;  // the port was taken
      redisContext* ctx = redisConnectWithTimeout("127.0.0.1", port, timeval{0, 200000});
      auto* reply =
          ctx && !ctx->err ? static_cast<redisReply*>(redisCommand(ctx, "INFO server")) : nullptr;
      const bool ours = reply && reply->type == REDIS_REPLY_STRING &&
                        std::string(reply->str, reply->len).find(own) != std::string::npos;
      if (reply) freeReplyObject(reply);
      if (ctx) redisFree(ctx);
      if (ours) {
        port_ = port;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop();
  }
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  pid_t pid_ = -1;
  int port_ = 0;
};

int redis_port() {
  static RedisServer server;
  return server.port();
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
