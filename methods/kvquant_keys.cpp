#include "methods/kvquant_keys.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"

namespace kvbench {

namespace {

// numpy.percentile's default (linear between the two nearest ranks) of sorted x, q in [0, 1].
float percentile(const std::vector<float>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(at));
  if (i + 1 >= sorted.size()) return sorted.back();
  const double frac = at - static_cast<double>(i);
  return static_cast<float>(sorted[i] + frac * (static_cast<double>(sorted[i + 1]) - sorted[i]));
}

}  // namespace

KvQuantLayerKv::KvQuantLayerKv(int32_t n_kv_heads, int32_t head_dim, const KvQuantConfig& config,
                               std::shared_ptr<const std::vector<double>> rope)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      config_(config),
      // The authors' per-token thresholds are the outliers / 2 and 1 - outliers / 2 quantiles
      // (torch.quantile, linear): over head_dim values, ceil(outliers / 2 (head_dim - 1))
      // values lie beyond each.
      value_outliers_(config.outliers > 0
                          ? static_cast<int32_t>(std::ceil(config.outliers / 2 * (head_dim - 1)))
                          : 0),
      rope_(std::move(rope)),
      rows_(n_kv_heads, head_dim) {
  assert(head_dim % 8 == 0 &&
         rope_->size() == static_cast<size_t>(rope_angle_table_size(head_dim / 2)));
}

KvQuantEncoding KvQuantLayerKv::encoding(int32_t head) const {
  const int64_t at = static_cast<int64_t>(head) * head_dim_;
  return KvQuantEncoding{k_min_.data() + at, k_max_.data() + at, k_scale_.data() + at,
                         head_dim_,          config_.bits,       value_outliers_};
}

KvQuantKv KvQuantLayerKv::layout(std::vector<SparseRows>& heads) const {
  heads.resize(n_kv_heads_);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const Outliers& o = outliers_[h];
    heads[h] = SparseRows{o.start.data(), o.channel.data(), o.value.data()};
  }
  return KvQuantKv{k_codes_.data(), v_codes_.data(), k_scale_.data(),   k_min_.data(),
                   v_scale_.data(), v_min_.data(),   positions_.data(), heads.data(),
                   rope(),          n_kv_heads_,     head_dim_,         config_.bits,
                   capacity_,       n_tokens_};
}

void KvQuantLayerKv::drop_view() const {
  view_k_ = {};
  view_v_ = {};
}

void KvQuantLayerKv::reallocate(int64_t capacity) {
  assert(capacity >= n_tokens_);
  const int64_t rb = row_bytes(), n = n_tokens_;
  std::vector<uint8_t> k_codes(n_kv_heads_ * capacity * rb), v_codes(k_codes.size());
  std::vector<float> v_scale(n_kv_heads_ * capacity), v_min(v_scale.size());
  std::vector<int32_t> positions(v_scale.size());
  for (int32_t h = 0; h < n_kv_heads_ && n > 0; ++h) {
    const int64_t from = h * capacity_, to = h * capacity;
    std::memcpy(&k_codes[to * rb], &k_codes_[from * rb], n * rb);
    std::memcpy(&v_codes[to * rb], &v_codes_[from * rb], n * rb);
    std::copy_n(&v_scale_[from], n, &v_scale[to]);
    std::copy_n(&v_min_[from], n, &v_min[to]);
    std::copy_n(&positions_[from], n, &positions[to]);
  }
  k_codes_.swap(k_codes);
  v_codes_.swap(v_codes);
  v_scale_.swap(v_scale);
  v_min_.swap(v_min);
  positions_.swap(positions);
  for (Outliers& o : outliers_) {  // room for every slot's start, exactly
    std::vector<int32_t> start;
    start.reserve(capacity + 1);
    start.assign(o.start.begin(), o.start.end());
    o.start.swap(start);
  }
  capacity_ = capacity;
}

void KvQuantLayerKv::encode(int32_t head, int64_t slot, const float* k, const float* v,
                            Outliers& to) {
  const int64_t at = head * capacity_ + slot, rb = row_bytes();
  const size_t used = to.channel.size();
  to.channel.resize(used + 2 * head_dim_);
  to.value.resize(to.channel.size());
  const int32_t n = kvquant_encode_row(encoding(head), k, v, positions_[at] < config_.sink,
                                       &k_codes_[at * rb], &v_codes_[at * rb], &v_scale_[at],
                                       &v_min_[at], &to.channel[used], &to.value[used]);
  to.channel.resize(used + n);
  to.value.resize(used + n);
  to.start.push_back(static_cast<int32_t>(used + n));
}

