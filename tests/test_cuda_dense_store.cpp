// The device dense store against the CPU one (DenseLayerKv) fed the same tokens: contents,
// growth and bytes, attention (dense and paged) and the bytes it reports, retain plans (random,
// decode-step, prefix, merged), appends after them, clones, and the whole-cache factory. Both
// stores place kept tokens alike (each hole filled from the tail), so one plan serves both, the
// placements they return are equal and their rows compare slot by slot, bit for bit. A
// decode-step eviction is applied in place on the device (the buffers stay), a compression
// into fresh buffers.
// Without a CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cache/cuda/dense_store.h"
#include "cache/full_cache.h"
#include "cuda_device.h"
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

using kvbench::testing::download;

// A store's rows on the host, whichever memory it keeps them in.
struct HostRows {
  int32_t head_dim = 0;
  int64_t capacity = 0, n_tokens = 0;
  std::vector<float> k, v;
  std::vector<int32_t> positions;

  std::vector<float> key(int32_t h, int64_t t) const { return row(k, h, t); }
  std::vector<float> value(int32_t h, int64_t t) const { return row(v, h, t); }
  int32_t position(int32_t h, int64_t t) const { return positions[h * capacity + t]; }

 private:
  std::vector<float> row(const std::vector<float>& x, int32_t h, int64_t t) const {
    const auto first = x.begin() + (h * capacity + t) * head_dim;
    return std::vector<float>(first, first + head_dim);
  }
};

HostRows host_rows(const DenseKv& kv, bool on_device) {
  HostRows rows;
  rows.head_dim = kv.head_dim;
  rows.capacity = kv.capacity;
  rows.n_tokens = kv.n_tokens;
  const int64_t slots = kv.n_kv_heads * kv.capacity;
  if (on_device) {
    rows.k = download(kv.k, slots * kv.head_dim);
    rows.v = download(kv.v, slots * kv.head_dim);
    rows.positions = download(kv.positions, slots);
  } else {
    rows.k.assign(kv.k, kv.k + slots * kv.head_dim);
    rows.v.assign(kv.v, kv.v + slots * kv.head_dim);
    rows.positions.assign(kv.positions, kv.positions + slots);
  }
  return rows;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Both stores hold the same tokens in the same slots: keys and values bit for bit, positions.
void require_same_tokens(const LayerKv& cpu, const LayerKv& gpu) {
  REQUIRE(gpu.n_tokens() == cpu.n_tokens());
  const HostRows a = host_rows(cpu.view(), false);
  const HostRows b = host_rows(gpu.view(), true);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      REQUIRE(b.position(h, t) == a.position(h, t));
      REQUIRE(same_bits(b.key(h, t), a.key(h, t)));
      REQUIRE(same_bits(b.value(h, t), a.value(h, t)));
    }
  }
}

int64_t bytes_at(int64_t capacity, int32_t head_dim) {
  return kKvHeads * capacity * (2 * head_dim * static_cast<int64_t>(sizeof(float)) + 4);
}

// A DenseLayerKv and a CudaDenseLayerKv fed the same tokens.
struct Twin {
  int32_t head_dim;
  DenseLayerKv cpu;
  CudaDenseLayerKv gpu;
  int32_t next_position = 0;
  uint32_t seed = 1;

  explicit Twin(int32_t d) : head_dim(d), cpu(kKvHeads, d), gpu(kKvHeads, d) {}

  // Appends n_new random tokens at the next positions (spaced 2 apart so they are no slot
  // numbers in disguise); returns their positions.
  std::vector<int32_t> append(int64_t n_new) {
    const auto k = random_floats(n_new * kKvHeads * head_dim, seed++);
    const auto v = random_floats(n_new * kKvHeads * head_dim, seed++);
    std::vector<int32_t> positions(static_cast<size_t>(n_new));
    for (auto& p : positions) p = (next_position += 2);
    cpu.append(k.data(), v.data(), positions.data(), n_new);
    const Device<float> dk(k), dv(v);
    const Device<int32_t> dp(positions);
    gpu.append(dk.get(), dv.get(), dp.get(), n_new);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return positions;
  }

