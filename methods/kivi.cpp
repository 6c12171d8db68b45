#include "methods/kivi.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kivi_attention.h"
#include "kernels/cpu/quantize.h"
#ifdef KVBENCH_WITH_CUDA
#include "methods/cuda/kivi_store.h"
#endif

namespace kvbench {

namespace {

// Replaces each group with its quantized values rounded back to fp32 (what unpacking its
// codes gives). Group g's element i is x[g * group_stride + i * element_stride].
void round_groups(float* x, int64_t group_stride, int64_t element_stride, int64_t n_groups,
                  int32_t group, int32_t bits) {
  std::vector<uint8_t> codes(static_cast<size_t>(n_groups * group * bits / 8));
  std::vector<float> scale(static_cast<size_t>(n_groups)), min(scale.size());
  const QuantGroups q{codes.data(), scale.data(), min.data(), n_groups, group, bits};
  quantize_groups_cpu(x, group_stride, element_stride, q);
  dequantize_groups_cpu(q, x, group_stride, element_stride);
}

template <typename T>
void resize_exact(std::vector<T>& v, size_t n) {
  v.resize(n);
  if (v.capacity() > n) v.shrink_to_fit();
}

}  // namespace

KiviLayerKv::KiviLayerKv(int32_t n_kv_heads, int32_t head_dim, const KiviConfig& config)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      config_(config),
      blocks_(n_kv_heads, head_dim, config.group, config.bits),
      tail_(n_kv_heads, head_dim),
      keys_rounded_(n_kv_heads, 0),
      values_rounded_(n_kv_heads, 0) {
  assert(head_dim % config.group == 0 && (config.bits == 2 || config.bits == 4));
}

KiviKv KiviLayerKv::layout() const { return blocks_.layout(tail_.view()); }

void KiviLayerKv::reserve(int64_t n_tokens) {
  if (each_chunk_) {  // the tail stays near residual + group: the blocks take the tokens
    blocks_.reserve((n_tokens + config_.group - 1) / config_.group);
    return;
  }
  const int64_t tail = n_tokens - blocks_.n_blocks() * config_.group;
  if (tail > tail_.capacity) tail_.reallocate(tail);
}

void KiviLayerKv::append(const float* k, const float* v, const int32_t* positions, int64_t n_new) {
  drop_view();
  if (tail_.n_tokens + n_new > tail_.capacity) {
    tail_.reallocate(grown_capacity(tail_.capacity, tail_.n_tokens + n_new, /*evicted=*/false));
  }
  tail_.append(k, v, positions, n_new);
}

// Packs the tail's whole blocks of quantized slots, then (KiviTail::Kivi) rounds the rows
// whose keys or values KIVI has quantized but which wait for their block.
void KiviLayerKv::settle() {
  drop_view();
  const int64_t g = config_.group;
  const int64_t n_pack = std::max<int64_t>(
      0, (kivi_quantized_slots(config_, n_tokens()) - blocks_.n_blocks() * g) / g);
  if (n_pack > 0) {
    const int64_t first = blocks_.n_blocks();
    blocks_.resize(blocks_.n_blocks() + n_pack);
    for (int64_t b = 0; b < n_pack; ++b) {
      for (int32_t h = 0; h < n_kv_heads_; ++h) {
        const size_t row = static_cast<size_t>(h) * tail_.capacity + b * g;
        blocks_.pack(first + b, h, &tail_.k[row * head_dim_], &tail_.v[row * head_dim_],
                     &tail_.positions[row]);
      }
    }
    const int64_t moved = n_pack * g, left = tail_.n_tokens - moved;
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const size_t head = static_cast<size_t>(h) * tail_.capacity;
      std::memmove(&tail_.k[head * head_dim_], &tail_.k[(head + moved) * head_dim_],
                   left * head_dim_ * sizeof(float));
      std::memmove(&tail_.v[head * head_dim_], &tail_.v[(head + moved) * head_dim_],
                   left * head_dim_ * sizeof(float));
      std::memmove(&tail_.positions[head], &tail_.positions[head + moved], left * sizeof(int32_t));
      keys_rounded_[h] = std::max<int64_t>(0, keys_rounded_[h] - moved);
      values_rounded_[h] = std::max<int64_t>(0, values_rounded_[h] - moved);
    }
    tail_.n_tokens = left;
  }
  if (config_.tail == KiviTail::Kivi) round_quantized_rows();
  // Between forwards the tail holds fewer than residual + group tokens, and a decode step
  // adds one: give back the room a longer forward needed.
  const int64_t steady = config_.residual + g;
  if (tail_.capacity > steady && tail_.n_tokens <= steady) tail_.reallocate(steady);
}

