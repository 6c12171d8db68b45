// The CUDA kernels (kernels/cuda) in SmolLM2-135M's shape and a Llama-8B-like layer, timed with
// CUDA events on the default stream (UseManualTime). Each case reports GB/s of the bytes the
// kernel must move and of_peak = GB/s / the device's peak memory bandwidth (GFLOP/s too where
// compute matters); BM_CudaCopy is the practical ceiling. Each case rotates over enough copies of
// its inputs that the launches between two reads of one copy touch >= 512 MiB, ten times the
// H100's 50 MB L2, as a decode step streaming every layer's KV does (bench_kernels' kColdBytes).
// Without a CUDA device it prints one line and runs nothing.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kivi_attention.h"  // kivi_block_bytes
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/kivi_attention.h"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/quest.h"
#include "kernels/cuda/scores.h"
#include "kernels/layouts.h"

namespace {

using kvbench::AttentionPairs;
using kvbench::AttentionQuery;
using kvbench::cuda_check;
using kvbench::DenseKv;
using kvbench::DeviceBuffer;
using kvbench::SparsePattern;

constexpr int64_t kColdBytes = 512LL << 20;
constexpr int32_t kPageTokens = 16;  // Quest's page
constexpr int32_t kKiviGroup = 32;
constexpr int64_t kLongContext = 32768;

struct Shape {
  int32_t heads, kv_heads, head_dim;
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};
constexpr Shape kSmolLM2{9, 3, 64};     // SmolLM2-135M
constexpr Shape kLlama8B{32, 8, 128};  // one Llama-3-8B layer

// Copies of an input such that the launches between two reads of one copy, each touching
// bytes_per_launch, add up to kColdBytes.
int64_t copies_for(int64_t bytes_per_launch) {
  return std::max<int64_t>(1, (kColdBytes + bytes_per_launch - 1) / bytes_per_launch);
}

// ---- Inputs -------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), a hash of (seed, index): fast enough for GiB-sized inputs, and fixed.
std::vector<float> random_floats(int64_t n, uint64_t seed) {
  std::vector<float> v(n);
  const uint64_t base = splitmix64(seed);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(splitmix64(base + i) >> 40) * 0x1p-23f - 1.0f;
  }
  return v;
}

std::vector<uint8_t> random_bytes(int64_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  const uint64_t base = splitmix64(seed);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(splitmix64(base + i) >> 56);
  return v;
}

// Each of `rows` rows holds first, first + 1, ...: slots' original positions, or identity orders.
std::vector<int32_t> counting_rows(int64_t rows, int64_t n, int64_t first = 0) {
  std::vector<int32_t> v(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    std::iota(v.begin() + r * n, v.begin() + (r + 1) * n, static_cast<int32_t>(first));
  }
  return v;
}

// `copies` back-to-back copies of `one` on the device: uploaded once, then doubled on the device
// (the rotation reads distinct memory; the values do not change a kernel's speed).
template <class T>
DeviceBuffer<T> replicated(const std::vector<T>& one, int64_t copies) {
  const int64_t n = static_cast<int64_t>(one.size());
  DeviceBuffer<T> out(n * copies);
  out.upload(one.data(), n);
  for (int64_t done = 1; done < copies;) {
    const int64_t more = std::min(done, copies - done);
    cuda_check(cudaMemcpy(out.data() + done * n, out.data(), more * n * sizeof(T),
                          cudaMemcpyDeviceToDevice),
               "bench_cuda_kernels", "replicating an input");
    done += more;
  }
  return out;
}

// K, V and positions of one layer ([kv_heads, n_tokens, head_dim]), `copies` times.
struct DeviceKv {
  Shape shape;
  int64_t n_tokens, copies;
  DeviceBuffer<float> k, v;
  DeviceBuffer<int32_t> positions;

  DeviceKv(Shape s, int64_t tokens, int64_t n_copies, uint64_t seed)
      : shape(s),
        n_tokens(tokens),
        copies(n_copies),
        k(replicated(random_floats(elements(), 2 * seed), copies)),
        v(replicated(random_floats(elements(), 2 * seed + 1), copies)),
        positions(replicated(counting_rows(s.kv_heads, tokens), copies)) {}

  int64_t elements() const { return int64_t{shape.kv_heads} * n_tokens * shape.head_dim; }
  DenseKv copy(int64_t c) const {
    return DenseKv{k.data() + c * elements(),
                   v.data() + c * elements(),
                   positions.data() + c * shape.kv_heads * n_tokens,
                   shape.kv_heads,
                   shape.head_dim,
                   n_tokens,
                   n_tokens};
  }
};

int64_t key_bytes(Shape s, int64_t n_tokens) { return int64_t{s.kv_heads} * n_tokens * s.head_dim * 4; }
int64_t position_bytes(Shape s, int64_t n_tokens) { return int64_t{s.kv_heads} * n_tokens * 4; }
// What attention over n_tokens dense slots reads: K, V and positions.
int64_t dense_kv_bytes(Shape s, int64_t n_tokens) {
  return 2 * key_bytes(s, n_tokens) + position_bytes(s, n_tokens);
}

