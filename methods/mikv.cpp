#include "methods/mikv.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kivi_attention.h"

namespace kvbench {

namespace {

constexpr int32_t kGroup = 32;  // demoted tokens per packed block, channels per value group

}  // namespace

MikvLayerKv::MikvLayerKv(int32_t n_kv_heads, int32_t head_dim, int32_t bits)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      low_(n_kv_heads, head_dim, kGroup, bits),
      rows_(n_kv_heads, head_dim) {}

void MikvLayerKv::reserve(int64_t n_tokens) {
  if (n_pending_ + n_tokens > rows_.capacity) rows_.reallocate(n_pending_ + n_tokens);
}

void MikvLayerKv::append(const float* k, const float* v, const int32_t* positions, int64_t n_new) {
  if (rows_.n_tokens + n_new > rows_.capacity) {
    rows_.reallocate(grown_capacity(rows_.capacity, rows_.n_tokens + n_new, /*evicted=*/false));
  }
  rows_.append(k, v, positions, n_new);
}

int64_t MikvLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  // Retrieval cannot compose with the eviction policy MiKV follows (resolve_method_spec).
  assert(pages == nullptr);
  (void)pages;
  const int64_t row_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
  if (low_.n_blocks() == 0) {
    attention_dense_cpu(query, rows_.view());
  } else {
    attention_kivi_cpu(query, layout(), nullptr);
  }
  return n_kv_heads_ * (low_.n_blocks() * low_.block_read_bytes() + rows_.n_tokens * row_bytes);
}

DenseKv MikvLayerKv::view() const {
  const int64_t skip = n_pending_;
  return DenseKv{rows_.k.data() + skip * head_dim_,
                 rows_.v.data() + skip * head_dim_,
                 rows_.positions.data() + skip,
                 n_kv_heads_,
                 head_dim_,
                 rows_.capacity,
                 rows_.n_tokens - skip};
}

void MikvLayerKv::retain(RetainPlan& plan) {
  const int64_t d = head_dim_, n_important = n_tokens(), n_keep = plan.n_keep;
  const int64_t pending = n_pending_ + (n_important - n_keep);  // per head, after the plan
  const int64_t n_pack = pending / kGroup;
  const int64_t left = rows_.n_tokens - n_pack * kGroup;  // fp32 rows per head afterwards
  // Each head's rows in their new order: pending, newly demoted (in slot order), kept (in
  // plan order, merged contents where the plan has them).
  HeadRows next(n_kv_heads_, head_dim_);
  next.reallocate(rows_.n_tokens);
  std::vector<char> kept(static_cast<size_t>(n_important));
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int32_t* slots = plan.slots.data() + h * n_keep;
    const size_t from = static_cast<size_t>(h) * rows_.capacity;
    const size_t to = static_cast<size_t>(h) * next.capacity;
    const auto copy_row = [&](int64_t src, int64_t dst) {
      std::memcpy(&next.k[(to + dst) * d], &rows_.k[(from + src) * d], d * sizeof(float));
      std::memcpy(&next.v[(to + dst) * d], &rows_.v[(from + src) * d], d * sizeof(float));
      next.positions[to + dst] = rows_.positions[from + src];
    };
    int64_t row = 0;
    for (; row < n_pending_; ++row) copy_row(row, row);
    std::fill(kept.begin(), kept.end(), 0);
    for (int64_t j = 0; j < n_keep; ++j) kept[slots[j]] = 1;
    for (int64_t s = 0; s < n_important; ++s) {
      if (!kept[s]) copy_row(n_pending_ + s, row++);
    }
    for (int64_t j = 0; j < n_keep; ++j, ++row) {
      copy_row(n_pending_ + slots[j], row);
      if (!plan.k.empty()) {
        const size_t merged = (static_cast<size_t>(h) * n_keep + j) * d;
        std::memcpy(&next.k[(to + row) * d], &plan.k[merged], d * sizeof(float));
        std::memcpy(&next.v[(to + row) * d], &plan.v[merged], d * sizeof(float));
      }
    }
  }
  next.n_tokens = rows_.n_tokens;
  // Whole blocks of demoted rows pack; the rest stays fp32, in buffers with room for the
  // next forward's growth as append gives it.
  const int64_t first = low_.n_blocks();
  low_.resize(first + n_pack);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    for (int64_t b = 0; b < n_pack; ++b) {
      const size_t row = static_cast<size_t>(h) * next.capacity + b * kGroup;
      low_.pack(first + b, h, &next.k[row * d], &next.v[row * d], &next.positions[row]);
    }
  }
  rows_.n_tokens = 0;
  if (rows_.capacity > 2 * left + 64 || rows_.capacity < left) rows_.reallocate(left + 64);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const size_t src = static_cast<size_t>(h) * next.capacity + n_pack * kGroup;
    const size_t dst = static_cast<size_t>(h) * rows_.capacity;
    std::memcpy(&rows_.k[dst * d], &next.k[src * d], left * d * sizeof(float));
    std::memcpy(&rows_.v[dst * d], &next.v[src * d], left * d * sizeof(float));
    std::memcpy(&rows_.positions[dst], &next.positions[src], left * sizeof(int32_t));
  }
  rows_.n_tokens = left;
  n_pending_ = pending - n_pack * kGroup;
}

std::unique_ptr<LayerKv> MikvLayerKv::clone() const { return std::make_unique<MikvLayerKv>(*this); }

std::vector<std::unique_ptr<LayerKv>> make_mikv_layers(const KvShape& shape, int32_t bits) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<MikvLayerKv>(shape.n_kv_heads, shape.head_dim, bits));
  }
  return layers;
}

// Registered as `mikv` (methods/method_list.cpp).
MethodInfo mikv_method() {
  MethodInfo info;
  info.name = "mikv";
  info.kind = MethodKind::Storage;
  info.stage = "2 storage (when the eviction method in front plans: at its eviction points)";
  info.summary =
      "what the eviction method in front drops is kept at 2 or 4 bits instead, what it keeps "
      "in fp32: no token leaves the cache";
  info.paper =
      "No Token Left Behind: Reliable KV Cache Compression via Importance-Aware Mixed "
      "Precision Quantization (Yang et al., 2024), arXiv 2402.18096";
  info.choices = {
      "no authors' code is public: the paper's rule, with kvbench's storage",
      "important tokens stay fp32 (kvbench's full cache), where MiKV holds the model's fp16",
      "demoted tokens are packed as KIVI packs: keys per channel over blocks of 32 demoted "
      "tokens, values per token in groups of 32 channels (MiKV: per-token keys with an "
      "outlier balancer from the prefill's queries, which a store does not see)",
      "demoted rows wait in fp32 until 32 of a KV head gather (up to 31 rows per head and "
      "layer, counted in the bytes)",
      "any eviction method in front says what is important (snapkv:ratio=0.25+mikv:bits=2); "
      "MiKV's paper uses H2O's accumulated attention",
      "its 4-bit blocks are read as kivi's, so with --decode-activations int8 a decode step "
      "rounds q and p to 8 bits against them (see kivi)",
  };
  info.needs_eviction = true;
  info.params = {
      choice_param("bits", "2", {"2", "4"}, "bits of the demoted tokens' keys and values"),
  };
  info.make_layers = [](const MethodParams& params, const KvShape& shape) {
    if (shape.head_dim % kGroup != 0) {
      throw InputError("mikv packs channels in groups of 32, but head_dim is " +
                       std::to_string(shape.head_dim));
    }
    return make_mikv_layers(shape, static_cast<int32_t>(params.get_int("bits")));
  };
  return info;
}

}  // namespace kvbench