void KiviLayerKv::round_quantized_rows() {
  const int64_t d = head_dim_;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const size_t head = static_cast<size_t>(h) * tail_.capacity;
    const TailRounding r =
        kivi_tail_rounding(config_, n_tokens(), blocks_.n_blocks() * config_.group,
                           keys_rounded_[h], values_rounded_[h]);
    for (int64_t a = r.keys_from; a < r.keys_to; a += config_.group) {  // per channel
      round_groups(&tail_.k[(head + a) * d], 1, d, d, config_.group, config_.bits);
    }
    if (r.values_from < r.values_to) {  // per token, in groups of `group` channels
      round_groups(&tail_.v[(head + r.values_from) * d], config_.group, 1,
                   (r.values_to - r.values_from) * d / config_.group, config_.group, config_.bits);
    }
    keys_rounded_[h] = std::max(keys_rounded_[h], r.keys_to);
    values_rounded_[h] = std::max(values_rounded_[h], r.values_to);
  }
}

TailRounding kivi_tail_rounding(const KiviConfig& config, int64_t n_tokens, int64_t packed,
                                int64_t keys_rounded, int64_t values_rounded) {
  const int64_t g = config.group, tail = n_tokens - packed;
  TailRounding r;
  // Keys round a channel over `group` rows, so only whole groups: with residual 0 every key
  // counts as quantized, and a last partial group would round rows past the tail's tokens.
  r.keys_to =
      std::clamp<int64_t>(kivi_keys_quantized(config.residual, n_tokens) - packed, 0, tail) / g * g;
  r.keys_from = std::min(keys_rounded / g * g, r.keys_to);
  r.values_to = std::clamp<int64_t>(n_tokens - config.residual - packed, 0, tail);
  r.values_from = std::min(values_rounded, r.values_to);
  return r;
}

void kivi_rounded_after_retain(const RetainPlan& plan, int32_t n_kv_heads, int64_t old_packed,
                               int64_t new_packed, std::vector<int64_t>& rounded) {
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    if (!plan.k.empty()) {
      rounded[h] = 0;
      continue;
    }
    const int32_t* placed = plan.slots.data() + h * plan.n_keep;
    rounded[h] =
        std::lower_bound(placed + new_packed, placed + plan.n_keep, old_packed + rounded[h]) -
        (placed + new_packed);
  }
}

int64_t KiviLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  const int64_t g = config_.group;
  const int64_t block_bytes = blocks_.block_read_bytes();
  const int64_t tail_token_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
  const KiviKv kv = layout();
  if (blocks_.n_blocks() == 0) {  // all fp32 (a prefill before the first pack): the dense kernels
    if (pages) {
      attention_pages_cpu(query, kv.tail, *pages);
      return tail_token_bytes * selected_slots(*pages, n_kv_heads_, tail_.n_tokens);
    }
    attention_dense_cpu(query, kv.tail);
    return tail_token_bytes * n_kv_heads_ * tail_.n_tokens;
  }
  attention_kivi_cpu(query, kv, pages);
  if (!pages) {
    return n_kv_heads_ * (blocks_.n_blocks() * block_bytes + tail_.n_tokens * tail_token_bytes);
  }
  // Packed slots are charged their share of the block (codes and group parameters).
  const int64_t packed = blocks_.n_blocks() * g, total = n_tokens();
  int64_t bytes = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(n_kv_heads_) * pages->n_selected; ++i) {
    const int64_t first = static_cast<int64_t>(pages->pages[i]) * pages->page_tokens;
    const int64_t last = std::min(total, first + pages->page_tokens);
    const int64_t in_blocks = std::max<int64_t>(0, std::min(last, packed) - first);
    bytes += in_blocks * block_bytes / g + (last - first - in_blocks) * tail_token_bytes;
  }
  return bytes;
}