  void require_same() const {
    require_same_tokens(cpu, gpu);
    CHECK(gpu.capacity() == cpu.capacity());
    CHECK(gpu.bytes_resident() == cpu.bytes_resident());
    CHECK(gpu.bytes_resident() == bytes_at(gpu.capacity(), head_dim));
  }
};

// Runs the same queries (at q_positions) through both stores, optionally over the same pages
// ([kKvHeads, n_selected]); requires equal outputs and equal bytes read.
void require_same_attention(const Twin& twin, const std::vector<int32_t>& q_positions,
                            uint32_t seed, const std::vector<int32_t>* pages = nullptr,
                            int32_t n_selected = 0, int32_t page_tokens = 0) {
  const int32_t n_queries = static_cast<int32_t>(q_positions.size());
  const int32_t n_heads = kKvHeads * kGroup;
  const auto q = random_floats(static_cast<size_t>(n_queries) * n_heads * twin.head_dim, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(twin.head_dim));
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
    cpu_bytes = twin.cpu.attend(cpu_query, &cpu_pages);
    gpu_bytes = twin.gpu.attend(gpu_query, &gpu_pages);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  } else {
    cpu_bytes = twin.cpu.attend(cpu_query, nullptr);
    gpu_bytes = twin.gpu.attend(gpu_query, nullptr);
  }
  CHECK(gpu_bytes == cpu_bytes);
  const std::vector<float> gpu_out = dout.host();
  float max_diff = 0.0f;
  for (size_t i = 0; i < q.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(gpu_out[i] - cpu_out[i]));
  }
  CHECK(max_diff < 1e-4f);
}

// n_keep random slots per head, ascending (different per head: per-head eviction).
RetainPlan random_plan(int64_t n_tokens, int64_t n_keep, uint32_t seed) {
  std::mt19937 rng(seed);
  RetainPlan plan;
  plan.n_keep = n_keep;
  for (int32_t h = 0; h < kKvHeads; ++h) add_random_slots(plan, n_tokens, n_keep, rng);
  return plan;
}

// Applies `plan` to both stores: they return the same placement (each new slot j holds old slot
// plan.slots[h * n_keep + j] >= j, with its position and its key and value, or the merged
// ones) and then hold the same rows.
void retain_both(Twin& twin, const RetainPlan& plan) {
  const HostRows before = host_rows(twin.gpu.view(), true);
  RetainPlan cpu_plan = plan, gpu_plan = plan;
  twin.cpu.retain(cpu_plan);
  twin.gpu.retain(gpu_plan);
  REQUIRE(gpu_plan.slots == cpu_plan.slots);
  const HostRows after = host_rows(twin.gpu.view(), true);
  REQUIRE(after.n_tokens == plan.n_keep);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    const int32_t* planned = plan.slots.data() + h * plan.n_keep;
    for (int64_t j = 0; j < plan.n_keep; ++j) {
      const size_t i = static_cast<size_t>(h * plan.n_keep + j);
      const int32_t old_slot = gpu_plan.slots[i];
      REQUIRE(old_slot >= j);
      REQUIRE(after.position(h, j) == before.position(h, old_slot));
      if (plan.k.empty()) {
        REQUIRE(same_bits(after.key(h, j), before.key(h, old_slot)));
        REQUIRE(same_bits(after.value(h, j), before.value(h, old_slot)));
      } else {  // the merged row planned for that slot
        const int64_t row = h * plan.n_keep +
                            (std::lower_bound(planned, planned + plan.n_keep, old_slot) - planned);
        const auto merged = plan.k.begin() + row * twin.head_dim;
        REQUIRE(same_bits(after.key(h, j), std::vector<float>(merged, merged + twin.head_dim)));
        const auto merged_v = plan.v.begin() + row * twin.head_dim;
        REQUIRE(
            same_bits(after.value(h, j), std::vector<float>(merged_v, merged_v + twin.head_dim)));
      }
    }
  }
  twin.require_same();
}

}  // namespace

