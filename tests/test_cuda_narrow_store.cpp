// The device narrow store (CudaNarrowLayerKv) against the CPU one (NarrowLayerKv) fed the same
// tokens, for fp16, bf16 and fp8: the stored bytes themselves (elements, scales, positions,
// slot by slot: both place kept tokens alike), the widened view, capacity and bytes resident,
// through appends, retain plans (random, decode-step, merged), appends after them and clones;
// attention (dense and paged) and the bytes it reports; and make_cuda_cache's wiring.
// Without a CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "methods/cuda/narrow_store.h"
#include "cache/narrow_kv.h"
#include "cache/registry.h"
#include "cuda_device.h"
#include "methods/cuda/device_cache.h"
#include "page_picks.h"
#include "random_floats.h"
#include "retain_plans.h"

namespace {

using namespace kvbench;
using kvbench::testing::Device;
using kvbench::testing::download;
using kvbench::testing::pages_of;
using kvbench::testing::Pick;
using kvbench::testing::pick_pages;
using kvbench::testing::add_random_slots;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

constexpr int32_t kKvHeads = 3;
constexpr int32_t kGroup = 2;  // query heads per KV head
constexpr KvElement kElements[] = {KvElement::F16, KvElement::BF16, KvElement::F8E4M3};

// The first n_tokens rows of each head of one array of `width` bytes per row, packed.
std::vector<uint8_t> head_rows(const void* data, bool on_device, int64_t capacity,
                               int64_t n_tokens, int64_t width) {
  std::vector<uint8_t> all;
  const int64_t total = kKvHeads * capacity * width;
  if (on_device) {
    all = download(static_cast<const uint8_t*>(data), total);
  } else {
    const auto* bytes = static_cast<const uint8_t*>(data);
    all.assign(bytes, bytes + total);
  }
  std::vector<uint8_t> packed;
  for (int32_t h = 0; h < kKvHeads; ++h) {
    const auto first = all.begin() + h * capacity * width;
    packed.insert(packed.end(), first, first + n_tokens * width);
  }
  return packed;
}

// Every array a store holds, slot by slot (elements, fp8's scales, positions).
void require_same_layout(const NarrowKv& cpu, const NarrowKv& gpu) {
  REQUIRE(gpu.n_tokens == cpu.n_tokens);
  REQUIRE(gpu.capacity == cpu.capacity);
  const int64_t row_bytes = cpu.head_dim * kv_element_bytes(cpu.element);
  const int64_t n = cpu.n_tokens;
  CHECK(head_rows(gpu.k, true, gpu.capacity, n, row_bytes) ==
        head_rows(cpu.k, false, cpu.capacity, n, row_bytes));
  CHECK(head_rows(gpu.v, true, gpu.capacity, n, row_bytes) ==
        head_rows(cpu.v, false, cpu.capacity, n, row_bytes));
  CHECK(head_rows(gpu.positions, true, gpu.capacity, n, 4) ==
        head_rows(cpu.positions, false, cpu.capacity, n, 4));
  if (cpu.element == KvElement::F8E4M3) {
    CHECK(head_rows(gpu.k_scale, true, gpu.capacity, n, 4) ==
          head_rows(cpu.k_scale, false, cpu.capacity, n, 4));
    CHECK(head_rows(gpu.v_scale, true, gpu.capacity, n, 4) ==
          head_rows(cpu.v_scale, false, cpu.capacity, n, 4));
  }
}

// The widened views, bit for bit (both [n_kv_heads, n_tokens, head_dim], capacity n_tokens).
void require_same_view(const LayerKv& cpu, const LayerKv& gpu) {
  const DenseKv a = cpu.view(), b = gpu.view();
  REQUIRE(b.n_tokens == a.n_tokens);
  REQUIRE(b.capacity == a.capacity);
  const int64_t n = a.n_kv_heads * a.capacity;
  CHECK(download(b.k, n * a.head_dim) == std::vector<float>(a.k, a.k + n * a.head_dim));
  CHECK(download(b.v, n * a.head_dim) == std::vector<float>(a.v, a.v + n * a.head_dim));
  CHECK(download(b.positions, n) == std::vector<int32_t>(a.positions, a.positions + n));
}

// A NarrowLayerKv and a CudaNarrowLayerKv fed the same tokens.
struct Twin {
  int32_t head_dim;
  NarrowLayerKv cpu;
  CudaNarrowLayerKv gpu;
  int32_t next_position = 0;
  uint32_t seed = 1;

