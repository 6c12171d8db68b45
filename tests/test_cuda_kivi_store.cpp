// The device KIVI store against the CPU one (KiviLayerKv) fed the same tokens: what it packs
// and when, its views, bytes resident and the bytes attention reads, attention (every slot
// and selected pages), retain plans (compressions, decode-step evictions, prefixes, merged
// contents, down to the tail, everything) and appends after them, clones, malformed plans,
// and whole caches (kivi, snapkv+kivi, quest+kivi) built on make_cuda_kivi_layers.
// Both stores place kept tokens alike, so one plan serves both and their views compare slot
// by slot: positions exactly, keys and values within 1e-5 (quantize_groups_cuda is
// bit-identical to the CPU's, dequantize_groups_cuda one rounding apart). Attention outputs
// within 1e-4, bytes exactly.
// Without a CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "cuda_device.h"
#include "methods/cuda/device_cache.h"
#include "methods/cuda/kivi_store.h"
#include "methods/kivi.h"
#include "page_picks.h"
#include "random_floats.h"
#include "retain_plans.h"

namespace {

using namespace kvbench;
using kvbench::testing::Device;
using kvbench::testing::pages_of;
using kvbench::testing::Pick;
using kvbench::testing::pick_pages;
using kvbench::testing::add_random_slots;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

constexpr int32_t kKvHeads = 3;
constexpr int32_t kGroup = 2;  // query heads per KV head

KiviConfig kivi_config(int32_t bits, int64_t residual) {
  KiviConfig config;
  config.bits = bits;
  config.residual = residual;
  return config;
}

using kvbench::testing::download;

// A store's view on the host, whichever memory it is in (slots in use only: the rest of a
// device buffer is uninitialised).
struct HostView {
  int32_t head_dim = 0;
  int64_t capacity = 0, n_tokens = 0;
  std::vector<float> k, v;
  std::vector<int32_t> positions;

  int32_t position(int32_t h, int64_t t) const { return positions[h * capacity + t]; }
  float key(int32_t h, int64_t t, int32_t c) const { return k[(h * capacity + t) * head_dim + c]; }
  float value(int32_t h, int64_t t, int32_t c) const {
    return v[(h * capacity + t) * head_dim + c];
  }
};

HostView host_view(const DenseKv& kv, bool on_device) {
  HostView view;
  view.head_dim = kv.head_dim;
  view.capacity = kv.capacity;
  view.n_tokens = kv.n_tokens;
  const int64_t slots = kv.n_kv_heads * kv.capacity;
  if (slots == 0) return view;
  if (on_device) {
    view.k = download(kv.k, slots * kv.head_dim);
    view.v = download(kv.v, slots * kv.head_dim);
    view.positions = download(kv.positions, slots);
  } else {
    view.k.assign(kv.k, kv.k + slots * kv.head_dim);
    view.v.assign(kv.v, kv.v + slots * kv.head_dim);
    view.positions.assign(kv.positions, kv.positions + slots);
  }
  return view;
}

// The same tokens in the same slots.
void require_same_views(const HostView& a, const HostView& b) {
  REQUIRE(b.n_tokens == a.n_tokens);
  REQUIRE(b.capacity == a.capacity);
  // Keys and values apart, each with where it is worst: a failure says what differs.
  float worst_key = 0.0f, worst_value = 0.0f;
  std::string key_at, value_at;
  const auto where = [](int32_t h, int64_t t, int32_t c, float x, float y) {
    return "head " + std::to_string(h) + ", slot " + std::to_string(t) + ", channel " +
           std::to_string(c) + ": " + std::to_string(x) + " vs " + std::to_string(y);
  };
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      REQUIRE(b.position(h, t) == a.position(h, t));
      for (int32_t c = 0; c < a.head_dim; ++c) {
        const float dk = std::abs(b.key(h, t, c) - a.key(h, t, c));
        const float dv = std::abs(b.value(h, t, c) - a.value(h, t, c));
        if (dk > worst_key) {
          worst_key = dk;
          key_at = where(h, t, c, a.key(h, t, c), b.key(h, t, c));
        }
        if (dv > worst_value) {
          worst_value = dv;
          value_at = where(h, t, c, a.value(h, t, c), b.value(h, t, c));
        }
      }
    }
  }
  INFO("tokens " << a.n_tokens << ", capacities " << a.capacity << " (cpu) and " << b.capacity
                 << " (device); worst key at " << key_at << "; worst value at " << value_at);
  CHECK(worst_key <= 1e-5f);
  CHECK(worst_value <= 1e-5f);
}