// n_queries rows at positions first_position, first_position + 1, ... against stored slots at
// positions 0 .. n_tokens - 1 (a decode query: first_position = n_tokens).
struct DeviceQueries {
  Shape shape;
  int32_t n_queries;
  DeviceBuffer<float> q, out;
  DeviceBuffer<int32_t> positions;
  double visible_pairs = 0;  // (query, slot) pairs causality lets through, per head

  DeviceQueries(Shape s, int64_t n_tokens, int32_t n, int64_t first_position)
      : shape(s),
        n_queries(n),
        q(random_floats(int64_t{n} * s.heads * s.head_dim, 99).data(),
          int64_t{n} * s.heads * s.head_dim),
        out(int64_t{n} * s.heads * s.head_dim),
        positions(counting_rows(1, n, first_position).data(), n) {
    for (int64_t i = 0; i < n; ++i) {
      visible_pairs += static_cast<double>(std::min(first_position + i + 1, n_tokens));
    }
  }
  AttentionQuery query() const {
    return AttentionQuery{q.data(), positions.data(), out.data(), n_queries, shape.heads,
                          shape.scale()};
  }
  // Q read, the output written, the positions read.
  int64_t bytes() const { return 2 * q.bytes() + positions.bytes(); }
};

// ---- Timing and the device's peak ---------------------------------------------------------

class CudaEvent {
 public:
  CudaEvent() { cuda_check(cudaEventCreate(&event_), "bench_cuda_kernels", "cudaEventCreate"); }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Seconds between two events recorded on the default stream around `work`, after it finished.
template <class Work>
double event_seconds(const CudaEvent& start, const CudaEvent& stop, Work&& work) {
  cuda_check(cudaEventRecord(start.get(), nullptr), "bench_cuda_kernels", "cudaEventRecord");
  work();
  cuda_check(cudaEventRecord(stop.get(), nullptr), "bench_cuda_kernels", "cudaEventRecord");
  cuda_check(cudaEventSynchronize(stop.get()), "bench_cuda_kernels", "cudaEventSynchronize");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "bench_cuda_kernels",
             "cudaEventElapsedTime");
  return ms / 1e3;
}

// One device-to-device copy of `bytes` on the default stream.
void copy_device(void* dst, const void* src, int64_t bytes) {
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr),
             "bench_cuda_kernels", "device-to-device copy");
}

constexpr int64_t kCopyBytes = 1LL << 30;

struct DevicePeak {
  std::string name;
  double gb_per_s = 0;
  bool measured = false;  // from a device-to-device copy, the memory clock attribute missing
  std::string how;
};

// Read + write GB/s of the best of five 1 GiB device-to-device copies.
double measured_copy_gb_per_s() {
  DeviceBuffer<uint8_t> src(kCopyBytes), dst(kCopyBytes);
  CudaEvent start, stop;
  copy_device(dst.data(), src.data(), kCopyBytes);  // warm-up
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    best = std::min(best, event_seconds(start, stop, [&] {
                      copy_device(dst.data(), src.data(), kCopyBytes);
                    }));
  }
  return 2.0 * kCopyBytes / best / 1e9;
}

// DDR: two transfers per memory clock over the whole bus. CUDA 13 dropped
// cudaDeviceProp::memoryClockRate, so the attributes; a device without them gets a measured copy.
DevicePeak find_device_peak() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "bench_cuda_kernels", "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "bench_cuda_kernels",
             "cudaGetDeviceProperties");
  DevicePeak peak;
  peak.name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
              std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) +
              " SMs, " + std::to_string(prop.l2CacheSize >> 20) + " MiB L2, " +
              std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
  int clock_khz = 0, bus_bits = 0;
  const bool have_clock =
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess;
  const bool have_bus =
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess;
  cudaGetLastError();  // an unsupported attribute must not fail a later check
  if (have_clock && have_bus && clock_khz > 0 && bus_bits > 0) {
    peak.gb_per_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    peak.how = "2 x " + std::to_string(clock_khz / 1000) + " MHz memory clock x " +
               std::to_string(bus_bits) + "-bit bus";
  } else {
    peak.gb_per_s = measured_copy_gb_per_s();
    peak.measured = true;
    peak.how = "measured: best 1 GiB device-to-device copy (memory clock/bus attribute unsupported)";
  }
  return peak;
}

const DevicePeak& device_peak() {
  static const DevicePeak peak = find_device_peak();
  return peak;
}

// Times launch(r) with CUDA events, one launch per iteration, r = 1, 2, ... modulo `rotation`
// (which copy of the inputs it reads; launch 0 is the untimed warm-up that also loads the
// kernel). Returns the summed seconds, 0 when the warm-up failed (the case is skipped).
template <class Launch>
double time_launches(benchmark::State& state, int64_t rotation, Launch&& launch) {
  try {
    launch(0);
    cuda_check(cudaDeviceSynchronize(), "bench_cuda_kernels", "warm-up launch");
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return 0;
  }
  CudaEvent start, stop;
  double seconds = 0;
  int64_t r = 1 % rotation;
  for (auto _ : state) {
    const double s = event_seconds(start, stop, [&] { launch(r); });
    state.SetIterationTime(s);
    seconds += s;
    r = (r + 1) % rotation;
  }
  return seconds;
}