TEST_CASE("cuda dense store: appends, growth and attention equal the CPU store", "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    Twin twin(head_dim);
    CHECK(twin.gpu.n_tokens() == 0);
    CHECK(twin.gpu.bytes_resident() == 0);
    uint32_t seed = 100;
    // 1 and 7 fit the first allocation; 300 grows it, the last ones grow it again or not.
    for (int64_t n_new : {1, 7, 300, 1, 7, 1}) {
      INFO("append of " << n_new);
      const std::vector<int32_t> chunk = twin.append(n_new);
      twin.require_same();
      require_same_attention(twin, chunk, seed++);  // the chunk's causal queries
      // Queries between the stored positions see only a prefix of the keys.
      require_same_attention(twin, {3, 2 * twin.next_position / 3 + 1, twin.next_position}, seed++);
    }
  }
}

TEST_CASE("cuda dense store: reserve allocates once, bytes follow capacity", "[gpu]") {
  require_device();
  Twin twin(64);
  twin.gpu.reserve(500);
  twin.cpu.reserve(500);
  CHECK(twin.gpu.capacity() == 500);
  CHECK(twin.gpu.bytes_resident() == bytes_at(500, 64));
  const float* buffer = twin.gpu.view().k;
  twin.append(300);
  twin.append(200);
  CHECK(twin.gpu.view().k == buffer);  // no reallocation within the reserved room
  twin.gpu.reserve(100);               // smaller: nothing changes
  twin.cpu.reserve(100);
  CHECK(twin.gpu.view().k == buffer);
  twin.require_same();
  twin.append(1);  // past the room: geometric growth, as the CPU store
  twin.require_same();
}

TEST_CASE("cuda dense store: retain places the kept slots and frees like the CPU", "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    Twin twin(head_dim);
    for (int64_t n_new : {1, 7, 300}) twin.append(n_new);
    uint32_t seed = 200;

    // A compression: capacity cut to what is kept, as the CPU store does.
    retain_both(twin, random_plan(twin.gpu.n_tokens(), 120, seed++));
    CHECK(twin.gpu.capacity() == 120);
    require_same_attention(twin, {twin.next_position}, seed++);

    // Appends after the retain grow by the slack; queries see old and new tokens.
    std::vector<int32_t> chunk = twin.append(7);
    CHECK(twin.gpu.capacity() == 127 + kEvictionSlack);
    twin.require_same();
    require_same_attention(twin, chunk, seed++);

    // Decode-step evictions: one in, one out, the capacity kept.
    for (int step = 0; step < 3; ++step) {
      chunk = twin.append(1);
      retain_both(twin, random_plan(twin.gpu.n_tokens(), twin.gpu.n_tokens() - 1, seed++));
      CHECK(twin.gpu.capacity() == 127 + kEvictionSlack);
      require_same_attention(twin, chunk, seed++);
    }

    // Plans keeping each head's first slots move nothing: within the slack the buffers stay,
    // past it they shrink to what is kept.
    auto prefix = [](int64_t n_keep) {
      RetainPlan plan;
      plan.n_keep = n_keep;
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int32_t j = 0; j < n_keep; ++j) plan.slots.push_back(j);
      }
      return plan;
    };
    const float* buffer = twin.gpu.view().k;
    retain_both(twin, prefix(100));  // 91 idle: kept
    CHECK(twin.gpu.capacity() == 127 + kEvictionSlack);
    CHECK(twin.gpu.view().k == buffer);
    require_same_attention(twin, {twin.next_position}, seed++);
    retain_both(twin, prefix(50));  // 141 idle: cut
    CHECK(twin.gpu.capacity() == 50);
    require_same_attention(twin, twin.append(300), seed++);
    twin.require_same();

    // Everything dropped, then filled again.
    RetainPlan none;
    retain_both(twin, none);
    CHECK(twin.gpu.bytes_resident() == 0);
    require_same_attention(twin, twin.append(7), seed++);
    twin.require_same();
  }
}