// Same tokens, blocks and bytes, before and while the views are held.
void require_same_stores(const LayerKv& cpu, const LayerKv& gpu) {
  REQUIRE(gpu.n_tokens() == cpu.n_tokens());
  CHECK(dynamic_cast<const CudaKiviLayerKv&>(gpu).n_blocks() ==
        dynamic_cast<const KiviLayerKv&>(cpu).n_blocks());
  CHECK(gpu.bytes_resident() == cpu.bytes_resident());
  require_same_views(host_view(cpu.view(), false), host_view(gpu.view(), true));
  CHECK(gpu.bytes_resident() == cpu.bytes_resident());  // the view buffers counted alike
}

// Appends n_new random tokens at first_position, first_position + 2, ... (spaced so they are
// no slot numbers in disguise) to both stores; returns their positions.
std::vector<int32_t> append_both(LayerKv& cpu, LayerKv& gpu, int32_t head_dim, int64_t n_new,
                                 int32_t first_position, uint32_t seed) {
  const auto k = random_floats(n_new * kKvHeads * head_dim, seed);
  const auto v = random_floats(n_new * kKvHeads * head_dim, seed + 7919);
  std::vector<int32_t> positions(static_cast<size_t>(n_new));
  for (int64_t i = 0; i < n_new; ++i) positions[i] = first_position + 2 * static_cast<int32_t>(i);
  cpu.append(k.data(), v.data(), positions.data(), n_new);
  const Device<float> dk(k), dv(v);
  const Device<int32_t> dp(positions);
  gpu.append(dk.get(), dv.get(), dp.get(), n_new);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the inputs are freed next
  return positions;
}

// A KiviLayerKv and a CudaKiviLayerKv fed the same tokens.
struct Twin {
  int32_t head_dim;
  KiviLayerKv cpu;
  CudaKiviLayerKv gpu;
  int32_t next_position = 0;
  uint32_t seed = 1;

  Twin(int32_t d, const KiviConfig& config)
      : head_dim(d), cpu(kKvHeads, d, config), gpu(kKvHeads, d, config) {}

  std::vector<int32_t> append(int64_t n_new) {
    auto positions = append_both(cpu, gpu, head_dim, n_new, next_position + 2, seed++);
    next_position += 2 * static_cast<int32_t>(n_new);
    return positions;
  }
  void settle() {
    cpu.settle();
    gpu.settle();
  }
  void require_same() const { require_same_stores(cpu, gpu); }
};

// Runs the same queries (at q_positions) through both stores, optionally over the same pages
// ([kKvHeads, n_selected]); requires outputs within 1e-4 and equal bytes read.
void require_same_attention(const LayerKv& cpu, const LayerKv& gpu, int32_t head_dim,
                            const std::vector<int32_t>& q_positions, uint32_t seed,
                            const std::vector<int32_t>* pages = nullptr, int32_t n_selected = 0,
                            int32_t page_tokens = 0) {
  const int32_t n_queries = static_cast<int32_t>(q_positions.size());
  const int32_t n_heads = kKvHeads * kGroup;
  const auto q = random_floats(static_cast<size_t>(n_queries) * n_heads * head_dim, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> cpu_out(q.size(), 0.0f);
  const Device<float> dq(q), dout(cpu_out);
  const Device<int32_t> dq_positions(q_positions);
  const AttentionQuery cpu_query{q.data(), q_positions.data(), cpu_out.data(), n_queries, n_heads,
                                 scale};
  const AttentionQuery gpu_query{dq.get(), dq_positions.get(), dout.get(), n_queries, n_heads,
                                 scale};
  int64_t cpu_bytes = 0, gpu_bytes = 0;
  if (pages) {
    const Device<int32_t> dpages(*pages);
    const PageSelection cpu_pages{pages->data(), n_selected, page_tokens};
    const PageSelection gpu_pages{dpages.get(), n_selected, page_tokens};
    cpu_bytes = cpu.attend(cpu_query, &cpu_pages);
    gpu_bytes = gpu.attend(gpu_query, &gpu_pages);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  } else {
    cpu_bytes = cpu.attend(cpu_query, nullptr);
    gpu_bytes = gpu.attend(gpu_query, nullptr);
  }
  CHECK(gpu_bytes == cpu_bytes);
  const std::vector<float> gpu_out = dout.host();
  float max_diff = 0.0f;
  for (size_t i = 0; i < q.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(gpu_out[i] - cpu_out[i]));
  }
  CHECK(max_diff < 1e-4f);
}