// GB/s of `bytes` per launch and its share of the peak, GFLOP/s of `flops` per launch when
// given, MB per launch (to check the accounting), over the event-timed seconds.
void report(benchmark::State& state, double seconds, double bytes, double flops = 0) {
  if (seconds <= 0) return;
  const double launches = static_cast<double>(state.iterations());
  const double gb_per_s = bytes * launches / seconds / 1e9;
  state.counters["GB/s"] = gb_per_s;
  state.counters["of_peak"] = gb_per_s / device_peak().gb_per_s;
  state.counters["MB"] = bytes / 1e6;
  if (flops > 0) state.counters["GFLOP/s"] = flops * launches / seconds / 1e9;
  state.SetLabel(device_peak().measured ? "peak: measured copy" : "peak: clock x bus");
}

// ---- The ceiling --------------------------------------------------------------------------

// A 1 GiB device-to-device copy: bytes read + written, what a streaming kernel can hope for.
void BM_CudaCopy(benchmark::State& state) {
  DeviceBuffer<uint8_t> src(replicated(random_bytes(kCopyBytes / 16, 1), 16)), dst(kCopyBytes);
  const double seconds = time_launches(state, 1, [&](int64_t) {
    copy_device(dst.data(), src.data(), kCopyBytes);
  });
  report(state, seconds, 2.0 * kCopyBytes);
}
BENCHMARK(BM_CudaCopy)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- Dense attention ----------------------------------------------------------------------

// One decode query over range(0) dense slots: bandwidth-bound on K, V and positions (the issue's
// goal: >= 70% of peak at 32K).
void BM_CudaAttentionDecode(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const int64_t bytes = dense_kv_bytes(shape, n_tokens);
  const DeviceKv kv(shape, n_tokens, copies_for(bytes), 1);
  const DeviceQueries queries(shape, n_tokens, 1, n_tokens);
  const AttentionQuery query = queries.query();
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    kvbench::attention_dense_cuda(query, kv.copy(c), nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
void decode_contexts(benchmark::internal::Benchmark* b) {
  b->ArgName("tokens");
  for (int64_t n : {1024, 4096, 16384, 32768, 131072}) b->Arg(n);
}
BENCHMARK_CAPTURE(BM_CudaAttentionDecode, smollm2_135m, kSmolLM2)
    ->Apply(decode_contexts)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaAttentionDecode, llama8b, kLlama8B)
    ->Apply(decode_contexts)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// One decode query over KV heads of their own (a ragged layer after AdaKV-style head budgets):
// head h holds range(0) * (h + 1) / kv_heads slots, about half the dense slots in all, so the
// longest head is as long as BM_CudaAttentionDecode's at the same range(0). GB/s counts the
// slots the heads hold and the head table.
void BM_CudaAttentionRagged(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const DeviceKv kv(shape, n_tokens, copies_for(dense_kv_bytes(shape, n_tokens)), 1);
  const DeviceQueries queries(shape, n_tokens, 1, n_tokens);
  const AttentionQuery query = queries.query();
  std::vector<DenseKv> tables;  // [copies, kv_heads]: one-head views into each copy
  int64_t held = 0;
  for (int64_t c = 0; c < kv.copies; ++c) {
    const DenseKv all = kv.copy(c);
    for (int32_t h = 0; h < shape.kv_heads; ++h) {
      const int64_t at = int64_t{h} * n_tokens;
      const int64_t count = n_tokens * (h + 1) / shape.kv_heads;
      tables.push_back(DenseKv{all.k + at * shape.head_dim, all.v + at * shape.head_dim,
                               all.positions + at, 1, shape.head_dim, n_tokens, count});
      if (c == 0) held += count;
    }
  }
  const DeviceBuffer<DenseKv> table(tables.data(), static_cast<int64_t>(tables.size()));
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    kvbench::attention_ragged_cuda(query, table.data() + c * shape.kv_heads, shape.kv_heads,
                                   shape.head_dim, n_tokens, nullptr);
  });
  const int64_t bytes = held * (2 * shape.head_dim * 4 + 4) +
                        int64_t{shape.kv_heads} * static_cast<int64_t>(sizeof(DenseKv));
  report(state, seconds, static_cast<double>(bytes));
}
void ragged_contexts(benchmark::internal::Benchmark* b) {
  b->ArgName("tokens");
  for (int64_t n : {4096, 32768}) b->Arg(n);
}
BENCHMARK_CAPTURE(BM_CudaAttentionRagged, smollm2_135m, kSmolLM2)
    ->Apply(ragged_contexts)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaAttentionRagged, llama8b, kLlama8B)
    ->Apply(ragged_contexts)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// A 512-query causal chunk at the end of range(0) slots (a prefill chunk): compute-bound.