TEST_CASE("cuda dense store: merged contents replace the kept slots' keys and values", "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    Twin twin(head_dim);
    for (int64_t n_new : {300, 7}) twin.append(n_new);
    uint32_t seed = 300;
    for (int64_t n_drop : {int64_t{157}, int64_t{1}}) {  // a compression, then a decode step
      INFO("n_drop " << n_drop);
      const int64_t n_keep = twin.gpu.n_tokens() - n_drop;
      RetainPlan plan = random_plan(twin.gpu.n_tokens(), n_keep, seed++);
      plan.k = random_floats(plan.slots.size() * head_dim, seed++);
      plan.v = random_floats(plan.slots.size() * head_dim, seed++);
      retain_both(twin, plan);
      require_same_attention(twin, twin.append(1), seed++);
    }
  }
}

// Every slot but dropped[h] of head h, for each head.
RetainPlan drop_per_head(int64_t n_tokens, const std::vector<std::vector<int32_t>>& dropped) {
  RetainPlan plan;
  plan.n_keep = n_tokens - static_cast<int64_t>(dropped[0].size());
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int32_t t = 0; t < n_tokens; ++t) {
      if (std::find(dropped[h].begin(), dropped[h].end(), t) == dropped[h].end()) {
        plan.slots.push_back(t);
      }
    }
  }
  return plan;
}

TEST_CASE("cuda dense store: a decode-step eviction moves rows in place, a compression reallocates",
          "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128, 6}) {  // 6: rows the kernel copies float by float
    INFO("head_dim " << head_dim);
    Twin twin(head_dim);
    twin.append(300);
    retain_both(twin, random_plan(twin.gpu.n_tokens(), 200, 900));
    twin.append(1);  // grows by the slack: room for the decode steps
    const int64_t capacity = twin.gpu.capacity();
    const int64_t bytes = twin.gpu.bytes_resident();
    const float* k = twin.gpu.view().k;
    const float* v = twin.gpu.view().v;
    const int32_t* positions = twin.gpu.view().positions;
    std::mt19937 rng(901);
    uint32_t seed = 902;
    for (int step = 0; step < 24; ++step) {
      INFO("step " << step);
      std::vector<int32_t> chunk = twin.append(1);
      const int32_t n = static_cast<int32_t>(twin.gpu.n_tokens());
      // Per head: a random slot, the oldest (every later hole-filler moves), the newest (no
      // move at all); a few steps drop five, or merge.
      const int32_t random_slot = static_cast<int32_t>(rng() % n);
      std::vector<std::vector<int32_t>> dropped = {{random_slot}, {0}, {n - 1}};
      if (step % 8 == 3) {
        dropped = {{1, 5, 9, n - 2, n - 1}, {0, 1, 2, 3, 4}, {n - 5, 7, 8, 20, 40}};
      }
      RetainPlan plan = drop_per_head(n, dropped);
      if (step % 8 == 5) {
        plan.k = random_floats(plan.slots.size() * head_dim, seed++);
        plan.v = random_floats(plan.slots.size() * head_dim, seed++);
      }
      retain_both(twin, plan);
      // In place: the same buffers, the same capacity and bytes.
      CHECK(twin.gpu.view().k == k);
      CHECK(twin.gpu.view().v == v);
      CHECK(twin.gpu.view().positions == positions);
      CHECK(twin.gpu.capacity() == capacity);
      CHECK(twin.gpu.bytes_resident() == bytes);
      if (head_dim != 6) require_same_attention(twin, chunk, seed++);
    }
    // A compression gives the memory back: fresh buffers of what is kept.
    const int64_t n_keep = twin.gpu.n_tokens() / 2;
    retain_both(twin, random_plan(twin.gpu.n_tokens(), n_keep, seed++));
    CHECK(twin.gpu.view().k != k);
    CHECK(twin.gpu.capacity() == n_keep);
    CHECK(twin.gpu.bytes_resident() == bytes_at(n_keep, head_dim));
    if (head_dim != 6) require_same_attention(twin, twin.append(1), seed++);
  }
}