DenseKv KiviLayerKv::view() const {
  if (blocks_.n_blocks() == 0) return layout().tail;
  const int64_t g = config_.group, d = head_dim_, total = n_tokens();
  if (view_positions_.empty()) {
    view_k_.resize(static_cast<size_t>(n_kv_heads_) * total * d);
    view_v_.resize(view_k_.size());
    view_positions_.resize(static_cast<size_t>(n_kv_heads_) * total);
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      for (int64_t b = 0; b < blocks_.n_blocks(); ++b) {
        const size_t row = static_cast<size_t>(h) * total + b * g;
        blocks_.unpack(b, h, &view_k_[row * d], &view_v_[row * d], &view_positions_[row]);
      }
      const size_t row = static_cast<size_t>(h) * total + blocks_.n_blocks() * g;
      const size_t tail_row = static_cast<size_t>(h) * tail_.capacity;
      std::memcpy(&view_k_[row * d], &tail_.k[tail_row * d], tail_.n_tokens * d * sizeof(float));
      std::memcpy(&view_v_[row * d], &tail_.v[tail_row * d], tail_.n_tokens * d * sizeof(float));
      std::memcpy(&view_positions_[row], &tail_.positions[tail_row],
                  tail_.n_tokens * sizeof(int32_t));
    }
  }
  return DenseKv{view_k_.data(), view_v_.data(), view_positions_.data(), n_kv_heads_, head_dim_,
                 total,          total};
}

void KiviLayerKv::drop_view() const {
  resize_exact(view_k_, 0);
  resize_exact(view_v_, 0);
  resize_exact(view_positions_, 0);
}

// Applies the plan to the unpacked rows (the tail itself while nothing is packed): the
// packed blocks that remain keep their kept tokens in place, their holes take the oldest
// kept tokens after them, and the rest, in position order, become the fp32 tail. So the
// newest tokens stay fp32 under any eviction, and only the blocks whose tokens or contents
// changed are packed again.
void KiviLayerKv::retain(RetainPlan& plan) {
  const int64_t g = config_.group, d = head_dim_;
  const int64_t n_keep = plan.n_keep;
  const int64_t n_blocks = std::min(blocks_.n_blocks(), n_keep / g);
  const int64_t old_packed = blocks_.n_blocks() * g;
  const auto count_rounded = [&] {
    kivi_rounded_after_retain(plan, n_kv_heads_, old_packed, n_blocks * g, keys_rounded_);
    kivi_rounded_after_retain(plan, n_kv_heads_, old_packed, n_blocks * g, values_rounded_);
  };
  if (blocks_.n_blocks() == 0) {
    retain_rows_in_place(tail_.k.data(), tail_.v.data(), tail_.positions.data(), n_kv_heads_,
                         head_dim_, tail_.capacity, tail_.n_tokens, plan, 0);
    count_rounded();
    tail_.n_tokens = n_keep;
    if (tail_.capacity > std::max(2 * tail_.n_tokens, config_.residual + g)) {
      tail_.reallocate(std::max(tail_.n_tokens, config_.residual + g));
    }
    return;
  }
  const DenseKv all = view();
  retain_rows_in_place(view_k_.data(), view_v_.data(), view_positions_.data(), n_kv_heads_,
                       head_dim_, all.capacity, all.n_tokens, plan, n_blocks * g);
  const bool merged = !plan.k.empty();
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int32_t* placed = plan.slots.data() + h * n_keep;
    for (int64_t b = 0; b < n_blocks; ++b) {
      bool changed = merged;
      for (int64_t j = b * g; j < (b + 1) * g && !changed; ++j) changed = placed[j] != j;
      if (!changed) continue;
      const size_t row = static_cast<size_t>(h) * all.capacity + b * g;
      blocks_.pack(b, h, &view_k_[row * d], &view_v_[row * d], &view_positions_[row]);
    }
  }
  blocks_.resize(n_blocks);
  tail_.n_tokens = 0;
  const int64_t tail = n_keep - n_blocks * g;
  // Room for the tail to grow back to residual + group, but never more than the tokens kept
  // could need (a residual larger than the context costs nothing).
  tail_.reallocate(std::max(tail, std::min(config_.residual, n_keep) + g));
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const size_t row = static_cast<size_t>(h) * all.capacity + n_blocks * g;
    const size_t tail_row = static_cast<size_t>(h) * tail_.capacity;
    std::memcpy(&tail_.k[tail_row * d], &view_k_[row * d], tail * d * sizeof(float));
    std::memcpy(&tail_.v[tail_row * d], &view_v_[row * d], tail * d * sizeof(float));
    std::memcpy(&tail_.positions[tail_row], &view_positions_[row], tail * sizeof(int32_t));
  }
  tail_.n_tokens = tail;
  count_rounded();
  drop_view();
}

std::unique_ptr<LayerKv> KiviLayerKv::clone() const {
  auto copy = std::make_unique<KiviLayerKv>(*this);
  copy->drop_view();
  return copy;
}