void require_same_attention(const Twin& twin, const std::vector<int32_t>& q_positions,
                            uint32_t seed) {
  require_same_attention(twin.cpu, twin.gpu, twin.head_dim, q_positions, seed);
}

// The newest token's query, and queries that see only a prefix of the stored positions.
void require_same_decode(const Twin& twin, uint32_t seed) {
  require_same_attention(twin, {twin.next_position}, seed);
  require_same_attention(twin, {1, twin.next_position / 3, twin.next_position}, seed + 1);
}

// n_keep random slots per head, ascending (different per head: per-head eviction).
RetainPlan random_plan(int64_t n_tokens, int64_t n_keep, uint32_t seed) {
  std::mt19937 rng(seed);
  RetainPlan plan;
  plan.n_keep = n_keep;
  for (int32_t h = 0; h < kKvHeads; ++h) add_random_slots(plan, n_tokens, n_keep, rng);
  return plan;
}

RetainPlan prefix_plan(int64_t n_keep) {
  RetainPlan plan;
  plan.n_keep = n_keep;
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int32_t j = 0; j < n_keep; ++j) plan.slots.push_back(j);
  }
  return plan;
}

// `plan` with new contents for every kept slot (a merging method's).
RetainPlan merged(RetainPlan plan, int32_t head_dim, uint32_t seed) {
  plan.k = random_floats(plan.slots.size() * head_dim, seed);
  plan.v = random_floats(plan.slots.size() * head_dim, seed + 1);
  return plan;
}

// Applies `plan` to both stores (after a policy's look at their views when `look_first`):
// both place the kept tokens alike (each new slot j from an old slot >= j), and the device
// store's new slot j holds what its old slot plan.slots[h * n_keep + j] held.
void retain_both(LayerKv& cpu, LayerKv& gpu, const RetainPlan& plan, bool look_first) {
  HostView before;
  if (look_first) {
    cpu.view();
    before = host_view(gpu.view(), true);
  }
  RetainPlan cpu_plan = plan, gpu_plan = plan;
  cpu.retain(cpu_plan);
  gpu.retain(gpu_plan);
  REQUIRE(gpu_plan.slots == cpu_plan.slots);
  REQUIRE(gpu.n_tokens() == plan.n_keep);
  require_same_stores(cpu, gpu);
  const HostView after = host_view(gpu.view(), true);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int64_t j = 0; j < plan.n_keep; ++j) {
      const int32_t old_slot = gpu_plan.slots[h * plan.n_keep + j];
      REQUIRE(old_slot >= j);
      if (look_first) REQUIRE(after.position(h, j) == before.position(h, old_slot));
    }
  }
}

void retain_both(Twin& twin, const RetainPlan& plan, bool look_first) {
  retain_both(twin.cpu, twin.gpu, plan, look_first);
}

}  // namespace