TEST_CASE("cuda dense store: attention over selected pages equals the CPU store", "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    Twin twin(head_dim);
    std::vector<int32_t> chunk;
    for (int64_t n_new : {1, 7, 300}) chunk = twin.append(n_new);  // 308: a partial last page
    uint32_t seed = 400;
    for (int32_t page_tokens : {16, 7}) {
      const int64_t n_pages = pages_of(twin.gpu.n_tokens(), page_tokens);
      for (Pick pick : {Pick::Last, Pick::All, Pick::Random, Pick::Alternate}) {
        INFO("page_tokens " << page_tokens << ", pick " << static_cast<int>(pick));
        int n_selected = 0;
        const std::vector<int32_t> pages = pick_pages(pick, kKvHeads, n_pages, seed++, n_selected);
        require_same_attention(twin, {twin.next_position}, seed++, &pages, n_selected, page_tokens);
        require_same_attention(twin, chunk, seed++, &pages, n_selected, page_tokens);
      }
    }
  }
}

TEST_CASE("cuda dense store: a clone is a deep copy the original does not share", "[gpu]") {
  require_device();
  Twin twin(128);
  for (int64_t n_new : {7, 300}) twin.append(n_new);
  retain_both(twin, random_plan(twin.gpu.n_tokens(), 200, 500));
  twin.append(1);

  const HostRows original = host_rows(twin.gpu.view(), true);
  std::unique_ptr<LayerKv> gpu_copy = twin.gpu.clone();
  std::unique_ptr<LayerKv> cpu_copy = twin.cpu.clone();
  REQUIRE(gpu_copy->view().k != twin.gpu.view().k);
  CHECK(gpu_copy->bytes_resident() == twin.gpu.bytes_resident());
  require_same_tokens(*cpu_copy, *gpu_copy);

  // Mutate the copies: appends (one growing them, by the slack: the clone knows it evicted),
  // then a retain.
  int32_t next_position = 100000;
  for (int64_t n_new : {7, 300}) {
    const auto k = random_floats(n_new * kKvHeads * 128, 600 + n_new);
    std::vector<int32_t> positions(static_cast<size_t>(n_new));
    for (auto& p : positions) p = next_position++;
    cpu_copy->append(k.data(), k.data(), positions.data(), n_new);
    const Device<float> dk(k);
    const Device<int32_t> dp(positions);
    gpu_copy->append(dk.get(), dk.get(), dp.get(), n_new);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  CHECK(gpu_copy->bytes_resident() == cpu_copy->bytes_resident());
  RetainPlan gpu_plan = random_plan(gpu_copy->n_tokens(), 250, 601), cpu_plan = gpu_plan;
  cpu_copy->retain(cpu_plan);
  gpu_copy->retain(gpu_plan);
  require_same_tokens(*cpu_copy, *gpu_copy);

  // The original still holds what it held, where it held it (rows in use only: the slack is
  // uninitialised device memory).
  const HostRows now = host_rows(twin.gpu.view(), true);
  REQUIRE(now.n_tokens == original.n_tokens);
  REQUIRE(now.capacity == original.capacity);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int64_t t = 0; t < now.n_tokens; ++t) {
      REQUIRE(now.position(h, t) == original.position(h, t));
      REQUIRE(now.key(h, t) == original.key(h, t));
      REQUIRE(now.value(h, t) == original.value(h, t));
    }
  }
  twin.require_same();
}

// Each head's rows on the host, whichever store holds them (ragged or not).
std::vector<HostRows> head_rows(const LayerKv& store, bool on_device) {
  std::vector<HostRows> heads;
  for (int32_t h = 0; h < kKvHeads; ++h) {
    const DenseKv one = on_device ? static_cast<const CudaDenseLayerKv&>(store).head_view(h)
                                  : static_cast<const DenseLayerKv&>(store).head_view(h);
    heads.push_back(host_rows(one, on_device));
  }
  return heads;
}

