#include "methods/zipcache.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "cache/full_cache.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/scores.h"

namespace kvbench {

namespace {

// Asymmetric min/max quantization of n values x[i * stride] to `bits`, packed low bits first
// into `codes` (value i in byte i / (8 / bits) at bit (i % (8 / bits)) * bits), as
// QuantGroups packs. A constant run gets step 0 and codes 0.
void quantize_run(const float* x, int64_t stride, int64_t n, int32_t bits, uint8_t* codes,
                  float* min_out, float* step_out) {
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  const int32_t levels = (1 << bits) - 1, per_byte = 8 / bits;
  const float step = hi > lo ? (hi - lo) / levels : 0.f;
  std::memset(codes, 0, static_cast<size_t>((n * bits + 7) / 8));
  for (int64_t i = 0; step > 0 && i < n; ++i) {
    const int32_t q =
        std::clamp(static_cast<int32_t>(std::nearbyint((x[i * stride] - lo) / step)), 0, levels);
    codes[i / per_byte] |= static_cast<uint8_t>(q << ((i % per_byte) * bits));
  }
  *min_out = lo;
  *step_out = step;
}

int32_t code_at(const uint8_t* codes, int64_t i, int32_t bits) {
  const int32_t per_byte = 8 / bits;
  return (codes[i / per_byte] >> ((i % per_byte) * bits)) & ((1 << bits) - 1);
}

}  // namespace

ZipCacheLayerKv::ZipCacheLayerKv(int32_t n_kv_heads, int32_t head_dim, const ZipCacheConfig& config)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      config_(config),
      waiting_(n_kv_heads, head_dim) {
  assert(head_dim % 8 == 0);
}

void ZipCacheLayerKv::reserve(int64_t n_tokens) {
  if (n_tokens > waiting_.capacity) waiting_.reallocate(n_tokens);
}

void ZipCacheLayerKv::append(const float* k, const float* v, const int32_t* positions,
                             int64_t n_new) {
  if (waiting_.n_tokens + n_new > waiting_.capacity) {
    waiting_.reallocate(
        grown_capacity(waiting_.capacity, waiting_.n_tokens + n_new, /*evicted=*/false));
  }
  waiting_.append(k, v, positions, n_new);
}

int32_t ZipCacheLayerKv::row_bits(const Batch& b, int64_t row) const {
  return row < b.n_high ? config_.high_bits : config_.low_bits;
}

int64_t ZipCacheLayerKv::row_code_offset(const Batch& b, int64_t row) const {
  const int64_t high = std::min(row, b.n_high), low = row - high;
  return (high * config_.high_bits + low * config_.low_bits) * head_dim_ / 8;
}

int64_t ZipCacheLayerKv::head_code_bytes(const Batch& b) const {
  return row_code_offset(b, b.rows());
}

int64_t ZipCacheLayerKv::Batch::bytes() const {
  const auto bytes = [](const auto& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(v[0]));
  };
  return bytes(k_codes) + bytes(v_codes) + bytes(k_min) + bytes(k_step) + bytes(v_scale) +
         bytes(v_min) + bytes(v_step) + bytes(positions);
}