std::unique_ptr<LayerKv> KiviLayerKv::head_store(int32_t head) const {
  auto one = std::make_unique<KiviLayerKv>(1, head_dim_, config_);
  one->blocks_ = blocks_.head(head);
  one->tail_.reallocate(tail_.capacity);
  const size_t from = static_cast<size_t>(head) * tail_.capacity, n = tail_.n_tokens;
  std::copy_n(tail_.k.data() + from * head_dim_, n * head_dim_, one->tail_.k.data());
  std::copy_n(tail_.v.data() + from * head_dim_, n * head_dim_, one->tail_.v.data());
  std::copy_n(tail_.positions.data() + from, n, one->tail_.positions.data());
  one->tail_.n_tokens = tail_.n_tokens;
  one->keys_rounded_[0] = keys_rounded_[head];
  one->values_rounded_[0] = values_rounded_[head];
  return one;
}

int64_t KiviLayerKv::bytes_resident() const {
  const auto bytes = [](const auto& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(v[0]));
  };
  return blocks_.bytes() + tail_.bytes() + bytes(view_k_) + bytes(view_v_) + bytes(view_positions_);
}

std::vector<std::unique_ptr<LayerKv>> make_kivi_layers(const KvShape& shape,
                                                       const KiviConfig& config) {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<KiviLayerKv>(shape.n_kv_heads, shape.head_dim, config));
  }
  return layers;
}

// Registered as `kivi` (methods/method_list.cpp).
MethodInfo kivi_method() {
  MethodInfo info;
  info.name = "kivi";
  info.kind = MethodKind::Storage;
  info.stage = "2 storage (packs blocks as they leave the fp32 residual) + 3 (fused reads)";
  info.summary =
      "keys per channel and values per token packed to 2 or 4 bits in groups of 32, the "
      "newest `residual` tokens in fp32";
  info.paper =
      "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache (Liu et al., ICML 2024), "
      "arXiv 2402.02750";
  info.choices = {
      "tail=kivi (default) is KIVI's rule; the rows waiting for a whole block of 32 are "
      "held rounded in fp32, so bytes count up to R+31 fp32 rows where KIVI holds the T "
      "mod R newest keys and R values",
      "tail=block keeps keys and values of the newest R to R+31 tokens fp32, more than "
      "KIVI does (kinder to accuracy)",
      "after an eviction in front (snapkv+kivi), holes in packed blocks take the oldest "
      "fp32 tokens, and the blocks touched are packed again, adding their error once "
      "more",
      "after a head-wise budget in front (adakv+snapkv+kivi), each KV head is a store of "
      "its own (its blocks as they were): it packs its own blocks and keeps its own fp32 "
      "tail, as KIVI's code would for a head of that length",
      "with --decode-activations int8 on a CPU with AVX-512 VNNI and VBMI, a decode step "
      "reads 4-bit blocks with integer dot products: per block and row, q times the key "
      "scales rounded to int8 per 32 channels and p times the value scales to unsigned 8 "
      "bits per 32 tokens (as llama.cpp rounds q and the probabilities to q8_0 against its "
      "quantized caches); KIVI's code multiplies in fp16, and kvbench's fp32 activations "
      "(the default) in fp32",
  };
  info.params = {
      choice_param("bits", "2", {"2", "4"}, "bits per key and value"),
      int_param("residual", 128, 0, kMaxTokens,
                "KIVI's residual length R, a multiple of 32: the newest tokens kept in fp32"),
      choice_param("tail", "kivi", {"kivi", "block"},
                   "kivi: keys go to bits R at a time (0 to R-1 fp32), the newest R values "
                   "fp32, as KIVI's code; block: keys and values of the newest R to R+31 "
                   "tokens fp32"),
  };
  info.check = [](const MethodParams& params) {
    if (params.get_int("residual") % 32 != 0) {
      throw InputError("residual=" + params.get("residual") + " must be a multiple of 32");
    }
  };
  info.splits_heads = true;
  info.make_layers = [](const MethodParams& params, const KvShape& shape) {
    if (shape.head_dim % 32 != 0) {
      throw InputError("kivi packs channels in groups of 32, but head_dim is " +
                       std::to_string(shape.head_dim));
    }
    return make_kivi_layers(shape, kivi_config_from(params));
  };
#ifdef KVBENCH_WITH_CUDA
  info.make_device_layers = [](const MethodParams& params, const KvShape& shape) {
    return make_cuda_kivi_layers(shape, kivi_config_from(params));
  };
#endif
  return info;
}

KiviConfig kivi_config_from(const MethodParams& params) {
  KiviConfig config;
  config.bits = static_cast<int32_t>(params.get_int("bits"));
  config.residual = params.get_int("residual");
  config.tail = params.get("tail") == "block" ? KiviTail::Block : KiviTail::Kivi;
  return config;
}

}  // namespace kvbench