// GFLOP/s counts Q K^T and P V, 2 flops per multiply-add, head_dim each per visible pair and
// head; GB/s counts K, V and positions once, plus Q and the output.
void BM_CudaAttentionPrefill(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const int32_t n_queries = 512;
  const int64_t kv_bytes = dense_kv_bytes(shape, n_tokens);
  const DeviceKv kv(shape, n_tokens, copies_for(kv_bytes), 2);
  const DeviceQueries queries(shape, n_tokens, n_queries, n_tokens - n_queries);
  const AttentionQuery query = queries.query();
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    kvbench::attention_dense_cuda(query, kv.copy(c), nullptr);
  });
  const double flops = queries.visible_pairs * shape.heads * 4.0 * shape.head_dim;
  report(state, seconds, static_cast<double>(kv_bytes + queries.bytes()), flops);
}
BENCHMARK_CAPTURE(BM_CudaAttentionPrefill, smollm2_135m, kSmolLM2)
    ->ArgName("tokens")
    ->Arg(4096)
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaAttentionPrefill, llama8b, kLlama8B)
    ->ArgName("tokens")
    ->Arg(4096)
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The same 512-query chunk through a sparse prefill's pattern, range(1) = 1: A-shape with
// kvbench's defaults (sink 16, local 112: 128 keys per query), or range(1) = 0 the dense
// kernel over the same chunk, to compare at one size. Times the whole call: the sparse one
// copies the positions down and counts its pairs on the host (a wait on the stream), as every
// prefill chunk does in kvbench. GFLOP/s counts the pairs computed (the pattern's); GB/s the
// K, V and positions of the keys read at least once (the sink, the chunk's window), Q and the
// output.
void BM_CudaAttentionSparse(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const bool a_shape = state.range(1) != 0;
  const int32_t n_queries = 512, sink = 16, local = 112;
  const int64_t kv_bytes = dense_kv_bytes(shape, n_tokens);
  const DeviceKv kv(shape, n_tokens, copies_for(kv_bytes), 2);
  const DeviceQueries queries(shape, n_tokens, n_queries, n_tokens - n_queries);
  const AttentionQuery query = queries.query();
  const SparsePattern pattern{sink, local, std::numeric_limits<int32_t>::max(), nullptr, 0,
                              nullptr, 0};
  AttentionPairs pairs;
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    if (a_shape) {
      pairs = kvbench::attention_sparse_cuda(query, kv.copy(c), pattern, nullptr);
    } else {
      kvbench::attention_dense_cuda(query, kv.copy(c), nullptr);
    }
  });
  const double computed = a_shape ? static_cast<double>(pairs.computed)
                                  : queries.visible_pairs * shape.heads;
  const int64_t keys_read = a_shape ? std::min<int64_t>(n_tokens, sink + n_queries + local)
                                    : n_tokens;
  const double bytes = static_cast<double>(kv_bytes) * keys_read / n_tokens + queries.bytes();
  report(state, seconds, bytes, computed * 4.0 * shape.head_dim);
  state.counters["pairs_share"] = computed / (queries.visible_pairs * shape.heads);
}
BENCHMARK_CAPTURE(BM_CudaAttentionSparse, smollm2_135m, kSmolLM2)
    ->ArgNames({"tokens", "a_shape"})
    ->ArgsProduct({{2048, 8192}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaAttentionSparse, llama8b, kLlama8B)
    ->ArgNames({"tokens", "a_shape"})
    ->ArgsProduct({{2048, 8192}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Quest --------------------------------------------------------------------------------

constexpr int32_t kSelectionsPerCopy = 8;  // Quest keeps 1/8 of the pages

// kSelectionsPerCopy disjoint page selections ([kv_heads, n_pages / 8] each, ascending rows):
// selection s takes one page of every run of 8, a random one per (head, run), so together they
// cover every page once and each reads scattered pages, as Quest's top pages are.
std::vector<int32_t> disjoint_page_selections(int32_t kv_heads, int64_t n_pages, uint32_t seed) {
  const int64_t n_selected = n_pages / kSelectionsPerCopy;
  std::vector<int32_t> pages(int64_t{kSelectionsPerCopy} * kv_heads * n_selected);
  std::mt19937 rng(seed);
  std::vector<int32_t> order(kSelectionsPerCopy);
  for (int32_t h = 0; h < kv_heads; ++h) {
    for (int64_t run = 0; run < n_selected; ++run) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int32_t s = 0; s < kSelectionsPerCopy; ++s) {
        pages[(int64_t{s} * kv_heads + h) * n_selected + run] =
            static_cast<int32_t>(run * kSelectionsPerCopy + order[s]);
      }
    }
  }
  return pages;
}

// Quest's gathered attention: one decode query over 1/8 of range(0) slots' pages of 16.
// GB/s counts the selected pages' K, V and positions and the page list. The launches rotate over
// the 8 disjoint selections of each copy, so a page is read again only after every copy's
// every page (>= 512 MiB).
void BM_CudaAttentionPages(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const int64_t n_pages = n_tokens / kPageTokens;
  const int32_t n_selected = static_cast<int32_t>(n_pages / kSelectionsPerCopy);
  const DeviceKv kv(shape, n_tokens, copies_for(dense_kv_bytes(shape, n_tokens)), 3);
  const std::vector<int32_t> host_pages = disjoint_page_selections(shape.kv_heads, n_pages, 4);
  const DeviceBuffer<int32_t> pages(host_pages.data(), static_cast<int64_t>(host_pages.size()));
  const DeviceQueries queries(shape, n_tokens, 1, n_tokens);
  const AttentionQuery query = queries.query();
  const double seconds = time_launches(state, kv.copies * kSelectionsPerCopy, [&](int64_t r) {
    const int64_t selection = r / kv.copies;
    const kvbench::PageSelection chosen{
        pages.data() + selection * shape.kv_heads * n_selected, n_selected, kPageTokens};
    kvbench::attention_pages_cuda(query, kv.copy(r % kv.copies), chosen, nullptr);
  });
  const int64_t selected_slots = int64_t{n_selected} * kPageTokens;
  const int64_t bytes = dense_kv_bytes(shape, selected_slots) + int64_t{shape.kv_heads} * n_selected * 4;
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaAttentionPages, smollm2_135m, kSmolLM2)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->Arg(131072)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaAttentionPages, llama8b, kLlama8B)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->Arg(131072)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The key bounds of the pages new keys fall in (page_bounds_append_cuda): range(0) new keys
// ([n_new, kv_heads, head_dim]) ending a page. 32768 is a prompt's bounds built at once; 1 is a
// decode step's key folded into its page's existing bounds (launch-bound: its GB/s says how
// far a lone token is from streaming). GB/s counts the keys read, the touched pages' bounds
// written, and read back when the first page already held keys.
void BM_CudaPageBounds(benchmark::State& state, Shape shape) {
  const int64_t n_new = state.range(0);
  const int64_t first_slot = (kPageTokens - n_new % kPageTokens) % kPageTokens;
  const int64_t n_pages = (first_slot + n_new + kPageTokens - 1) / kPageTokens;
  const int64_t bounds_elements = int64_t{shape.kv_heads} * n_pages * shape.head_dim;
  const int64_t page_bound_bytes = 2LL * shape.kv_heads * shape.head_dim * 4;  // one page's
  const int64_t bytes = key_bytes(shape, n_new) + n_pages * page_bound_bytes +
                        (first_slot % kPageTokens != 0 ? page_bound_bytes : 0);
  const int64_t copies = copies_for(bytes);
  const int64_t key_elements = int64_t{shape.kv_heads} * n_new * shape.head_dim;
  const DeviceBuffer<float> keys(replicated(random_floats(key_elements, 5), copies));
  // Random bounds stand for what the pages held: a page that already has keys is read back.
  DeviceBuffer<float> k_min(replicated(random_floats(bounds_elements, 6), copies));
  DeviceBuffer<float> k_max(replicated(random_floats(bounds_elements, 7), copies));
  const double seconds = time_launches(state, copies, [&](int64_t c) {
    kvbench::PageBounds bounds{k_min.data() + c * bounds_elements,
                               k_max.data() + c * bounds_elements,
                               shape.kv_heads,
                               shape.head_dim,
                               kPageTokens,
                               n_pages,
                               first_slot / kPageTokens + (first_slot % kPageTokens != 0)};
    kvbench::page_bounds_append_cuda(bounds, keys.data() + c * key_elements, first_slot, n_new,
                                     nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaPageBounds, smollm2_135m, kSmolLM2)
    ->ArgName("new")
    ->Arg(1)
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaPageBounds, llama8b, kLlama8B)
    ->ArgName("new")
    ->Arg(1)
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Quest's page scores for one decode query over range(0) slots' pages: GB/s of every page's
// bounds read and its score written.
void BM_CudaPageScores(benchmark::State& state, Shape shape) {
  const int64_t n_pages = state.range(0) / kPageTokens;
  const int64_t bounds_elements = int64_t{shape.kv_heads} * n_pages * shape.head_dim;
  const int64_t score_elements = int64_t{shape.kv_heads} * n_pages;
  const int64_t bytes = (2 * bounds_elements + score_elements) * 4;
  const int64_t copies = copies_for(bytes);
  const DeviceBuffer<float> k_min(replicated(random_floats(bounds_elements, 8), copies));
  const DeviceBuffer<float> k_max(replicated(random_floats(bounds_elements, 9), copies));
  DeviceBuffer<float> scores(score_elements * copies);
  const DeviceQueries queries(shape, state.range(0), 1, state.range(0));
  const AttentionQuery query = queries.query();
  const double seconds = time_launches(state, copies, [&](int64_t c) {
    const kvbench::PageBounds bounds{k_min.data() + c * bounds_elements,
                                     k_max.data() + c * bounds_elements,
                                     shape.kv_heads,
                                     shape.head_dim,
                                     kPageTokens,
                                     n_pages,
                                     n_pages};
    kvbench::page_scores_cuda(query, 0, bounds, scores.data() + c * score_elements, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaPageScores, smollm2_135m, kSmolLM2)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->Arg(131072)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaPageScores, llama8b, kLlama8B)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->Arg(131072)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- KIVI ---------------------------------------------------------------------------------

// One layer of KIVI storage (kernels/layouts.h, KiviKv), `copies` times: n_blocks blocks of 32
// slots at `bits`, random codes, every scale 2 / (2^bits - 1) and minimum -1 (codes span
// [-1, 1]), then an fp32 tail of n_tail random slots.
struct DeviceKivi {
  Shape shape;
  int64_t n_blocks, n_tail, copies;
  int32_t bits;
  DeviceBuffer<uint8_t> k_codes, v_codes;
  DeviceBuffer<float> k_scale, k_min, v_scale, v_min, tail_k, tail_v;
  DeviceBuffer<int32_t> positions, tail_positions;

  DeviceKivi(Shape s, int64_t blocks, int64_t tail, int32_t b, int64_t n_copies)
      : shape(s), n_blocks(blocks), n_tail(tail), copies(n_copies), bits(b) {
    const float step = 2.0f / static_cast<float>((1 << bits) - 1);
    k_codes = replicated(random_bytes(code_bytes(), 10), copies);
    v_codes = replicated(random_bytes(code_bytes(), 11), copies);
    k_scale = replicated(std::vector<float>(param_elements(), step), copies);
    k_min = replicated(std::vector<float>(param_elements(), -1.0f), copies);
    v_scale = replicated(std::vector<float>(param_elements(), step), copies);
    v_min = replicated(std::vector<float>(param_elements(), -1.0f), copies);
    // [n_blocks, kv_heads, 32]: block b's slot t is position b * 32 + t in every head.
    std::vector<int32_t> block_positions(n_blocks * s.kv_heads * kKiviGroup);
    for (int64_t i = 0; i < static_cast<int64_t>(block_positions.size()); ++i) {
      block_positions[i] = static_cast<int32_t>(i / (s.kv_heads * kKiviGroup) * kKiviGroup +
                                                i % kKiviGroup);
    }
    positions = replicated(block_positions, copies);
    tail_k = replicated(random_floats(tail_elements(), 12), copies);
    tail_v = replicated(random_floats(tail_elements(), 13), copies);
    tail_positions = replicated(counting_rows(s.kv_heads, n_tail, n_blocks * kKiviGroup), copies);
  }

  int64_t block_heads() const { return n_blocks * shape.kv_heads; }
  int64_t code_bytes() const { return block_heads() * kKiviGroup * shape.head_dim * bits / 8; }
  // Scales or minimums of keys (per channel) or values (per token and 32 channels): the same count.
  int64_t param_elements() const { return block_heads() * shape.head_dim; }
  int64_t tail_elements() const { return int64_t{shape.kv_heads} * n_tail * shape.head_dim; }

  kvbench::KiviKv copy(int64_t c) const {
    const DenseKv tail{tail_k.data() + c * tail_elements(),
                       tail_v.data() + c * tail_elements(),
                       tail_positions.data() + c * shape.kv_heads * n_tail,
                       shape.kv_heads,
                       shape.head_dim,
                       n_tail,
                       n_tail};
    return kvbench::KiviKv{k_codes.data() + c * code_bytes(),
                           k_scale.data() + c * param_elements(),
                           k_min.data() + c * param_elements(),
                           v_codes.data() + c * code_bytes(),
                           v_scale.data() + c * param_elements(),
                           v_min.data() + c * param_elements(),
                           positions.data() + c * block_heads() * kKiviGroup,
                           n_blocks,
                           kKiviGroup,
                           bits,
                           tail};
  }
};

// What a decode over KIVI storage reads: the blocks' codes, scales, minimums and positions,
// and the tail's K, V and positions (bench_kernels' BM_KiviDecode accounting).
int64_t kivi_decode_bytes(Shape s, int64_t n_blocks, int64_t n_tail, int32_t bits) {
  const int64_t per_block_head =
      kvbench::kivi_block_bytes(s.head_dim, kKiviGroup, bits) + kKiviGroup * 4;
  return s.kv_heads * n_blocks * per_block_head + dense_kv_bytes(s, n_tail);
}

// One decode query over 32K slots of KIVI storage at range(0) bits (128 in the fp32 tail).
void BM_CudaKiviDecode(benchmark::State& state, Shape shape) {
  const int32_t bits = static_cast<int32_t>(state.range(0));
  const int64_t n_tail = 128, n_blocks = (kLongContext - n_tail) / kKiviGroup;
  const int64_t bytes = kivi_decode_bytes(shape, n_blocks, n_tail, bits);
  const DeviceKivi kivi(shape, n_blocks, n_tail, bits, copies_for(bytes));
  const DeviceQueries queries(shape, kLongContext, 1, kLongContext);
  const AttentionQuery query = queries.query();
  const double seconds = time_launches(state, kivi.copies, [&](int64_t c) {
    kvbench::attention_kivi_cuda(query, kivi.copy(c), nullptr, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaKiviDecode, smollm2_135m, kSmolLM2)
    ->ArgName("bits")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaKiviDecode, llama8b, kLlama8B)
    ->ArgName("bits")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// KIVI's key quantization of 32K tokens at range(0) bits, in one launch: a group is one
// channel over a block of 32 tokens. The keys are laid out token-in-block major ([32, blocks,
// kv_heads, head_dim]) so element i of group g sits at g + i * n_groups: neighbouring threads
// read neighbouring channels, the access pattern of KIVI's per-block call (element stride =
// channels), over every block at once. GB/s of the keys read and the codes, scales and
// minimums written.
void BM_CudaQuantize(benchmark::State& state, Shape shape) {
  const int32_t bits = static_cast<int32_t>(state.range(0));
  const int64_t n_groups = kLongContext / kKiviGroup * shape.kv_heads * shape.head_dim;
  const int64_t key_elements = n_groups * kKiviGroup;
  const int64_t group_bytes = kKiviGroup * bits / 8;
  const int64_t bytes = key_elements * 4 + n_groups * (group_bytes + 2 * 4);
  const int64_t copies = copies_for(bytes);
  const DeviceBuffer<float> keys(replicated(random_floats(key_elements, 14), copies));
  DeviceBuffer<uint8_t> codes(n_groups * group_bytes * copies);
  DeviceBuffer<float> scale(n_groups * copies), min(n_groups * copies);
  const double seconds = time_launches(state, copies, [&](int64_t c) {
    const kvbench::QuantGroups groups{codes.data() + c * n_groups * group_bytes,
                                      scale.data() + c * n_groups,
                                      min.data() + c * n_groups,
                                      n_groups,
                                      kKiviGroup,
                                      bits};
    kvbench::quantize_groups_cuda(keys.data() + c * key_elements, 1, n_groups, groups, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaQuantize, smollm2_135m, kSmolLM2)
    ->ArgName("bits")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaQuantize, llama8b, kLlama8B)
    ->ArgName("bits")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- Eviction scores and plans ------------------------------------------------------------

// Softmax attention each of range(0) stored slots receives from the last range(1) queries
// (causal): 32 over 32K is SnapKV's observation window, 512 over 4K an H2O-like prefill. GFLOP/s
// counts Q K^T once (2 head_dim flops per visible pair and head, as bench_kernels; the kernel
// computes it twice, once per pass); GB/s counts K and positions once, the scores read and
// written (it adds into them), Q.
void BM_CudaAttentionScores(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const int32_t n_queries = static_cast<int32_t>(state.range(1));
  const int64_t score_elements = int64_t{shape.heads} * n_tokens;
  const int64_t bytes = key_bytes(shape, n_tokens) + position_bytes(shape, n_tokens) +
                        2 * score_elements * 4 + int64_t{n_queries} * shape.heads * shape.head_dim * 4;
  const DeviceKv kv(shape, n_tokens, copies_for(bytes), 15);
  DeviceBuffer<float> scores(score_elements * kv.copies);
  cuda_check(cudaMemset(scores.data(), 0, scores.bytes()), "bench_cuda_kernels", "cudaMemset");
  const DeviceQueries queries(shape, n_tokens, n_queries, n_tokens - n_queries);
  const AttentionQuery query = queries.query();
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    kvbench::attention_scores_cuda(query, kv.copy(c), scores.data() + c * score_elements,
                                   nullptr);
  });
  const double flops = queries.visible_pairs * shape.heads * 2.0 * shape.head_dim;
  report(state, seconds, static_cast<double>(bytes), flops);
}
BENCHMARK_CAPTURE(BM_CudaAttentionScores, smollm2_135m, kSmolLM2)
    ->ArgNames({"tokens", "queries"})
    ->Args({kLongContext, 32})
    ->Args({4096, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaAttentionScores, llama8b, kLlama8B)
    ->ArgNames({"tokens", "queries"})
    ->Args({kLongContext, 32})
    ->Args({4096, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The range(1) highest of range(0) scores per KV head (an eviction's choice): GB/s of the
// scores read and the indices written.
void BM_CudaTopK(benchmark::State& state, Shape shape) {
  const int64_t n = state.range(0), k = state.range(1);
  const int64_t rows = shape.kv_heads;
  const int64_t bytes = rows * (n + k) * 4;
  const int64_t copies = copies_for(bytes);
  const DeviceBuffer<float> scores(replicated(random_floats(rows * n, 16), copies));
  DeviceBuffer<int32_t> kept(rows * k * copies);
  const double seconds = time_launches(state, copies, [&](int64_t c) {
    kvbench::top_k_indices_cuda(scores.data() + c * rows * n, rows, n, k,
                                kept.data() + c * rows * k, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaTopK, smollm2_135m, kSmolLM2)
    ->ArgNames({"n", "k"})
    ->Args({kLongContext, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaTopK, llama8b, kLlama8B)
    ->ArgNames({"n", "k"})
    ->Args({kLongContext, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Applying a retain plan out of place: 1/4 of range(0) slots per KV head, every 4th, copied
// compacted. GB/s of the kept rows (K, V, position) read and written and the slot list read.
void BM_CudaGatherRows(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0), n_keep = n_tokens / 4;
  const int64_t row_bytes = 2LL * shape.head_dim * 4 + 4;
  const int64_t bytes = 2 * shape.kv_heads * n_keep * row_bytes + shape.kv_heads * n_keep * 4;
  const DeviceKv kv(shape, n_tokens, copies_for(bytes), 17);
  std::vector<int32_t> host_slots(shape.kv_heads * n_keep);
  for (int64_t i = 0; i < static_cast<int64_t>(host_slots.size()); ++i) {
    host_slots[i] = static_cast<int32_t>(i % n_keep * (n_tokens / n_keep));
  }
  const DeviceBuffer<int32_t> slots(replicated(host_slots, kv.copies));
  const int64_t out_elements = int64_t{shape.kv_heads} * n_keep * shape.head_dim;
  DeviceBuffer<float> out_k(out_elements * kv.copies), out_v(out_elements * kv.copies);
  DeviceBuffer<int32_t> out_positions(shape.kv_heads * n_keep * kv.copies);
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    const kvbench::GatherTarget out{out_k.data() + c * out_elements,
                                    out_v.data() + c * out_elements,
                                    out_positions.data() + c * shape.kv_heads * n_keep, n_keep};
    kvbench::gather_rows_cuda(kv.copy(c), slots.data() + c * shape.kv_heads * n_keep, n_keep,
                              out, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaGatherRows, smollm2_135m, kSmolLM2)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaGatherRows, llama8b, kLlama8B)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// A decode-step eviction applied in place (the device dense store's retain while its capacity
// stays): per KV head one row, the newest of range(0), moved into slot 0's hole. Bound by the
// launch, not by bytes; the store gathered all n - 1 kept rows into fresh buffers before.
void BM_CudaMoveRows(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0), heads = shape.kv_heads;
  const int64_t row_bytes = 2LL * shape.head_dim * 4 + 4;
  const int64_t bytes = 2 * heads * row_bytes + 2 * heads * 8;  // rows read and written, list
  DeviceKv kv(shape, n_tokens, 1, 18);
  std::vector<int64_t> moves;  // from, then to
  for (int64_t h = 0; h < heads; ++h) moves.push_back(h * n_tokens + n_tokens - 1);
  for (int64_t h = 0; h < heads; ++h) moves.push_back(h * n_tokens);
  const DeviceBuffer<int64_t> list(moves.data(), static_cast<int64_t>(moves.size()));
  const kvbench::GatherTarget rows{kv.k.data(), kv.v.data(), kv.positions.data(), n_tokens};
  const double seconds = time_launches(state, 1, [&](int64_t) {
    kvbench::move_rows_cuda(rows, shape.kv_heads, shape.head_dim, list.data(), list.data() + heads,
                            heads, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaMoveRows, smollm2_135m, kSmolLM2)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaMoveRows, llama8b, kLlama8B)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// KVMerger's cosine of adjacent keys over range(0) slots per KV head, in slot order: GB/s of
// the keys read once (the second read of each is a cache hit), the order read and the
// similarities written.
void BM_CudaKeyCosine(benchmark::State& state, Shape shape) {
  const int64_t n_tokens = state.range(0);
  const int64_t per_head = int64_t{shape.kv_heads} * n_tokens;
  const int64_t bytes = key_bytes(shape, n_tokens) + per_head * (4 + 4);
  const DeviceKv kv(shape, n_tokens, copies_for(bytes), 18);
  const DeviceBuffer<int32_t> order(replicated(counting_rows(shape.kv_heads, n_tokens), kv.copies));
  DeviceBuffer<float> sim(per_head * kv.copies);
  const double seconds = time_launches(state, kv.copies, [&](int64_t c) {
    kvbench::adjacent_key_cosine_cuda(kv.copy(c), order.data() + c * per_head,
                                      sim.data() + c * per_head, nullptr);
  });
  report(state, seconds, static_cast<double>(bytes));
}
BENCHMARK_CAPTURE(BM_CudaKeyCosine, smollm2_135m, kSmolLM2)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaKeyCosine, llama8b, kLlama8B)
    ->ArgName("tokens")
    ->Arg(kLongContext)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("bench_cuda_kernels: no CUDA device: nothing to run");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const DevicePeak& peak = device_peak();
  benchmark::AddCustomContext("cuda_device", peak.name);
  char gb_per_s[32];
  std::snprintf(gb_per_s, sizeof gb_per_s, "%.1f", peak.gb_per_s);
  benchmark::AddCustomContext("peak_GB/s", std::string(gb_per_s) + " (" + peak.how + ")");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
