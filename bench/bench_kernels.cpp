// Kernel benchmarks in SmolLM2-135M's shapes. Decode-time kernels report GB/s of the bytes
// they must stream (KV or weights), to compare with BM_Triad, the machine's bandwidth.
// Each case rotates over enough copies of its data (>= 128 MiB) that it cannot sit in the
// 32 MiB L3, as in a real decode step where 30 layers' KV and weights pass through.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/block_matvec.h"
#include "kernels/cpu/block_matvec_q8.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_q8.h"
#include "kernels/cpu/gather.h"
#include "kernels/cpu/kivi_attention.h"
#include "kernels/cpu/quest.h"
#include "kernels/cpu/scores.h"

namespace {

using kvbench::AttentionQuery;
using kvbench::BlockFormat;
using kvbench::BlockMatrix;
using kvbench::DenseKv;

constexpr int64_t kColdBytes = 128LL << 20;
constexpr int kHeads = 9, kKvHeads = 3, kHeadDim = 64;

// Second benchmark argument: 1 = cold (rotate copies through DRAM), 0 = hot (one copy, in
// cache when it fits): hot measures the kernel's compute ceiling.
int64_t copies_for(int64_t bytes_per_copy, bool cold = true) {
  if (!cold) return 1;
  return std::max<int64_t>(1, (kColdBytes + bytes_per_copy - 1) / bytes_per_copy);
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = uni(rng);
  return v;
}

// STREAM triad a = b + s c over 3 x 64 MiB, both threads: the bandwidth ceiling.
void BM_Triad(benchmark::State& state) {
  const int64_t n = 16LL << 20;
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * n * 4);
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(3 * n * 4) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Triad)->Unit(benchmark::kMillisecond)->UseRealTime();

struct KvLayers {
  std::vector<std::vector<float>> k, v;
  std::vector<int32_t> positions;
  int64_t bytes_per_layer;
  explicit KvLayers(int64_t n_tokens, bool cold = true) {
    bytes_per_layer = 2LL * kKvHeads * n_tokens * kHeadDim * 4;
    const int64_t layers = copies_for(bytes_per_layer, cold);
    for (int64_t l = 0; l < layers; ++l) {
      k.push_back(random_floats(kKvHeads * n_tokens * kHeadDim, 2 * l));
      v.push_back(random_floats(kKvHeads * n_tokens * kHeadDim, 2 * l + 1));
    }
    positions.resize(kKvHeads * n_tokens);
    for (int64_t i = 0; i < kKvHeads * n_tokens; ++i) positions[i] = static_cast<int32_t>(i % n_tokens);
  }
  DenseKv layer(size_t l) const {
    return DenseKv{k[l].data(),
                   v[l].data(),
                   positions.data(),
                   kKvHeads,
                   kHeadDim,
                   static_cast<int64_t>(positions.size()) / kKvHeads,
                   static_cast<int64_t>(positions.size()) / kKvHeads};
  }
};