TEST_CASE("cuda kivi store: appends, packing, views and attention equal the CPU store", "[gpu]") {
  require_device();
  for (int32_t bits : {2, 4}) {
    for (int32_t head_dim : {64, 128}) {
      for (int64_t residual : {128, 32, 0}) {
        INFO("bits " << bits << ", head_dim " << head_dim << ", residual " << residual);
        Twin twin(head_dim, kivi_config(bits, residual));
        CHECK(std::string(twin.gpu.tier()) == "device");
        CHECK(twin.gpu.bytes_resident() == 0);
        uint32_t seed = 100;
        // Odd chunks: some fill no block past the residual, some several, a decode step one.
        for (int64_t n_new : {1, 31, 33, 300, 1, 31, 1, 33}) {
          INFO("append of " << n_new << " to " << twin.gpu.n_tokens());
          // A forward: store the chunk, attend over it (nothing packed yet), then settle.
          const std::vector<int32_t> chunk = twin.append(n_new);
          require_same_attention(twin, chunk, seed++);
          {
            INFO("before settle");
            twin.require_same();
          }
          twin.settle();
          {
            INFO("after settle");
            twin.require_same();
          }
          require_same_decode(twin, seed);
          seed += 2;
        }
        CHECK(twin.gpu.n_blocks() > 0);
      }
    }
  }
}

TEST_CASE("cuda kivi store: reserve makes room in the tail as the CPU store does", "[gpu]") {
  require_device();
  Twin twin(64, kivi_config(2, 32));
  twin.cpu.reserve(500);
  twin.gpu.reserve(500);
  CHECK(twin.gpu.bytes_resident() == twin.cpu.bytes_resident());
  twin.append(450);
  twin.settle();
  twin.require_same();
  twin.cpu.reserve(600);  // room past the packed blocks
  twin.gpu.reserve(600);
  CHECK(twin.gpu.bytes_resident() == twin.cpu.bytes_resident());
  twin.append(150);
  twin.settle();
  twin.require_same();
  require_same_decode(twin, 1);
}