  Twin(int32_t d, KvElement e) : head_dim(d), cpu(kKvHeads, d, e), gpu(kKvHeads, d, e) {}

  // n_new random tokens (rows of several scales, so fp8's row scales differ) at the next
  // positions, spaced 2 apart.
  void append(int64_t n_new) {
    auto k = random_floats(n_new * kKvHeads * head_dim, seed++);
    auto v = random_floats(n_new * kKvHeads * head_dim, seed++);
    for (int64_t r = 0; r < n_new * kKvHeads; ++r) {
      const float s = std::ldexp(1.0f, static_cast<int>(r % 9) - 4);
      for (int32_t d = 0; d < head_dim; ++d) k[r * head_dim + d] *= s;
    }
    std::vector<int32_t> positions(static_cast<size_t>(n_new));
    for (auto& p : positions) p = (next_position += 2);
    cpu.append(k.data(), v.data(), positions.data(), n_new);
    const Device<float> dk(k), dv(v);
    const Device<int32_t> dp(positions);
    gpu.append(dk.get(), dv.get(), dp.get(), n_new);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }

  void retain(RetainPlan plan) {
    RetainPlan for_gpu = plan;
    cpu.retain(plan);
    gpu.retain(for_gpu);
    CHECK(for_gpu.slots == plan.slots);  // the same placement, said the same way
  }

  void require_same() const {
    require_same_layout(cpu.layout(), gpu.layout());
    CHECK(gpu.capacity() == cpu.capacity());
    CHECK(gpu.bytes_resident() == cpu.bytes_resident());
    require_same_view(cpu, gpu);
  }
};

// n_keep of the stored slots of each head, ascending, at random.
RetainPlan random_plan(int64_t n_tokens, int64_t n_keep, uint32_t seed, int32_t merged_dim = 0) {
  std::mt19937 rng(seed);
  RetainPlan plan;
  plan.n_keep = n_keep;
  for (int32_t h = 0; h < kKvHeads; ++h) add_random_slots(plan, n_tokens, n_keep, rng);
  if (merged_dim > 0) {
    plan.k = random_floats(plan.slots.size() * merged_dim, seed + 1);
    plan.v = random_floats(plan.slots.size() * merged_dim, seed + 2);
  }
  return plan;
}

// The same queries through both stores, optionally over the same pages: outputs within fp32's
// summation order (5e-5, as the kernel tests) and equal bytes read.
void require_same_attention(const Twin& twin, uint32_t seed, const std::vector<int32_t>* pages,
                            int32_t n_selected, int32_t page_tokens) {
  const int32_t n_queries = 3, n_heads = kKvHeads * kGroup;
  const std::vector<int32_t> q_positions = {twin.next_position / 3, twin.next_position - 5,
                                            twin.next_position};
  const auto q = random_floats(static_cast<size_t>(n_queries) * n_heads * twin.head_dim, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(twin.head_dim));
  std::vector<float> cpu_out(q.size(), 0.0f);
  const Device<float> dq(q), dout(cpu_out);
  const Device<int32_t> dq_positions(q_positions), dpages(pages ? *pages : std::vector<int32_t>{});
  const AttentionQuery cpu_query{q.data(), q_positions.data(), cpu_out.data(), n_queries, n_heads,
                                 scale};
  const AttentionQuery gpu_query{dq.get(), dq_positions.get(), dout.get(), n_queries, n_heads,
                                 scale};
  const PageSelection host_pages{pages ? pages->data() : nullptr, n_selected, page_tokens};
  const PageSelection device_pages{dpages.get(), n_selected, page_tokens};
  const int64_t cpu_bytes = twin.cpu.attend(cpu_query, pages ? &host_pages : nullptr);
  const int64_t gpu_bytes = twin.gpu.attend(gpu_query, pages ? &device_pages : nullptr);
  CHECK(gpu_bytes == cpu_bytes);
  const std::vector<float> gpu_out = dout.host();
  float worst = 0.0f;
  for (size_t i = 0; i < gpu_out.size(); ++i) {
    worst = std::max(worst, std::fabs(gpu_out[i] - cpu_out[i]));
  }
  CHECK(worst <= 5e-5f);
}

}  // namespace