// Every waiting row joins a new batch: per KV head, the planned rows at high_bits (in plan
// order), the others at low_bits (in slot order). Nothing is dropped, so plan.slots stays.
void ZipCacheLayerKv::retain(RetainPlan& plan) {
  assert(plan.k.empty());
  const int64_t d = head_dim_, n = waiting_.n_tokens, n_keep = plan.n_keep;
  Batch b;
  b.n_high = n_keep;
  b.n_low = n - n_keep;
  const int64_t rows = b.rows();
  const int64_t code_bytes = head_code_bytes(b);
  b.k_codes.assign(static_cast<size_t>(n_kv_heads_ * code_bytes), 0);
  b.v_codes.assign(b.k_codes.size(), 0);
  b.k_min.resize(static_cast<size_t>(n_kv_heads_ * 2 * d));
  b.k_step.resize(b.k_min.size());
  b.v_scale.resize(static_cast<size_t>(n_kv_heads_ * d));
  b.v_min.resize(static_cast<size_t>(n_kv_heads_ * rows));
  b.v_step.resize(b.v_min.size());
  b.positions.resize(b.v_min.size());

  std::vector<float> k(static_cast<size_t>(rows * d)), v(k.size()),
      column(static_cast<size_t>(rows));
  std::vector<char> kept(static_cast<size_t>(n));
  std::vector<uint8_t> channel_codes(static_cast<size_t>(rows));
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    // The head's rows in batch order: salient first.
    const int32_t* slots = plan.slots.data() + h * n_keep;
    std::fill(kept.begin(), kept.end(), 0);
    std::vector<int64_t> order(slots, slots + n_keep);
    for (int64_t j = 0; j < n_keep; ++j) kept[slots[j]] = 1;
    for (int64_t s = 0; s < n; ++s) {
      if (!kept[s]) order.push_back(s);
    }
    const size_t head = static_cast<size_t>(h) * waiting_.capacity;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&k[r * d], &waiting_.k[(head + order[r]) * d], d * sizeof(float));
      std::memcpy(&v[r * d], &waiting_.v[(head + order[r]) * d], d * sizeof(float));
      b.positions[h * rows + r] = waiting_.positions[head + order[r]];
    }
    uint8_t* k_codes = &b.k_codes[h * code_bytes];
    uint8_t* v_codes = &b.v_codes[h * code_bytes];
    // Keys: each channel over each class's rows; the codes land in their rows.
    for (int32_t cls = 0; cls < 2; ++cls) {
      const int64_t first = cls == 0 ? 0 : b.n_high, count = cls == 0 ? b.n_high : b.n_low;
      const int32_t bits = cls == 0 ? config_.high_bits : config_.low_bits;
      if (count == 0) {
        std::fill_n(&b.k_min[(h * 2 + cls) * d], d, 0.f);
        std::fill_n(&b.k_step[(h * 2 + cls) * d], d, 0.f);
        continue;
      }
      for (int64_t c = 0; c < d; ++c) {
        std::vector<uint8_t> packed(static_cast<size_t>((count * bits + 7) / 8));
        quantize_run(&k[first * d + c], d, count, bits, packed.data(),
                     &b.k_min[(h * 2 + cls) * d + c], &b.k_step[(h * 2 + cls) * d + c]);
        for (int64_t r = 0; r < count; ++r) {
          const int32_t q = code_at(packed.data(), r, bits);
          const int64_t i = c;  // value c of row first + r
          k_codes[row_code_offset(b, first + r) + i / (8 / bits)] |=
              static_cast<uint8_t>(q << ((i % (8 / bits)) * bits));
        }
      }
    }
    // Values: channels divided by sqrt(max |v|) over the batch, then each row on its own.
    for (int64_t c = 0; c < d; ++c) {
      float peak = 0;
      for (int64_t r = 0; r < rows; ++r) peak = std::max(peak, std::fabs(v[r * d + c]));
      const float scale = peak > 0 ? std::sqrt(peak) : 1.f;
      b.v_scale[h * d + c] = scale;
      for (int64_t r = 0; r < rows; ++r) v[r * d + c] /= scale;
    }
    for (int64_t r = 0; r < rows; ++r) {
      quantize_run(&v[r * d], 1, d, row_bits(b, r), v_codes + row_code_offset(b, r),
                   &b.v_min[h * rows + r], &b.v_step[h * rows + r]);
    }
  }
  batches_.push_back(std::move(b));
  waiting_.n_tokens = 0;
  // Room for the rows the next batch gathers (a longer forward grows it again).
  if (waiting_.capacity != config_.gap) waiting_.reallocate(config_.gap);
}

void ZipCacheLayerKv::widen_batch(const Batch& b, int32_t h, float* k, float* v,
                                  int32_t* positions) const {
  const int64_t d = head_dim_, rows = b.rows(), code_bytes = head_code_bytes(b);
  const uint8_t* k_codes = &b.k_codes[h * code_bytes];
  const uint8_t* v_codes = &b.v_codes[h * code_bytes];
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t bits = row_bits(b, r), cls = r < b.n_high ? 0 : 1;
    const uint8_t* kc = k_codes + row_code_offset(b, r);
    const uint8_t* vc = v_codes + row_code_offset(b, r);
    const float* k_min = &b.k_min[(h * 2 + cls) * d];
    const float* k_step = &b.k_step[(h * 2 + cls) * d];
    const float v_min = b.v_min[h * rows + r], v_step = b.v_step[h * rows + r];
    for (int64_t c = 0; c < d; ++c) {
      k[r * d + c] = k_min[c] + code_at(kc, c, bits) * k_step[c];
      v[r * d + c] = (v_min + code_at(vc, c, bits) * v_step) * b.v_scale[h * d + c];
    }
    positions[r] = b.positions[h * rows + r];
  }
}