TEST_CASE("cuda kivi store: attention over selected pages equals the CPU store", "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    for (int64_t residual : {32, 128}) {
      INFO("head_dim " << head_dim << ", residual " << residual);
      Twin twin(head_dim, kivi_config(2, residual));
      uint32_t seed = 400;
      // 100 tokens: with residual 128 nothing is packed (the dense kernels read the pages).
      for (int64_t total : {100, 332}) {
        std::vector<int32_t> chunk = twin.append(total - twin.gpu.n_tokens());
        twin.settle();
        INFO(twin.gpu.n_blocks() << " blocks, " << twin.gpu.n_tokens() << " tokens");
        for (int32_t page_tokens : {16, 7, 32, 48}) {
          const int64_t n_pages = pages_of(twin.gpu.n_tokens(), page_tokens);
          for (Pick pick : {Pick::Last, Pick::All, Pick::Random, Pick::Alternate}) {
            INFO("page_tokens " << page_tokens << ", pick " << static_cast<int>(pick));
            int n_selected = 0;
            const std::vector<int32_t> pages =
                pick_pages(pick, kKvHeads, n_pages, seed++, n_selected);
            require_same_attention(twin.cpu, twin.gpu, head_dim, {twin.next_position}, seed++,
                                   &pages, n_selected, page_tokens);
            require_same_attention(twin.cpu, twin.gpu, head_dim, chunk, seed++, &pages,
                                   n_selected, page_tokens);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda kivi store: retain repacks what it touches and frees as the CPU store", "[gpu]") {
  require_device();
  for (int32_t bits : {2, 4}) {
    for (int32_t head_dim : {64, 128}) {
      for (int64_t residual : {32, 128}) {
        INFO("bits " << bits << ", head_dim " << head_dim << ", residual " << residual);
        Twin twin(head_dim, kivi_config(bits, residual));
        uint32_t seed = 1000;
        // A chunked prefill under a policy: no settle between the chunks.
        twin.append(300);
        twin.append(33);
        twin.settle();
        twin.require_same();
        REQUIRE(twin.gpu.n_blocks() > 0);

        // A compression, different per head, after the policy looked.
        int64_t n = twin.gpu.n_tokens();
        retain_both(twin, random_plan(n, n * 6 / 10, seed++), true);
        require_same_decode(twin, seed++);
        std::vector<int32_t> chunk = twin.append(31);
        require_same_attention(twin, chunk, seed++);
        twin.settle();
        twin.require_same();

        // Decode steps evicting one token each, with and without a look first.
        for (int step = 0; step < 4; ++step) {
          INFO("decode step " << step);
          chunk = twin.append(1);
          require_same_attention(twin, chunk, seed++);
          n = twin.gpu.n_tokens();
          retain_both(twin, random_plan(n, n - 1, seed++), step % 2 == 0);
          twin.settle();
          twin.require_same();
        }

        // A prefix: nothing moves, blocks past it drop.
        retain_both(twin, prefix_plan(twin.gpu.n_tokens() - 40), false);
        require_same_decode(twin, seed++);

        // Merged contents: every block kept is packed again, also where no slot moved.
        retain_both(twin, merged(prefix_plan(twin.gpu.n_tokens() - 3), head_dim, seed++), false);
        require_same_decode(twin, seed++);
        n = twin.gpu.n_tokens();
        retain_both(twin, merged(random_plan(n, n - 20, seed), head_dim, seed + 1), true);
        seed += 2;
        require_same_decode(twin, seed++);
        twin.append(33);
        twin.settle();
        twin.require_same();

        // Fewer than a block kept: everything in the fp32 tail.
        retain_both(twin, random_plan(twin.gpu.n_tokens(), 20, seed++), false);
        CHECK(twin.gpu.n_blocks() == 0);
        require_same_decode(twin, seed++);
        chunk = twin.append(300);
        require_same_attention(twin, chunk, seed++);
        twin.settle();
        twin.require_same();
        require_same_decode(twin, seed++);

        // Everything dropped, then filled again.
        retain_both(twin, RetainPlan{}, true);
        CHECK(twin.gpu.n_tokens() == 0);
        twin.append(300);
        twin.settle();
        twin.require_same();
        require_same_decode(twin, seed++);
      }
    }
  }
}

TEST_CASE("cuda kivi store: a decode-step eviction within the tail leaves the blocks as packed",
          "[gpu]") {
  require_device();
  for (KiviTail tail : {KiviTail::Kivi, KiviTail::Block}) {
    for (int64_t residual : {32, 128}) {
      INFO("tail " << static_cast<int>(tail) << ", residual " << residual);
      KiviConfig config = kivi_config(2, residual);
      config.tail = tail;
      Twin twin(64, config);
      uint32_t seed = 1500;
      twin.append(400);
      twin.settle();
      REQUIRE(twin.gpu.n_blocks() > 0);
      std::mt19937 rng(seed++);
      for (int step = 0; step < 40; ++step) {  // past a block's worth: packing goes on between
        INFO("decode step " << step);
        twin.append(1);
        const int64_t n = twin.gpu.n_tokens(), packed = twin.gpu.n_blocks() * 32;
        const int64_t tail_tokens = n - packed;
        // Per head one tail slot dropped: a random one, the first, the newest.
        const std::vector<int64_t> dropped = {packed + static_cast<int64_t>(rng() % tail_tokens),
                                              packed, n - 1};
        RetainPlan plan;
        plan.n_keep = n - 1;
        for (int32_t h = 0; h < kKvHeads; ++h) {
          for (int32_t t = 0; t < n; ++t) {
            if (t != dropped[h]) plan.slots.push_back(t);
          }
        }
        const int64_t blocks = twin.gpu.n_blocks();
        const uint8_t* codes = twin.gpu.layout().k_codes;
        retain_both(twin, plan, step % 3 == 0);
        CHECK(twin.gpu.n_blocks() == blocks);
        CHECK(twin.gpu.layout().k_codes == codes);  // the blocks stay where they are
        twin.settle();
        twin.require_same();
        require_same_attention(twin, {twin.next_position}, seed++);
      }
    }
  }
}

TEST_CASE("cuda kivi store: retain while nothing is packed works on the fp32 tail", "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    Twin twin(head_dim, kivi_config(2, 128));
    uint32_t seed = 2000;
    twin.append(140);  // a prefill under a policy: not settled before its plan
    REQUIRE(twin.gpu.n_blocks() == 0);
    retain_both(twin, random_plan(140, 100, seed++), true);  // the capacity is kept
    require_same_decode(twin, seed++);
    retain_both(twin, prefix_plan(90), false);
    retain_both(twin, merged(prefix_plan(90), head_dim, seed++), false);
    retain_both(twin, merged(random_plan(90, 60, seed), head_dim, seed + 1), false);
    seed += 2;
    require_same_decode(twin, seed++);
    twin.append(500);  // a longer tail, then a compression that gives the room back
    retain_both(twin, random_plan(twin.gpu.n_tokens(), 50, seed++), false);
    require_same_decode(twin, seed++);
    twin.settle();
    twin.require_same();
    twin.append(300);
    twin.settle();
    twin.require_same();
    require_same_decode(twin, seed++);
  }
}

TEST_CASE("cuda kivi store: a clone is a deep copy the original does not share", "[gpu]") {
  require_device();
  Twin twin(128, kivi_config(2, 32));
  twin.append(300);
  twin.settle();
  twin.append(1);
  twin.settle();
  // Block room past the blocks in use: a copy holds only those (as KiviLayerKv's does).
  std::unique_ptr<LayerKv> gpu_copy = twin.gpu.clone();
  std::unique_ptr<LayerKv> cpu_copy = twin.cpu.clone();
  CHECK(std::string(gpu_copy->tier()) == "device");
  CHECK(gpu_copy->bytes_resident() == cpu_copy->bytes_resident());
  require_same_stores(*cpu_copy, *gpu_copy);
  REQUIRE(gpu_copy->view().k != twin.gpu.view().k);
  cpu_copy->view();  // both pairs hold their views, so their bytes still compare
  twin.cpu.view();
  const HostView original = host_view(twin.gpu.view(), true);

  // Mutate the copies: appends (a block packed, the room restored), a retain, more appends.
  int32_t position = 100000;
  uint32_t seed = 3000;
  for (int64_t n_new : {int64_t{33}, int64_t{300}}) {
    append_both(*cpu_copy, *gpu_copy, 128, n_new, position, seed++);
    position += 2 * static_cast<int32_t>(n_new);
    cpu_copy->settle();
    gpu_copy->settle();
    require_same_stores(*cpu_copy, *gpu_copy);
  }
  retain_both(*cpu_copy, *gpu_copy, random_plan(gpu_copy->n_tokens(), 250, seed++), true);
  require_same_attention(*cpu_copy, *gpu_copy, 128, {position}, seed++);

  // The original still holds what it held.
  require_same_views(original, host_view(twin.gpu.view(), true));
  twin.require_same();
  require_same_decode(twin, seed++);
}

TEST_CASE("cuda kivi store: a malformed plan or config throws before anything changes",
          "[gpu]") {
  require_device();
  CHECK_THROWS_AS(CudaKiviLayerKv(kKvHeads, 64, kivi_config(3, 128)), std::invalid_argument);
  CHECK_THROWS_AS(CudaKiviLayerKv(kKvHeads, 48, kivi_config(2, 128)), std::invalid_argument);
  Twin twin(64, kivi_config(2, 32));
  twin.append(100);
  twin.settle();
  RetainPlan descending = random_plan(100, 5, 700);
  std::swap(descending.slots[0], descending.slots[1]);
  CHECK_THROWS_AS(twin.gpu.retain(descending), std::invalid_argument);
  RetainPlan past_end = random_plan(100, 5, 701);
  past_end.slots.back() = 100;
  CHECK_THROWS_AS(twin.gpu.retain(past_end), std::invalid_argument);
  RetainPlan short_merge = random_plan(100, 5, 702);
  short_merge.k.assign(3, 0.0f);
  short_merge.v.assign(3, 0.0f);
  CHECK_THROWS_AS(twin.gpu.retain(short_merge), std::invalid_argument);
  RetainPlan too_many = random_plan(100, 5, 703);
  too_many.n_keep = 101;
  CHECK_THROWS_AS(twin.gpu.retain(too_many), std::invalid_argument);
  twin.require_same();
}

TEST_CASE("cuda kivi store: whole caches equal the CPU's (kivi, snapkv+kivi, quest+kivi)",
          "[gpu]") {
  require_device();
  // Three layers: Quest reads pages from layer 2 on (its first two are dense).
  const KvShape shape{3, kKvHeads, 64};
  const int32_t n_heads = kKvHeads * kGroup;
  for (const std::string spec :
       {"kivi:bits=2,residual=32", "snapkv:budget=256,window=16+kivi:bits=4",
        "quest:budget=64+kivi:bits=4,residual=32"}) {
    INFO(spec);
    const ResolvedSpec resolved = resolve_method_spec(spec);
    KvCache cpu = make_cache(resolved, shape);
    // The device cache as a --device cuda run builds it: the spec's policy and reader on host
    // copies, the KIVI stores on the device.
    REQUIRE(resolved.find(MethodKind::Storage) != nullptr);
    KvCache gpu = make_cuda_cache(resolved, shape);

    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.f, 1.f);
    const auto forward = [&](int64_t n) {
      std::vector<int32_t> positions(static_cast<size_t>(n));
      std::iota(positions.begin(), positions.end(), cpu.next_position());
      const Device<int32_t> dpositions(positions);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
      const int32_t n_queries = static_cast<int32_t>(n);
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        std::vector<float> k(n * kKvHeads * shape.head_dim), v(k.size());
        std::vector<float> q(n * n_heads * shape.head_dim), cpu_out(q.size(), 0.0f);
        for (auto* x : {&k, &v, &q}) {
          for (float& f : *x) f = dist(rng);
        }
        const Device<float> dk(k), dv(v), dq(q), dout(cpu_out);
        cpu.append(l, k.data(), v.data(), positions.data(), n);
        gpu.append(l, dk.get(), dv.get(), dpositions.get(), n);
        cpu.attend(l, AttentionQuery{q.data(), positions.data(), cpu_out.data(), n_queries,
                                     n_heads, scale});
        gpu.attend(l, AttentionQuery{dq.get(), dpositions.get(), dout.get(), n_queries, n_heads,
                                     scale});
        const std::vector<float> gpu_out = dout.host();
        float max_diff = 0.0f;
        for (size_t i = 0; i < q.size(); ++i) {
          max_diff = std::max(max_diff, std::abs(gpu_out[i] - cpu_out[i]));
        }
        CHECK(max_diff < 1e-4f);
      }
      cpu.advance(n_queries);
      gpu.advance(n_queries);
    };
    const auto require_same_stats = [&] {
      const CacheStats a = cpu.stats(), b = gpu.stats();
      CHECK(b.tokens_per_layer == a.tokens_per_layer);
      CHECK(b.bytes_per_layer == a.bytes_per_layer);
      CHECK(b.bytes_read_last_forward == a.bytes_read_last_forward);
      // The stores' bytes in device memory; policy state and Quest's page bounds on the host.
      int64_t store_bytes = 0;
      for (int32_t l = 0; l < shape.n_layers; ++l) store_bytes += gpu.layer(l).bytes_resident();
      int64_t device = 0, ram = 0;
      for (const TierBytes& tier : b.tiers) (tier.tier == "device" ? device : ram) += tier.bytes;
      CHECK(device == store_bytes);
      CHECK(device + ram == a.bytes_resident);
      CHECK(b.bytes_resident == a.bytes_resident);
    };
    for (int64_t n : {300, 333}) {  // the context, in two chunks
      forward(n);
      require_same_stats();
    }
    cpu.end_context();
    gpu.end_context();
    require_same_stats();
    for (int step = 0; step < 40; ++step) {  // decode steps: a block packed on the way
      forward(1);
      require_same_stats();
    }
    for (int32_t l = 0; l < shape.n_layers; ++l) require_same_stores(cpu.layer(l), gpu.layer(l));
    KvCache branch = gpu.clone();
    CHECK(branch.bytes_resident() == cpu.clone().bytes_resident());
  }
}
