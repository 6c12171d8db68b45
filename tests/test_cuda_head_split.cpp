// Heads of their own in the device's narrow and KIVI stores (HeadSplitLayerKv over
// CudaNarrowLayerKv / CudaKiviLayerKv, gathers in device memory) against the host's, fed the
// same tokens and plans: a ragged plan into packed blocks, decode steps that pack each head's
// own blocks, a clone and a later plan. Each head's count and the bytes exactly, attention
// within 1e-4 and the bytes it reads exactly.
// Without a CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "methods/cuda/narrow_store.h"
#include "cache/cuda/row_memory.h"
#include "cache/head_split.h"
#include "cache/narrow_kv.h"
#include "cuda_device.h"
#include "methods/cuda/kivi_store.h"
#include "methods/kivi.h"
#include "random_floats.h"
#include "retain_plans.h"

namespace {

using namespace kvbench;
using kvbench::testing::Device;
using kvbench::testing::ragged_plan;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

constexpr int32_t kKvHeads = 3, kGroup = 2, kHeads = kKvHeads * kGroup, kDim = 64;

struct Twin {
  HeadSplitLayerKv cpu, gpu;
  int32_t next_position = 0;
  uint32_t seed = 1;

  void append(int64_t n) {
    const auto k = random_floats(n * kKvHeads * kDim, seed);
    const auto v = random_floats(n * kKvHeads * kDim, seed + 7919);
    ++seed;
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[i] = next_position++;
    cpu.append(k.data(), v.data(), positions.data(), n);
    const Device<float> dk(k), dv(v);
    const Device<int32_t> dp(positions);
    gpu.append(dk.get(), dv.get(), dp.get(), n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the inputs are freed next
    cpu.settle();
    gpu.settle();
  }

  void retain(const std::vector<std::vector<int32_t>>& kept) {
    RetainPlan plan = ragged_plan(kept), same = plan;
    cpu.retain(plan);
    gpu.retain(same);
    CHECK(same.slots == plan.slots);  // placed alike
    cpu.settle();
    gpu.settle();
  }

  void require_same(uint32_t query_seed) const {
    REQUIRE(gpu.split() == cpu.split());
    for (int32_t h = 0; h < kKvHeads; ++h) CHECK(gpu.head_tokens(h) == cpu.head_tokens(h));
    CHECK(gpu.bytes_resident() == cpu.bytes_resident());
    const std::vector<int32_t> q_positions = {next_position - 1, next_position / 2};
    const int32_t n_queries = static_cast<int32_t>(q_positions.size());
    const auto q = random_floats(static_cast<size_t>(n_queries) * kHeads * kDim, query_seed);
    std::vector<float> cpu_out(q.size(), 0.0f);
    const Device<float> dq(q), dout(cpu_out);
    const Device<int32_t> dpos(q_positions);
    const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    const int64_t cpu_bytes = cpu.attend(
        AttentionQuery{q.data(), q_positions.data(), cpu_out.data(), n_queries, kHeads, scale},
        nullptr);
    const int64_t gpu_bytes = gpu.attend(
        AttentionQuery{dq.get(), dpos.get(), dout.get(), n_queries, kHeads, scale}, nullptr);
    CHECK(gpu_bytes == cpu_bytes);
    const std::vector<float> gpu_out = dout.host();
    float worst = 0.0f;
    for (size_t i = 0; i < q.size(); ++i) {
      worst = std::max(worst, std::abs(gpu_out[i] - cpu_out[i]));
    }
    CHECK(worst < 1e-4f);
  }
};

// Every 3rd slot, every odd one, and the first 40 of n_tokens.
std::vector<std::vector<int32_t>> uneven_keep(int32_t n_tokens) {
  std::vector<std::vector<int32_t>> kept(kKvHeads);
  for (int32_t t = 0; t < n_tokens; ++t) {
    if (t % 3 == 0) kept[0].push_back(t);
    if (t % 2 == 1) kept[1].push_back(t);
    if (t < 40) kept[2].push_back(t);
  }
  return kept;
}

void run(Twin& twin) {
  twin.append(300);
  twin.require_same(10);
  twin.retain(uneven_keep(300));
  REQUIRE(twin.gpu.split());
  CHECK(twin.gpu.head_tokens(2) == 40);
  twin.require_same(11);
  for (int step = 0; step < 40; ++step) twin.append(1);  // each head packs on its own
  twin.require_same(12);
  const std::unique_ptr<LayerKv> copy = twin.gpu.clone();
  twin.retain({{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 5, 9}, {2, 3, 4, 5, 6, 7, 8}});
  twin.require_same(13);
  CHECK(copy->head_tokens(2) == 80);  // the clone is its own
  CHECK(copy->bytes_resident() > twin.gpu.bytes_resident());
}

}  // namespace

TEST_CASE("cuda head split: the device's KIVI stores hold heads apart as the host's", "[gpu]") {
  require_device();
  for (KiviTail tail : {KiviTail::Kivi, KiviTail::Block}) {
    KiviConfig config;
    config.bits = 2;
    config.residual = 32;
    config.tail = tail;
    Twin twin{HeadSplitLayerKv(std::make_unique<KiviLayerKv>(kKvHeads, kDim, config), kKvHeads,
                               kDim),
              HeadSplitLayerKv(std::make_unique<CudaKiviLayerKv>(kKvHeads, kDim, config),
                               kKvHeads, kDim, device_memory())};
    run(twin);
  }
}

TEST_CASE("cuda head split: the device's narrow stores hold heads apart as the host's", "[gpu]") {
  require_device();
  for (KvElement element : {KvElement::F16, KvElement::BF16, KvElement::F8E4M3}) {
    Twin twin{HeadSplitLayerKv(std::make_unique<NarrowLayerKv>(kKvHeads, kDim, element), kKvHeads,
                               kDim),
              HeadSplitLayerKv(std::make_unique<CudaNarrowLayerKv>(kKvHeads, kDim, element),
                               kKvHeads, kDim, device_memory())};
    run(twin);
  }
}