// One decode query over n_tokens of KV: bandwidth-bound on reading K and V.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t n_tokens = state.range(0);
  const KvLayers kv(n_tokens, state.range(1) != 0);
  const auto q = random_floats(kHeads * kHeadDim, 99);
  std::vector<float> out(q.size());
  const int32_t q_pos = static_cast<int32_t>(n_tokens);
  AttentionQuery query{q.data(), &q_pos, out.data(), 1, kHeads, 0.125f};
  size_t l = 0;
  for (auto _ : state) {
    kvbench::attention_dense_cpu(query, kv.layer(l));
    l = (l + 1) % kv.k.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(kv.bytes_per_layer) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{2048, 8192, 32768}, {1}})
    ->Args({2048, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// n_queries new tokens at the end of n_tokens stored keys, causal: one prefill chunk's queries.
struct CausalChunk {
  std::vector<float> q, out;
  std::vector<int32_t> q_pos;
  double visible_pairs = 0;  // (query, key) pairs the mask lets through, per head
  CausalChunk(int64_t n_tokens, int n_queries)
      : q(random_floats(static_cast<size_t>(n_queries) * kHeads * kHeadDim, 98)),
        out(q.size()),
        q_pos(n_queries) {
    for (int i = 0; i < n_queries; ++i) {
      q_pos[i] = static_cast<int32_t>(n_tokens - n_queries + i);
      visible_pairs += q_pos[i] + 1;
    }
  }
  AttentionQuery query() {
    return AttentionQuery{q.data(), q_pos.data(), out.data(), static_cast<int32_t>(q_pos.size()),
                          kHeads,   0.125f};
  }
};

// A causal prefill chunk over n_tokens stored keys: compute-bound.
void attention_prefill(benchmark::State& state, int64_t n_tokens, int n_queries) {
  const KvLayers kv(n_tokens);
  CausalChunk chunk(n_tokens, n_queries);
  const AttentionQuery query = chunk.query();
  size_t l = 0;
  for (auto _ : state) {
    kvbench::attention_dense_cpu(query, kv.layer(l));
    l = (l + 1) % kv.k.size();
    benchmark::DoNotOptimize(chunk.out.data());
  }
  // Q K^T and P V: 2 flops per multiply-add, head_dim of each per visible (query, key, head).
  const double flops = chunk.visible_pairs * kHeads * 4.0 * kHeadDim;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// A 512-query chunk at the end of n_tokens stored keys.
void BM_AttentionPrefill(benchmark::State& state) { attention_prefill(state, state.range(0), 512); }
BENCHMARK(BM_AttentionPrefill)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond)->UseRealTime();

// A whole n_tokens prompt in one chunk: the attention that H2O's prefill scoring accompanies.
void BM_AttentionPrefillWhole(benchmark::State& state) {
  attention_prefill(state, state.range(0), static_cast<int>(state.range(0)));
}
BENCHMARK(BM_AttentionPrefillWhole)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();

// Softmax attention each stored token receives from the last range(1) queries of a range(0)
// prompt (causal): 32 = SnapKV's observation window, range(0) = H2O over the whole prompt.
// GFLOP/s counts Q K^T once (2 head_dim flops per visible pair and head); items are query rows.
void BM_AttentionScores(benchmark::State& state) {
  const int64_t n_tokens = state.range(0);
  const int n_queries = static_cast<int>(state.range(1));
  const KvLayers kv(n_tokens);
  CausalChunk chunk(n_tokens, n_queries);
  const AttentionQuery query = chunk.query();
  std::vector<float> scores(kHeads * n_tokens, 0.0f);
  size_t l = 0;
  for (auto _ : state) {
    kvbench::attention_scores_cpu(query, kv.layer(l), scores.data());
    l = (l + 1) % kv.k.size();
    benchmark::DoNotOptimize(scores.data());
  }
  const double flops = chunk.visible_pairs * kHeads * 2.0 * kHeadDim;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetItemsProcessed(state.iterations() * n_queries * kHeads);
}
BENCHMARK(BM_AttentionScores)
    ->Args({4096, 32})
    ->Args({4096, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The k highest scores per KV head (an eviction's choice: range(1) kept of range(0) scores
// per head, SnapKV's and H2O's shape): GB/s of the scores read.
void BM_TopK(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  const std::vector<float> scores = random_floats(kKvHeads * n, 7);
  std::vector<int32_t> kept(kKvHeads * k);
  for (auto _ : state) {
    kvbench::top_k_indices_cpu(scores.data(), kKvHeads, n, k, kept.data());
    benchmark::DoNotOptimize(kept.data());
  }
  state.SetBytesProcessed(state.iterations() * kKvHeads * n * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_TopK)->Args({8192, 1024})->Unit(benchmark::kMicrosecond)->UseRealTime();

// Applying a retain plan out of place (gather_rows_cpu): range(1) of range(0) tokens per KV
// head, spread evenly, copied compacted from cold KV. GB/s of the bytes read and written.
void BM_GatherRows(benchmark::State& state) {
  const int64_t n = state.range(0), keep = state.range(1);
  const KvLayers kv(n);
  std::vector<int32_t> slots(kKvHeads * keep);
  for (int64_t i = 0; i < kKvHeads * keep; ++i) slots[i] = static_cast<int32_t>((i % keep) * (n / keep));
  std::vector<float> k(kKvHeads * keep * kHeadDim), v(k.size());
  std::vector<int32_t> positions(kKvHeads * keep);
  const kvbench::GatherTarget out{k.data(), v.data(), positions.data(), keep};
  size_t l = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kvbench::gather_rows_cpu(kv.layer(l), slots.data(), keep, out));
    l = (l + 1) % kv.k.size();
  }
  const int64_t row_bytes = 2 * kHeadDim * static_cast<int64_t>(sizeof(float)) + sizeof(int32_t);
  state.SetBytesProcessed(state.iterations() * 2 * kKvHeads * keep * row_bytes);
}
BENCHMARK(BM_GatherRows)->Args({8192, 1024})->Unit(benchmark::kMicrosecond)->UseRealTime();

// Byte offsets of a block's fp16 scale fields (d, and m or dmin): the rest stays random.
std::vector<int64_t> fp16_fields(BlockFormat f) {
  switch (f) {
    case BlockFormat::Q4_1:
    case BlockFormat::Q5_1:
    case BlockFormat::Q4_K:
      return {0, 2};
    case BlockFormat::Q6_K:
      return {208};
    default:
      return {0};
  }
}

// A weight matrix [rows, cols] in format f: random bytes with fp16 0.0625 in every d (and
// m, dmin) field, so every block decodes to finite values; F32 as random floats.
std::vector<uint8_t> random_blocks(BlockFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t block_bytes = kvbench::block_format_bytes(f);
  const int64_t bytes = rows * (cols / kvbench::block_format_elements(f) * block_bytes);
  std::vector<uint8_t> w(bytes);
  if (f == BlockFormat::F32) {
    const auto values = random_floats(rows * cols, static_cast<uint32_t>(rng()));
    std::memcpy(w.data(), values.data(), bytes);
    return w;
  }
  for (auto& byte : w) byte = static_cast<uint8_t>(rng());
  const uint16_t scale = 0x2C00;
  for (int64_t b = 0; b < bytes / block_bytes; ++b) {
    for (int64_t at : fp16_fields(f)) std::memcpy(w.data() + b * block_bytes + at, &scale, 2);
  }
  return w;
}

// y[n, rows] = x[n, cols] W^T with W streamed from memory: GB/s of weight bytes.
// Args: n (x rows), W streamed (1) or cache-resident (0), x as fp32 (0) or int8 (1).
void BM_BlockMatmul(benchmark::State& state, BlockFormat f, int64_t rows, int64_t cols) {
  const int64_t n = state.range(0);
  const int64_t block_bytes = kvbench::block_format_bytes(f);
  const int64_t row_bytes = cols / kvbench::block_format_elements(f) * block_bytes;
  const int64_t bytes = rows * row_bytes;
  const int64_t n_copies = copies_for(bytes, state.range(1) != 0);
  std::vector<std::vector<uint8_t>> weights(n_copies);
  std::mt19937 rng(5);
  for (auto& w : weights) w = random_blocks(f, rows, cols, rng);
  const auto x = random_floats(n * cols, 7);
  std::vector<float> y(n * rows);
  const bool int8_activations = state.range(2) != 0;
  kvbench::Q8Activations xq;
  size_t c = 0;
  for (auto _ : state) {
    const BlockMatrix m{weights[c].data(), f, rows, cols, row_bytes};
    if (int8_activations) {  // x's rounding is part of the int8 path's cost
      kvbench::quantize_activations_q8(x.data(), n, cols, &xq);
      kvbench::block_matmul_q8(m, xq, y.data());
    } else {
      kvbench::block_matmul_cpu(m, x.data(), y.data(), n);
    }
    c = (c + 1) % weights.size();
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK_CAPTURE(BM_BlockMatmul, q4_1_576x1536, BlockFormat::Q4_1, 576, 1536)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({4, 1, 0})
    ->Args({4, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, q4_1_1536x576, BlockFormat::Q4_1, 1536, 576)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, q8_0_49152x576, BlockFormat::Q8_0, 49152, 576)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, f32_576x1536, BlockFormat::F32, 576, 1536)
    ->Args({1, 1, 0})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
// Qwen2.5-0.5B's FFN (Q4_K_M file): gate/up 4864x896 in Q5_0, down 896x4864 in Q4_K or
// Q6_K (f32: what down cost when it was dequantized for decode).
BENCHMARK_CAPTURE(BM_BlockMatmul, q5_0_4864x896, BlockFormat::Q5_0, 4864, 896)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({4, 1, 0})
    ->Args({4, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, q5_1_4864x896, BlockFormat::Q5_1, 4864, 896)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, q4_k_896x4864, BlockFormat::Q4_K, 896, 4864)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({4, 1, 0})
    ->Args({4, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, q6_k_896x4864, BlockFormat::Q6_K, 896, 4864)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({1, 0, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BlockMatmul, f32_896x4864, BlockFormat::F32, 896, 4864)
    ->Args({1, 1, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// A prefill chunk's linear layer, y[n, rows] = x[n, cols] W^T: the fp32 GEMM on the
// dequantized copy (arg 1 = 0) against the int8 GEMM on the repacked blocks (1, x's
// rounding included), in GFLOP/s (2 n rows cols per call). Shapes of Qwen2.5-Coder-0.5B
// (q/o 896x896, k/v 128x896, gate/up 4864x896, down 896x4864) and its formats.
void BM_PrefillGemm(benchmark::State& state, BlockFormat f, int64_t rows, int64_t cols) {
  const int64_t n = state.range(0);
  const bool int8 = state.range(1) != 0;
  const int64_t block_bytes = kvbench::block_format_bytes(f);
  const int64_t row_bytes = cols / kvbench::block_format_elements(f) * block_bytes;
  std::mt19937 rng(5);
  const std::vector<uint8_t> blocks = random_blocks(f, rows, cols, rng);
  const kvbench::PackedQ8Matrix packed =
      int8 ? kvbench::pack_q8(BlockMatrix{blocks.data(), f, rows, cols, row_bytes})
           : kvbench::PackedQ8Matrix{};
  const std::vector<float> dense = int8 ? std::vector<float>{} : random_floats(rows * cols, 3);
  const auto x = random_floats(n * cols, 7);
  std::vector<float> y(n * rows);
  kvbench::Q8Activations xq;
  for (auto _ : state) {
    if (int8) {
      kvbench::quantize_activations_q8(x.data(), n, cols, &xq);
      kvbench::gemm_q8(packed, xq, y.data());
    } else {
      kvbench::gemm_f32(x.data(), n, dense.data(), rows, cols, y.data());
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * n * rows * cols * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
  state.SetLabel(int8 ? (kvbench::gemm_q8_uses_vnni() ? "int8 VNNI" : "int8 reference") : "fp32");
}
#define KVBENCH_PREFILL_GEMM(name, format, rows, cols)                                   \
  BENCHMARK_CAPTURE(BM_PrefillGemm, name, format, rows, cols)                            \
      ->ArgsProduct({{512}, {0, 1}})                                                     \
      ->UseRealTime()                                                                    \
      ->Unit(benchmark::kMillisecond)
KVBENCH_PREFILL_GEMM(q5_0_896x896, BlockFormat::Q5_0, 896, 896);
KVBENCH_PREFILL_GEMM(q8_0_128x896, BlockFormat::Q8_0, 128, 896);
KVBENCH_PREFILL_GEMM(q5_0_4864x896, BlockFormat::Q5_0, 4864, 896);
KVBENCH_PREFILL_GEMM(q4_k_4864x896, BlockFormat::Q4_K, 4864, 896);
KVBENCH_PREFILL_GEMM(q6_k_896x4864, BlockFormat::Q6_K, 896, 4864);
KVBENCH_PREFILL_GEMM(q4_k_896x4864, BlockFormat::Q4_K, 896, 4864);
KVBENCH_PREFILL_GEMM(q4_1_1536x576, BlockFormat::Q4_1, 1536, 576);

// Decode-shaped products, the weights streamed from DRAM (copies rotated past the L3): the
// int8 row kernels on the GGUF blocks (arg 1 = 0, block_matmul_q8) against the int8 GEMM on
// the repacked codes, byte-wide (1, gemm_q8: 1.25 bytes a weight where Q5_0 has 0.69) and at
// the format's own width (2: Q5_0's 0.69), for n x rows (arg 0: 1, one sequence; 8, a decode
// batch). GB/s counts the GGUF blocks' bytes for all, so they read as tokens per second would.
void BM_DecodeGemm(benchmark::State& state, BlockFormat f, int64_t rows, int64_t cols) {
  const int64_t n = state.range(0);
  const bool packed = state.range(1) != 0;
  const kvbench::CodeWidth width =
      state.range(1) == 2 ? kvbench::CodeWidth::Format : kvbench::CodeWidth::Byte;
  const int64_t block_bytes = kvbench::block_format_bytes(f);
  const int64_t row_bytes = cols / kvbench::block_format_elements(f) * block_bytes;
  const int64_t bytes = rows * row_bytes;
  const int64_t copies = copies_for(packed ? bytes * 2 : bytes);
  std::vector<std::vector<uint8_t>> blocks(copies);
  std::vector<kvbench::PackedQ8Matrix> packs;
  std::mt19937 rng(5);
  for (auto& w : blocks) {
    w = random_blocks(f, rows, cols, rng);
    if (packed) {
      packs.push_back(kvbench::pack_q8(BlockMatrix{w.data(), f, rows, cols, row_bytes}, width));
    }
  }
  if (packed) blocks.clear();  // only the packed copies are read
  const auto x = random_floats(n * cols, 7);
  std::vector<float> y(n * rows);
  kvbench::Q8Activations xq;
  size_t c = 0;
  for (auto _ : state) {
    kvbench::quantize_activations_q8(x.data(), n, cols, &xq);
    if (packed) {
      kvbench::gemm_q8(packs[c], xq, y.data());
    } else {
      kvbench::block_matmul_q8(BlockMatrix{blocks[c].data(), f, rows, cols, row_bytes}, xq,
                               y.data());
    }
    c = (c + 1) % static_cast<size_t>(copies);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * state.iterations(),
                                              benchmark::Counter::kIsRate,
                                              benchmark::Counter::kIs1000);
  state.SetLabel(!packed ? "block_matmul_q8"
                 : width == kvbench::CodeWidth::Byte ? "gemm_q8 bytes" : "gemm_q8 format width");
}
BENCHMARK_CAPTURE(BM_DecodeGemm, q5_0_4864x896, BlockFormat::Q5_0, 4864, 896)
    ->ArgsProduct({{1, 8}, {0, 1, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeGemm, q4_k_896x4864, BlockFormat::Q4_K, 896, 4864)
    ->ArgsProduct({{1, 8}, {0, 1, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeGemm, q6_k_896x4864, BlockFormat::Q6_K, 896, 4864)
    ->ArgsProduct({{1, 8}, {0, 1, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
// Qwen2.5-Coder-1.5B's shapes: ffn_up and ffn_gate (Q4_K), ffn_down (Q6_K).
BENCHMARK_CAPTURE(BM_DecodeGemm, q4_k_8960x1536, BlockFormat::Q4_K, 8960, 1536)
    ->ArgsProduct({{1, 8}, {0, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeGemm, q6_k_1536x8960, BlockFormat::Q6_K, 1536, 8960)
    ->ArgsProduct({{1, 8}, {0, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeGemm, q8_0_4864x896, BlockFormat::Q8_0, 4864, 896)
    ->ArgsProduct({{1, 8}, {0, 1, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeGemm, q4_1_1536x576, BlockFormat::Q4_1, 1536, 576)
    ->ArgsProduct({{1, 8}, {0, 1, 2}})->UseRealTime()->Unit(benchmark::kMicrosecond);

// ---- KIVI (issue 7) -----------------------------------------------------------------------

// One layer of KIVI storage in SmolLM2's shape: n_blocks blocks of 32 slots at `bits`, then a
// fp32 tail, random codes and scales (the kernel's speed does not depend on their values).
struct KiviLayer {
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<float> k_scale, k_min, v_scale, v_min, tail_k, tail_v;
  std::vector<int32_t> positions, tail_positions;
  kvbench::KiviKv kv{};
  KiviLayer(int64_t n_blocks, int64_t n_tail, int bits, uint32_t seed) {
    const int64_t block_heads = n_blocks * kKvHeads;
    const int64_t code_bytes = 32LL * kHeadDim * bits / 8;
    std::mt19937 rng(seed);
    k_codes.resize(block_heads * code_bytes);
    v_codes.resize(block_heads * code_bytes);
    for (auto& b : k_codes) b = static_cast<uint8_t>(rng());
    for (auto& b : v_codes) b = static_cast<uint8_t>(rng());
    const float step = 2.0f / static_cast<float>((1 << bits) - 1);
    k_scale.assign(block_heads * kHeadDim, step);
    k_min.assign(block_heads * kHeadDim, -1.0f);
    v_scale.assign(block_heads * kHeadDim, step);  // [blocks, heads, 32, head_dim / 32]
    v_min.assign(block_heads * kHeadDim, -1.0f);
    positions.resize(block_heads * 32);
    for (int64_t b = 0; b < n_blocks; ++b) {
      for (int h = 0; h < kKvHeads; ++h) {
        for (int t = 0; t < 32; ++t) {
          positions[(b * kKvHeads + h) * 32 + t] = static_cast<int32_t>(b * 32 + t);
        }
      }
    }
    tail_k = random_floats(kKvHeads * n_tail * kHeadDim, seed + 1);
    tail_v = random_floats(kKvHeads * n_tail * kHeadDim, seed + 2);
    tail_positions.resize(kKvHeads * n_tail);
    for (int64_t i = 0; i < kKvHeads * n_tail; ++i) {
      tail_positions[i] = static_cast<int32_t>(n_blocks * 32 + i % n_tail);
    }
    const DenseKv tail{tail_k.data(), tail_v.data(), tail_positions.data(), kKvHeads, kHeadDim,
                       n_tail,        n_tail};
    kv = kvbench::KiviKv{k_codes.data(),
                         k_scale.data(),
                         k_min.data(),
                         v_codes.data(),
                         v_scale.data(),
                         v_min.data(),
                         positions.data(),
                         n_blocks,
                         32,
                         bits,
                         tail};
  }
};

// One decode query over 8192 slots of KIVI KV (128 in the fp32 tail), range(0) bits, range(1)
// cold as above, range(2) query heads per KV head (3: SmolLM2, 7: Qwen2.5-0.5B's GQA group),
// range(3) 1: the query on int8 activations (4 bits: int8 dot products where built):
// GB/s of what it must read (codes, scales and minimums, positions, the tail).
void BM_KiviDecode(benchmark::State& state) {
  const int bits = static_cast<int>(state.range(0));
  const int64_t n_tokens = 8192, n_tail = 128, n_blocks = (n_tokens - n_tail) / 32;
  const int64_t bytes =
      kKvHeads * (n_blocks * (kvbench::kivi_block_bytes(kHeadDim, 32, bits) + 32 * 4) +
                  n_tail * (2 * kHeadDim * 4 + 4));
  std::vector<KiviLayer> layers;
  const int64_t n_copies = copies_for(bytes, state.range(1) != 0);
  layers.reserve(n_copies);
  for (int64_t l = 0; l < n_copies; ++l) {
    layers.emplace_back(n_blocks, n_tail, bits, static_cast<uint32_t>(3 * l));
  }
  const int heads = kKvHeads * static_cast<int>(state.range(2));
  const auto q = random_floats(heads * kHeadDim, 99);
  std::vector<float> out(q.size());
  const int32_t q_pos = static_cast<int32_t>(n_tokens);
  const AttentionQuery query{q.data(), &q_pos, out.data(), 1, heads, 0.125f,
                             state.range(3) ? kvbench::QueryRounding::Int8
                                            : kvbench::QueryRounding::None};
  size_t l = 0;
  for (auto _ : state) {
    kvbench::attention_kivi_cpu(query, layers[l].kv);
    l = (l + 1) % layers.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_KiviDecode)
    ->ArgsProduct({{2, 4}, {1}, {3, 7}, {0}})
    ->ArgsProduct({{4}, {1}, {3, 7}, {1}})
    ->Args({2, 0, 3, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- Quest (issue 7) ----------------------------------------------------------------------

// Quest decode: per decode step, bound each page's logits from its key min/max,
// keep the top pages (the last, being written, always), attend over those pages only.
// Directly comparable with BM_AttentionDecode/<n_tokens>/1 (same shape, query, scale and
// query position, cold); GB/s counts what Quest must read: every page's bounds + the
// selected pages' K and V.
constexpr int kQuestPageTokens = 16;

// Copies of one layer's KV and its page bounds (built with page_bounds_append_cpu). Quest
// reads a fraction of each copy, so there are enough copies that the bytes it reads, not the
// copies' size, add up to kColdBytes: with fewer, the pages it keeps picking stay in the L3.
struct QuestLayers {
  int64_t n_tokens, n_pages;
  std::vector<int32_t> positions;
  std::vector<std::vector<float>> k, v, k_min, k_max;
  QuestLayers(int64_t tokens, int64_t bytes_read)
      : n_tokens(tokens), n_pages((tokens + kQuestPageTokens - 1) / kQuestPageTokens) {
    positions.resize(kKvHeads * n_tokens);
    for (int64_t i = 0; i < kKvHeads * n_tokens; ++i) {
      positions[i] = static_cast<int32_t>(i % n_tokens);
    }
    std::vector<float> token_major(kKvHeads * n_tokens * kHeadDim);  // append's layout
    for (int64_t l = 0; l < copies_for(bytes_read); ++l) {
      k.push_back(random_floats(kKvHeads * n_tokens * kHeadDim, 2 * l));
      v.push_back(random_floats(kKvHeads * n_tokens * kHeadDim, 2 * l + 1));
      for (int h = 0; h < kKvHeads; ++h) {
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::copy_n(k[l].data() + (h * n_tokens + t) * kHeadDim, kHeadDim,
                      token_major.data() + (t * kKvHeads + h) * kHeadDim);
        }
      }
      k_min.emplace_back(kKvHeads * n_pages * kHeadDim);
      k_max.emplace_back(kKvHeads * n_pages * kHeadDim);
      kvbench::PageBounds b = bounds(l);
      b.n_pages = 0;
      kvbench::page_bounds_append_cpu(b, token_major.data(), 0, n_tokens);
    }
  }
  DenseKv layer(size_t l) const {
    return DenseKv{k[l].data(), v[l].data(), positions.data(), kKvHeads,
                   kHeadDim,    n_tokens,    n_tokens};
  }
  kvbench::PageBounds bounds(size_t l) {
    return kvbench::PageBounds{k_min[l].data(),  k_max[l].data(), kKvHeads, kHeadDim,
                               kQuestPageTokens, n_pages,         n_pages};
  }
};

// range(0) stored tokens, a budget of range(1) tokens (pages of 16) per KV head, cold.
void BM_QuestDecode(benchmark::State& state) {
  const int64_t n_tokens = state.range(0);
  const int budget_pages = static_cast<int>(state.range(1) / kQuestPageTokens);
  const int64_t n_pages = (n_tokens + kQuestPageTokens - 1) / kQuestPageTokens;
  const double bounds_bytes = 2.0 * kKvHeads * n_pages * kHeadDim * 4;
  const double kv_bytes = 2.0 * kKvHeads * budget_pages * kQuestPageTokens * kHeadDim * 4;
  // Built once per shape: the benchmark function runs several times, and the copies are big.
  static std::map<std::pair<int64_t, int>, std::unique_ptr<QuestLayers>> built;
  auto& layers = built[{n_tokens, budget_pages}];
  if (!layers) {
    layers = std::make_unique<QuestLayers>(n_tokens, static_cast<int64_t>(bounds_bytes + kv_bytes));
  }
  const auto q = random_floats(kHeads * kHeadDim, 99);
  std::vector<float> out(q.size()), scores(kKvHeads * n_pages);
  std::vector<int32_t> selected(kKvHeads * budget_pages);
  const int32_t q_pos = static_cast<int32_t>(n_tokens);
  const AttentionQuery query{q.data(), &q_pos, out.data(), 1, kHeads, 0.125f};
  using Clock = std::chrono::steady_clock;
  double score_us = 0, top_k_us = 0, attend_us = 0;  // where an iteration's time goes
  size_t l = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    kvbench::page_scores_cpu(query, 0, layers->bounds(l), scores.data());
    for (int h = 0; h < kKvHeads; ++h) {
      scores[h * n_pages + n_pages - 1] = std::numeric_limits<float>::infinity();
    }
    const auto t1 = Clock::now();
    kvbench::top_k_indices_cpu(scores.data(), kKvHeads, n_pages, budget_pages, selected.data());
    const auto t2 = Clock::now();
    kvbench::attention_pages_cpu(
        query, layers->layer(l),
        kvbench::PageSelection{selected.data(), budget_pages, kQuestPageTokens});
    const auto t3 = Clock::now();
    score_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
    top_k_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
    attend_us += std::chrono::duration<double, std::micro>(t3 - t2).count();
    l = (l + 1) % layers->k.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter((bounds_bytes + kv_bytes) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["MB_read"] = (bounds_bytes + kv_bytes) / 1e6;
  state.counters["score_us"] = benchmark::Counter(score_us, benchmark::Counter::kAvgIterations);
  state.counters["top_k_us"] = benchmark::Counter(top_k_us, benchmark::Counter::kAvgIterations);
  state.counters["attend_us"] = benchmark::Counter(attend_us, benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_QuestDecode)->Args({8192, 1024})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