TEST_CASE("CudaNarrowLayerKv holds NarrowLayerKv's bytes through appends, retains and clones",
          "[gpu]") {
  require_device();
  for (KvElement element : kElements) {
    for (int32_t head_dim : {64, 128}) {
      INFO("element " << static_cast<int>(element) << " head_dim " << head_dim);
      Twin twin(head_dim, element);
      twin.append(150);  // a prefill
      twin.require_same();
      for (int i = 0; i < 3; ++i) twin.append(1);  // decode steps
      twin.require_same();

      twin.retain(random_plan(twin.cpu.n_tokens(), 60, 11));  // a compression: buffers shrink
      twin.require_same();
      twin.append(1);
      twin.retain(random_plan(twin.cpu.n_tokens(), twin.cpu.n_tokens() - 1, 12));  // one out
      twin.require_same();
      twin.append(70);  // past the eviction slack: the buffers grow by it
      twin.require_same();
      twin.retain(random_plan(twin.cpu.n_tokens(), 40, 13, head_dim));  // merged rows
      twin.require_same();

      const auto cpu_copy = twin.cpu.clone();
      const auto gpu_copy = twin.gpu.clone();
      twin.append(2);  // the copies do not see it
      REQUIRE(gpu_copy->n_tokens() == cpu_copy->n_tokens());
      require_same_layout(dynamic_cast<const NarrowLayerKv&>(*cpu_copy).layout(),
                          dynamic_cast<const CudaNarrowLayerKv&>(*gpu_copy).layout());
      CHECK(gpu_copy->bytes_resident() == cpu_copy->bytes_resident());
      CHECK(std::string(gpu_copy->tier()) == "device");
      twin.require_same();

      twin.retain(random_plan(twin.cpu.n_tokens(), 0, 14));  // everything dropped
      twin.require_same();
    }
  }
}

TEST_CASE("CudaNarrowLayerKv attends as NarrowLayerKv, dense and over pages", "[gpu]") {
  require_device();
  for (KvElement element : kElements) {
    for (int32_t head_dim : {64, 128}) {
      INFO("element " << static_cast<int>(element) << " head_dim " << head_dim);
      Twin twin(head_dim, element);
      twin.append(300);
      require_same_attention(twin, 1, nullptr, 0, 0);
      twin.retain(random_plan(twin.cpu.n_tokens(), 100, 5));
      twin.append(1);
      require_same_attention(twin, 2, nullptr, 0, 0);
      for (Pick pick : {Pick::Last, Pick::Random}) {
        int n_selected = 0;
        const auto sel =
            pick_pages(pick, kKvHeads, pages_of(twin.cpu.n_tokens(), 16), 3, n_selected);
        require_same_attention(twin, 3, &sel, n_selected, 16);
      }
    }
  }
}

TEST_CASE("make_cuda_cache builds device narrow stores for fp16, bf16 and fp8", "[gpu]") {
  require_device();
  const KvShape shape{2, kKvHeads, 64};
  for (const char* spec : {"fp16", "bf16", "fp8", "snapkv:budget=64+fp8"}) {
    INFO(spec);
    KvCache cache = make_cuda_cache(resolve_method_spec(spec), shape);
    REQUIRE(dynamic_cast<const CudaNarrowLayerKv*>(&cache.layer(0)) != nullptr);
    CHECK(std::string(cache.layer(1).tier()) == "device");
  }
  // The device twins come from the methods' registration, not from a list of names.
  CHECK(find_method("bf16")->make_device_layers);
  CHECK(find_method("kivi")->make_device_layers);
  CHECK_FALSE(find_method("kvquant_keys")->make_device_layers);
}