void KvQuantLayerKv::fit() {
  const int64_t n = rows_.n_tokens, cap = rows_.capacity, d = head_dim_;
  // The keys as they were before RoPE.
  std::vector<float> before(rows_.k.begin(), rows_.k.begin() + n_kv_heads_ * cap * d);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    rotate_rows(rope(), before.data() + h * cap * d, d, rows_.positions.data() + h * cap, n, -1);
  }
  // Each channel's range: the percentiles of its keys past the sink (kept whole anyway).
  k_min_.resize(n_kv_heads_ * d);
  k_max_.resize(k_min_.size());
  k_scale_.resize(k_min_.size());
  const float levels = static_cast<float>((1 << config_.bits) - 1);
  std::vector<float> channel;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    for (int64_t c = 0; c < d; ++c) {
      channel.clear();
      for (int64_t t = 0; t < n; ++t) {
        if (rows_.positions[h * cap + t] >= config_.sink)
          channel.push_back(before[(h * cap + t) * d + c]);
      }
      std::sort(channel.begin(), channel.end());
      const int64_t at = h * d + c;
      k_min_[at] = percentile(channel, config_.outliers / 2);
      k_max_[at] = percentile(channel, 1 - config_.outliers / 2);
      k_scale_[at] = (k_max_[at] - k_min_[at]) / levels;
    }
  }
  outliers_.assign(n_kv_heads_, Outliers{{0}, {}, {}});
  reallocate(n);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      positions_[h * capacity_ + t] = rows_.positions[h * cap + t];
      encode(h, t, &before[(h * cap + t) * d], &rows_.v[(h * cap + t) * d], outliers_[h]);
    }
  }
  for (Outliers& o : outliers_) {  // exactly what the context holds apart
    o.channel.shrink_to_fit();
    o.value.shrink_to_fit();
  }
  n_tokens_ = n;
  rows_ = HeadRows(n_kv_heads_, head_dim_);
  fitted_ = true;
}

void KvQuantLayerKv::reserve(int64_t n_tokens) {
  if (!fitted_) {
    if (n_tokens > rows_.capacity) rows_.reallocate(n_tokens);
  } else if (n_tokens > capacity_) {
    reallocate(n_tokens);
  }
}

void KvQuantLayerKv::append(const float* k, const float* v, const int32_t* positions,
                            int64_t n_new) {
  drop_view();
  if (!fitted_) {
    if (rows_.n_tokens + n_new > rows_.capacity) {
      rows_.reallocate(grown_capacity(rows_.capacity, rows_.n_tokens + n_new, evicted_));
    }
    rows_.append(k, v, positions, n_new);
    return;
  }
  if (n_tokens_ + n_new > capacity_) {
    reallocate(grown_capacity(capacity_, n_tokens_ + n_new, evicted_));
  }
  // Quantized as they come: each token against the fitted ranges, its key turned back first.
  const int64_t d = head_dim_, stride = n_kv_heads_ * d;
  std::vector<float> before(k, k + n_new * stride);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    rotate_rows(rope(), before.data() + h * d, stride, positions, n_new, -1);
  }
  for (int64_t t = 0; t < n_new; ++t) {
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      positions_[h * capacity_ + n_tokens_ + t] = positions[t];
      encode(h, n_tokens_ + t, &before[t * stride + h * d], v + t * stride + h * d, outliers_[h]);
    }
  }
  n_tokens_ += n_new;
}

int64_t KvQuantLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  if (!fitted_) {
    pages ? attention_pages_cpu(query, rows_.view(), *pages)
          : attention_dense_cpu(query, rows_.view());
    const int64_t token_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
    return token_bytes * (pages ? selected_slots(*pages, n_kv_heads_, rows_.n_tokens)
                                : n_kv_heads_ * rows_.n_tokens);
  }
  std::vector<SparseRows> heads;
  attention_kvquant_cpu(query, layout(heads), pages);
  // Codes and slot metadata of the slots read, their outliers, each head's key ranges.
  int64_t slots = 0, entries = 0;
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const std::vector<int32_t>& start = outliers_[h].start;
    if (!pages) {
      slots += n_tokens_;
      entries += start[n_tokens_];
      continue;
    }
    for (int32_t i = 0; i < pages->n_selected; ++i) {
      const int64_t first =
          static_cast<int64_t>(pages->pages[h * pages->n_selected + i]) * pages->page_tokens;
      const int64_t end = std::min(first + pages->page_tokens, n_tokens_);
      slots += end - first;
      entries += start[end] - start[first];
    }
  }
  return slots * kvquant_slot_bytes(head_dim_, config_.bits) + entries * kKvQuantOutlierBytes +
         2LL * n_kv_heads_ * head_dim_ * sizeof(float);
}