// Both stores hold, head by head, the same count of tokens in the same slots, bit for bit.
void require_same_heads(const LayerKv& cpu, const LayerKv& gpu) {
  REQUIRE(gpu.n_tokens() == cpu.n_tokens());
  const std::vector<HostRows> a = head_rows(cpu, false), b = head_rows(gpu, true);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    INFO("head " << h);
    REQUIRE(gpu.head_tokens(h) == cpu.head_tokens(h));
    REQUIRE(b[h].n_tokens == a[h].n_tokens);
    for (int64_t t = 0; t < a[h].n_tokens; ++t) {
      REQUIRE(b[h].position(0, t) == a[h].position(0, t));
      REQUIRE(same_bits(b[h].key(0, t), a[h].key(0, t)));
      REQUIRE(same_bits(b[h].value(0, t), a[h].value(0, t)));
    }
  }
  CHECK(gpu.bytes_resident() == cpu.bytes_resident());
}

// A plan keeping head_keep[h] random slots of head h (ascending).
RetainPlan ragged_plan(int64_t n_tokens, const std::vector<int64_t>& head_keep, uint32_t seed) {
  std::mt19937 rng(seed);
  RetainPlan plan;
  plan.head_keep = head_keep;
  plan.n_keep = *std::max_element(head_keep.begin(), head_keep.end());
  for (int64_t n_keep : head_keep) add_random_slots(plan, n_tokens, n_keep, rng);
  return plan;
}

TEST_CASE("cuda dense store: heads of their own hold, attend and free as the CPU store's",
          "[gpu]") {
  require_device();
  for (int32_t head_dim : {64, 128}) {
    INFO("head_dim " << head_dim);
    Twin twin(head_dim);
    twin.append(7);
    twin.append(300);
    const int64_t full_bytes = twin.gpu.bytes_resident();
    // A ragged compression: every head its own count, one head almost nothing.
    RetainPlan cpu_plan = ragged_plan(twin.gpu.n_tokens(), {250, 3, 120}, 900), gpu_plan = cpu_plan;
    twin.cpu.retain(cpu_plan);
    twin.gpu.retain(gpu_plan);
    CHECK(gpu_plan.slots == cpu_plan.slots);
    REQUIRE(twin.gpu.ragged());
    CHECK(twin.gpu.view().k == nullptr);  // the shape alone, as the CPU store shows it
    CHECK(twin.gpu.n_tokens() == 250);
    require_same_heads(twin.cpu, twin.gpu);
    // Bytes are the sum over heads: each sized to its own count.
    CHECK(twin.gpu.bytes_resident() == (250 + 3 + 120) * (2 * head_dim * 4 + 4));
    CHECK(twin.gpu.bytes_resident() < full_bytes);
    // Attention over heads of different lengths, prefill-like chunk and decode rows.
    uint32_t seed = 950;
    for (int64_t n_new : {1, 5, 1, 70}) {  // 70 grows every head past its exact size
      const std::vector<int32_t> chunk = twin.append(n_new);
      require_same_heads(twin.cpu, twin.gpu);
      require_same_attention(twin, chunk, seed++);
      require_same_attention(twin, {5, twin.next_position / 2, twin.next_position}, seed++);
    }
    // A later plan, uniform or ragged, applies per head and hands back each head's placement.
    RetainPlan again = ragged_plan(twin.gpu.head_tokens(1), {10, 4, 60}, 960);
    for (int32_t h = 0; h < kKvHeads; ++h) {  // slots below every head's count
      for (int64_t j = 0; j < again.kept(h); ++j) {
        CHECK(again.slots[again.head_offset(h) + j] < twin.gpu.head_tokens(h));
      }
    }
    RetainPlan cpu_again = again;
    twin.cpu.retain(cpu_again);
    twin.gpu.retain(again);
    CHECK(again.slots == cpu_again.slots);
    require_same_heads(twin.cpu, twin.gpu);
    require_same_attention(twin, {twin.next_position}, seed++);
    // A clone is deep: the original keeps its rows when the copy changes.
    std::unique_ptr<LayerKv> copy = twin.gpu.clone();
    RetainPlan drop = ragged_plan(copy->head_tokens(1), {1, 1, 1}, 970);
    copy->retain(drop);
    CHECK(copy->n_tokens() == 1);
    require_same_heads(twin.cpu, twin.gpu);
    // Pages over heads of their own are refused, as on the CPU.
    const std::vector<int32_t> pages(kKvHeads, 0);
    CHECK_THROWS_AS(require_same_attention(twin, {twin.next_position}, seed++, &pages, 1, 16),
                    std::logic_error);
  }
}