DenseKv ZipCacheLayerKv::widen(std::vector<float>& k, std::vector<float>& v,
                               std::vector<int32_t>& positions) const {
  const int64_t total = n_tokens_held(), d = head_dim_;
  k.resize(static_cast<size_t>(n_kv_heads_ * total * d));
  v.resize(k.size());
  positions.resize(static_cast<size_t>(n_kv_heads_ * total));
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    int64_t row = h * total;
    for (const Batch& b : batches_) {
      widen_batch(b, h, &k[row * d], &v[row * d], &positions[row]);
      row += b.rows();
    }
    const size_t from = static_cast<size_t>(h) * waiting_.capacity;
    std::memcpy(&k[row * d], &waiting_.k[from * d], waiting_.n_tokens * d * sizeof(float));
    std::memcpy(&v[row * d], &waiting_.v[from * d], waiting_.n_tokens * d * sizeof(float));
    std::memcpy(&positions[row], &waiting_.positions[from], waiting_.n_tokens * sizeof(int32_t));
  }
  return DenseKv{k.data(), v.data(), positions.data(), n_kv_heads_, head_dim_, total, total};
}

int64_t ZipCacheLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  assert(pages == nullptr);  // no retrieval composes with zipcache (its own policy plans)
  (void)pages;
  const int64_t row_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
  if (batches_.empty()) {
    attention_dense_cpu(query, waiting_.view());
    return n_kv_heads_ * waiting_.n_tokens * row_bytes;
  }
  std::vector<float> k, v;  // held for this call only
  std::vector<int32_t> positions;
  attention_dense_cpu(query, widen(k, v, positions));
  int64_t bytes = n_kv_heads_ * waiting_.n_tokens * row_bytes;
  for (const Batch& b : batches_) bytes += b.bytes();
  return bytes;
}

std::unique_ptr<LayerKv> ZipCacheLayerKv::clone() const {
  return std::make_unique<ZipCacheLayerKv>(*this);
}

int64_t ZipCacheLayerKv::n_tokens_held() const {
  int64_t n = waiting_.n_tokens;
  for (const Batch& b : batches_) n += b.rows();
  return n;
}

int64_t ZipCacheLayerKv::bytes_resident() const {
  int64_t bytes = waiting_.bytes();
  for (const Batch& b : batches_) bytes += b.bytes();
  return bytes;
}