void KvQuantLayerKv::retain(RetainPlan& plan) {
  drop_view();
  evicted_ = true;
  if (!fitted_) {
    retain_rows_in_place(rows_.k.data(), rows_.v.data(), rows_.positions.data(), n_kv_heads_,
                         head_dim_, rows_.capacity, rows_.n_tokens, plan);
    rows_.n_tokens = plan.n_keep;
    if (retain_shrinks(rows_.capacity, rows_.n_tokens)) rows_.reallocate(rows_.n_tokens);
    return;
  }
  const int64_t n_keep = plan.n_keep, d = head_dim_, rb = row_bytes();
  const std::vector<int32_t> order = kept_slot_order(plan, n_kv_heads_, n_keep);
  std::vector<float> before(d);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    int32_t* keep = plan.slots.data() + h * n_keep;
    const int32_t* placed_order = order.data() + h * n_keep;
    std::vector<int32_t> placed(n_keep);
    for (int64_t j = 0; j < n_keep; ++j) placed[j] = keep[placed_order[j]];
    // Ascending j: a row is read before any write reaches it (placed[j] >= j).
    const int64_t head = h * capacity_;
    for (int64_t j = 0; j < n_keep; ++j) {
      const int64_t from = head + placed[j], to = head + j;
      if (from == to) continue;
      std::memcpy(&k_codes_[to * rb], &k_codes_[from * rb], rb);
      std::memcpy(&v_codes_[to * rb], &v_codes_[from * rb], rb);
      v_scale_[to] = v_scale_[from];
      v_min_[to] = v_min_[from];
      positions_[to] = positions_[from];
    }
    // The outliers follow their slots; merged contents are encoded afresh.
    const Outliers& old = outliers_[h];
    Outliers kept{{0}, {}, {}};
    kept.start.reserve(capacity_ + 1);
    for (int64_t j = 0; j < n_keep; ++j) {
      if (!plan.k.empty()) {
        const int64_t row = (h * n_keep + placed_order[j]) * d;
        std::copy_n(&plan.k[row], d, before.data());
        rotate_rows(rope(), before.data(), d, &positions_[head + j], 1, -1);
        encode(h, j, before.data(), &plan.v[row], kept);
        continue;
      }
      const int32_t a = old.start[placed[j]], b = old.start[placed[j] + 1];
      kept.channel.insert(kept.channel.end(), old.channel.begin() + a, old.channel.begin() + b);
      kept.value.insert(kept.value.end(), old.value.begin() + a, old.value.begin() + b);
      kept.start.push_back(static_cast<int32_t>(kept.channel.size()));
    }
    kept.channel.shrink_to_fit();
    kept.value.shrink_to_fit();
    outliers_[h] = std::move(kept);
    std::copy(placed.begin(), placed.end(), keep);
  }
  n_tokens_ = n_keep;
  if (retain_shrinks(capacity_, n_tokens_)) reallocate(n_tokens_);
}

DenseKv KvQuantLayerKv::view() const {
  if (!fitted_) return rows_.view();
  // Decoded at the store's capacity, so the positions are read in place.
  if (view_k_.empty() && n_tokens_ > 0) {
    view_k_.resize(n_kv_heads_ * capacity_ * head_dim_);
    view_v_.resize(view_k_.size());
    std::vector<SparseRows> heads;
    const KvQuantKv kv = layout(heads);
    std::vector<int32_t> positions(n_tokens_);
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int64_t row = h * capacity_ * head_dim_;
      kvquant_decode_rows(kv, h, 0, static_cast<int32_t>(n_tokens_), &view_k_[row], &view_v_[row],
                          positions.data());
    }
  }
  return DenseKv{view_k_.data(), view_v_.data(), positions_.data(), n_kv_heads_,
                 head_dim_,      capacity_,      n_tokens_};
}

void KvQuantLayerKv::settle() {
  drop_view();
  if (fitted_) return;
  // The fit waits for enough tokens past the sink in every head (an empty context: the
  // first turn's).
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int32_t* positions = rows_.positions.data() + h * rows_.capacity;
    const int64_t past_sink = std::count_if(positions, positions + rows_.n_tokens,
                                            [&](int32_t p) { return p >= config_.sink; });
    if (past_sink < kKvQuantMinFitTokens) return;
  }
  fit();
}

std::unique_ptr<LayerKv> KvQuantLayerKv::clone() const {
  auto copy = std::make_unique<KvQuantLayerKv>(*this);
  copy->drop_view();
  return copy;
}