TEST_CASE("cuda dense store: a malformed plan throws before anything changes", "[gpu]") {
  require_device();
  Twin twin(64);
  twin.append(20);
  RetainPlan descending = random_plan(20, 5, 700);
  std::swap(descending.slots[0], descending.slots[1]);
  CHECK_THROWS_AS(twin.gpu.retain(descending), std::invalid_argument);
  RetainPlan past_end = random_plan(20, 5, 701);
  past_end.slots.back() = 20;
  CHECK_THROWS_AS(twin.gpu.retain(past_end), std::invalid_argument);
  RetainPlan short_merge = random_plan(20, 5, 702);
  short_merge.k.assign(3, 0.0f);
  short_merge.v.assign(3, 0.0f);
  CHECK_THROWS_AS(twin.gpu.retain(short_merge), std::invalid_argument);
  twin.require_same();
}

TEST_CASE("cuda dense store: make_cuda_full_cache runs a forward as make_full_cache does",
          "[gpu]") {
  require_device();
  const int32_t head_dim = 64, n_layers = 2, n_heads = kKvHeads * kGroup;
  const KvShape shape{n_layers, kKvHeads, head_dim};
  KvCache cpu = make_full_cache(shape);
  KvCache gpu = make_cuda_full_cache(shape);
  uint32_t seed = 800;
  for (int64_t n_new : {300, 1, 7}) {
    std::vector<int32_t> positions(static_cast<size_t>(n_new));
    std::iota(positions.begin(), positions.end(), cpu.next_position());
    const Device<int32_t> dpositions(positions);
    for (int32_t l = 0; l < n_layers; ++l) {
      const auto k = random_floats(n_new * kKvHeads * head_dim, seed++);
      const auto v = random_floats(n_new * kKvHeads * head_dim, seed++);
      const auto q = random_floats(n_new * n_heads * head_dim, seed++);
      std::vector<float> cpu_out(q.size(), 0.0f);
      const Device<float> dk(k), dv(v), dq(q), dout(cpu_out);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const int32_t n = static_cast<int32_t>(n_new);
      cpu.append(l, k.data(), v.data(), positions.data(), n_new);
      gpu.append(l, dk.get(), dv.get(), dpositions.get(), n_new);
      cpu.attend(l, AttentionQuery{q.data(), positions.data(), cpu_out.data(), n, n_heads, scale});
      gpu.attend(l, AttentionQuery{dq.get(), dpositions.get(), dout.get(), n, n_heads, scale});
      const std::vector<float> gpu_out = dout.host();
      float max_diff = 0.0f;
      for (size_t i = 0; i < q.size(); ++i) {
        max_diff = std::max(max_diff, std::abs(gpu_out[i] - cpu_out[i]));
      }
      CHECK(max_diff < 1e-4f);
    }
    cpu.advance(static_cast<int32_t>(n_new));
    gpu.advance(static_cast<int32_t>(n_new));
    const CacheStats a = cpu.stats(), b = gpu.stats();
    CHECK(b.tokens_per_layer == a.tokens_per_layer);
    CHECK(b.bytes_per_layer == a.bytes_per_layer);
    CHECK(b.bytes_read_last_forward == a.bytes_read_last_forward);
    REQUIRE(b.tiers.size() == 1);  // every byte in device memory
    CHECK(b.tiers[0].tier == "device");
    CHECK(b.tiers[0].bytes == a.bytes_resident);
  }
  KvCache branch = gpu.clone();
  CHECK(branch.bytes_resident() == gpu.bytes_resident());
  CHECK(branch.layer(0).view().k != gpu.layer(0).view().k);
}