namespace {

// Picks each batch's salient tokens: normalized attention, per KV head, over the waiting rows
// (the store's view). Plans at the end of the context and whenever `gap` rows wait after it;
// a plan keeps the salient rows, and the store quantizes all of them.
class ZipCachePolicy : public TokenPolicy {
 public:
  ZipCachePolicy(const ZipCacheConfig& config, const KvShape& shape)
      : config_(config), n_kv_heads_(shape.n_kv_heads), layers_(shape.n_layers) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ZipCachePolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    Saliency& s = layers_[layer];
    s.n_heads = query.n_heads;
    grow(s, kv.n_tokens);
    attention_scores_cpu(query, kv, s.attention.data());
    // Queries that can see each slot (the waiting rows are the same tokens in every head).
    for (int64_t t = 0; t < kv.n_tokens; ++t) {
      for (int32_t i = 0; i < query.n_queries; ++i) {
        s.seen[t] += query.q_positions[i] >= kv.positions[t] ? 1 : 0;
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    const int64_t n = kv.n_tokens;
    if (phase == CachePhase::ContextChunk || n == 0) return false;
    if (phase == CachePhase::AfterContext && n < config_.gap) return false;
    Saliency& s = layers_[layer];
    grow(s, n);
    std::vector<float> saliency(static_cast<size_t>(n_kv_heads_ * n), 0.f);
    const int32_t group = std::max(1, s.n_heads / n_kv_heads_);
    for (int32_t h = 0; h < s.n_heads; ++h) {
      for (int64_t t = 0; t < n; ++t) saliency[(h / group) * n + t] += s.attention[h * n + t];
    }
    for (int32_t g = 0; g < n_kv_heads_; ++g) {
      for (int64_t t = 0; t < n; ++t) saliency[g * n + t] /= std::max<int64_t>(1, s.seen[t]);
    }
    const int64_t n_low = static_cast<int64_t>(std::floor(config_.low_ratio * n + 1e-9));
    plan_top_k_per_head(saliency.data(), n_kv_heads_, n, n - n_low, plan);
    return true;
  }

  // The store quantized every waiting row: scores start over for the next batch.
  void retained(int32_t layer, const RetainPlan&) override {
    Saliency& s = layers_[layer];
    s = Saliency{{}, {}, 0, s.n_heads};  // buffers freed
  }

  int64_t bytes_resident(int32_t layer) const override {
    return vector_bytes(layers_[layer].attention) + vector_bytes(layers_[layer].seen);
  }

 private:
  struct Saliency {
    std::vector<float> attention;  // [n_heads, n_tokens] summed over queries
    std::vector<int64_t> seen;     // [n_tokens] queries that could see each slot
    int64_t n_tokens = 0;
    int32_t n_heads = 0;
  };

  static void grow(Saliency& s, int64_t n) {
    if (n <= s.n_tokens) return;
    const int64_t old = s.n_tokens;
    std::vector<float> attention(static_cast<size_t>(s.n_heads * n), 0.f);
    for (int32_t h = 0; h < s.n_heads && old > 0; ++h) {
      std::copy_n(s.attention.begin() + h * old, old, attention.begin() + h * n);
    }
    s.attention.swap(attention);
    std::vector<int64_t> seen(static_cast<size_t>(n), 0);  // exact, as a copy holds it
    std::copy_n(s.seen.begin(), old, seen.begin());
    s.seen.swap(seen);
    s.n_tokens = n;
  }

  ZipCacheConfig config_;
  int32_t n_kv_heads_;
  std::vector<Saliency> layers_;
};

ZipCacheConfig zipcache_config_from(const MethodParams& params) {
  ZipCacheConfig config;
  config.high_bits = static_cast<int32_t>(params.get_int("high_bits"));
  config.low_bits = static_cast<int32_t>(params.get_int("low_bits"));
  config.low_ratio = params.get_float("low_ratio");
  config.gap = params.get_int("gap");
  return config;
}

}  // namespace

// Registered as `zipcache` (methods/method_list.cpp).
MethodInfo zipcache_method() {
  MethodInfo info;
  info.name = "zipcache";
  info.kind = MethodKind::Storage;
  info.stage = "2 storage: the whole context quantized when it ends, later tokens `gap` at a time";
  info.summary =
      "every token quantized: the salient ones (normalized attention) to high_bits, the "
      "low_ratio least salient to low_bits; keys per channel, values per token after a "
      "per-channel scale";
  info.paper =
      "ZipCache: Accurate and Efficient KV Cache Quantization with Salient Token "
      "Identification (He et al., NeurIPS 2024), arXiv 2405.14256";
  info.choices = {
      "saliency from every query of the context (the authors' code estimates it from probe "
      "queries: the last 5% of the prompt plus a random 5%)",
      "key channel ranges and per-token value groups per KV head (the code flattens the heads "
      "into one channel axis)",
      "tokens after the context wait in fp32 until `gap` gather, then are scored by normalized "
      "attention and quantized as a batch of their own (the code re-quantizes the whole cache "
      "every streaming_gap steps, scoring new tokens by the current query alone)",
      "attention widens the quantized batches into a scratch for each call and runs the dense "
      "kernel, as the code decompresses before flash attention (the scratch is not held)",
      "chooses its own precision classes, so no eviction method composes in front",
  };
  info.params = {
      choice_param("high_bits", "4", {"2", "4", "8"}, "bits of the salient tokens"),
      choice_param("low_bits", "2", {"2", "4", "8"}, "bits of the rest"),
      float_param("low_ratio", "0.4", 0, 1, "share of each batch's tokens at low_bits"),
      int_param("gap", 100, 1, kMaxTokens, "tokens after the context quantized together"),
  };
  info.make_layers = [](const MethodParams& params, const KvShape& shape) {
    if (shape.head_dim % 8 != 0) {  // a row's codes fill whole bytes at any bit width
      throw InputError("zipcache packs rows of 8 channels, but head_dim is " +
                       std::to_string(shape.head_dim));
    }
    const ZipCacheConfig config = zipcache_config_from(params);
    std::vector<std::unique_ptr<LayerKv>> layers;
    for (int32_t i = 0; i < shape.n_layers; ++i) {
      layers.push_back(std::make_unique<ZipCacheLayerKv>(shape.n_kv_heads, shape.head_dim, config));
    }
    return layers;
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::make_unique<ZipCachePolicy>(zipcache_config_from(params), shape);
  };
  return info;
}

}  // namespace kvbench