int64_t KvQuantLayerKv::bytes_resident() const {
  int64_t outliers = 0;
  for (const Outliers& o : outliers_) {
    outliers += static_cast<int64_t>(o.start.capacity()) * sizeof(int32_t) +
                static_cast<int64_t>(o.channel.capacity() + o.value.capacity()) * sizeof(uint16_t);
  }
  const int64_t floats =
      static_cast<int64_t>(v_scale_.capacity() + v_min_.capacity() + k_min_.capacity() +
                           k_max_.capacity() + k_scale_.capacity());
  return rows_.bytes() + static_cast<int64_t>(k_codes_.capacity() + v_codes_.capacity()) +
         floats * static_cast<int64_t>(sizeof(float)) +
         static_cast<int64_t>(positions_.capacity()) * sizeof(int32_t) + outliers;
}

KvQuantConfig kvquant_config_from(const MethodParams& params) {
  KvQuantConfig config;
  config.bits = static_cast<int32_t>(params.get_int("bits"));
  config.outliers = params.get_float("outliers");
  config.sink = params.get_int("sink");
  return config;
}

std::vector<std::unique_ptr<LayerKv>> make_kvquant_layers(const KvShape& shape,
                                                          const KvQuantConfig& config) {
  const int32_t d = shape.head_dim;
  if (d % 8 != 0 || d > 1024) {
    throw InputError("kvquant_keys: head_dim " + std::to_string(d) +
                     " is not supported (a multiple of 8, at most 1024)");
  }
  if (shape.rope_inv_freq.size() != static_cast<size_t>(d / 2)) {
    throw InputError("kvquant_keys: needs the model's RoPE (" + std::to_string(d / 2) +
                     " frequencies), the cache was given " +
                     std::to_string(shape.rope_inv_freq.size()));
  }
  auto rope = std::make_shared<std::vector<double>>(rope_angle_table_size(d / 2));
  fill_rope_angles(shape.rope_inv_freq.data(), d / 2, rope->data());
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t i = 0; i < shape.n_layers; ++i) {
    layers.push_back(std::make_unique<KvQuantLayerKv>(shape.n_kv_heads, d, config, rope));
  }
  return layers;
}

// Registered as `kvquant_keys` (methods/method_list.cpp).
MethodInfo kvquant_keys_method() {
  MethodInfo info;
  info.name = "kvquant_keys";
  info.kind = MethodKind::Storage;
  info.stage =
      "2 storage (quantizes once the context is in, then each token as it comes) + 3 "
      "(attention decodes and re-rotates keys tile by tile)";
  info.summary =
      "keys before RoPE per channel and values per token to `bits`, the `outliers` share of "
      "values and the first `sink` tokens kept apart in fp16";
  info.paper =
      "KVQuant: Towards 10 Million Context Length LLM Inference with KV Cache Quantization "
      "(Hooper et al., NeurIPS 2024, arXiv 2401.18079)";
  info.choices = {
      "per-channel key ranges from the context itself, not calibrated offline: each channel's "
      "outliers/2 and 1 - outliers/2 percentiles (numpy's, over the context's keys before RoPE "
      "past the sink, per layer and KV head) once the context has ended; later tokens are "
      "quantized against them, values outside kept apart, as the authors' fixed thresholds",
      "uniform codes over each range (the authors' quant_fn_zp, unclamped offset): the "
      "authors' nuq datatypes (Fisher-weighted k-means) and Q-Norm are fitted offline and "
      "are not done",
      "values quantized too, per token as the authors (dynamic thresholds): per KV head's row "
      "(the authors' group is the token's whole projection), so per-head eviction keeps its "
      "meaning; at head_dim 64 the quantile rule keeps the largest and the smallest of each "
      "row apart (3% of values, where 4096 channels give 1%)",
      "outliers and the sink in fp16 with a 16-bit channel each, in compressed sparse rows per "
      "KV head (one int32 start per token): the authors' CSR format",
      "the context attends over itself in fp32 before it is quantized, as KIVI's prefill (the "
      "authors' simulated quantization rounds k_proj's output before the context attends); "
      "a context of fewer than 16 tokens past the sink waits in fp32 for more",
      "keys are turned back by the model's RoPE as stored and turned again per decoded tile "
      "(cos and sin from three 256-entry angle tables shared by the layers, the model's "
      "like vLLM's cos_sin_cache and not counted); the authors fuse RoPE into their kernel",
      "CPU only (no CUDA twin)",
  };
  info.params = {
      int_param("bits", 3, 2, 4, "bits per key and value code"),
      float_param("outliers", "0.01", 0, 0.5,
                  "share of values kept apart in fp16 (half above, half below the range)"),
      int_param("sink", 1, 0, kMaxTokens, "first positions kept whole in fp16 (attention sink)"),
  };
  info.make_layers = [](const MethodParams& params, const KvShape& shape) {
    return make_kvquant_layers(shape, kvquant_config_from(params));
  };
  return info;
}

}  // namespace kvbench
