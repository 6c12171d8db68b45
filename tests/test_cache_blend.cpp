// CacheBlend (harness/cache_blend.h, LlamaModel::forward_blend) on a tiny random-weight
// llama: re-rotation of cached keys, ratio 1 equal to a full prefill, ratio 0 equal to the
// re-rotated cache, and which tokens a partial blend recomputes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "common/input_error.h"
#include "gguf_writer.h"
#include "harness/cache_blend.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "kernels/cpu/layer_ops.h"

using namespace kvbench;

namespace {

// Four layers, so that layers after the selection layer (1) exist.
LlamaModel& tiny_model() {
  static const std::unique_ptr<LlamaModel> model = [] {
    testing::TinyLlamaSpec spec;
    spec.n_layer = 4;
    const std::string path = testing::temp_path("tiny_cache_blend.gguf");
    testing::write_tiny_llama_gguf(path, spec);
    return LlamaModel::load(path);
  }();
  return *model;
}

std::vector<int32_t> encode(const std::string& text) {
  return tiny_model().tokenizer().encode(text, false);
}

// One layer's stored keys (or values) as [n_tokens, n_kv_heads * head_dim], slot order
// (position order in a full cache).
std::vector<float> stored_rows(const KvCache& cache, int32_t layer, bool keys) {
  const DenseKv kv = cache.layer(layer).view();
  const int64_t width = static_cast<int64_t>(kv.n_kv_heads) * kv.head_dim;
  std::vector<float> rows(kv.n_tokens * width);
  for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
    for (int64_t t = 0; t < kv.n_tokens; ++t) {
      const float* from = (keys ? kv.k : kv.v) + (h * kv.capacity + t) * kv.head_dim;
      std::copy_n(from, kv.head_dim, rows.data() + t * width + h * kv.head_dim);
    }
  }
  return rows;
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
  return d;
}

// A chat-like header prefilled normally, then three documents blended.
struct BlendCase {
  std::vector<int32_t> header = encode("<|im_start|>system\nRead the notes.\n");
  std::vector<std::vector<int32_t>> docs = {
      encode("The code of Alpha is 314159. Rain fell."),
      encode("Beta's code is 271828; the hills were green."),
      encode("Gamma holds 161803, said the clerk.")};
  std::vector<int32_t> query = encode("What is the code of Beta?");

  std::vector<int32_t> all_doc_tokens() const {
    std::vector<int32_t> out;
    for (const auto& d : docs) out.insert(out.end(), d.begin(), d.end());
    return out;
  }
};

struct Blended {
  KvCache cache;
  BlendStats stats;
  std::vector<CachedChunk> chunks;
};

Blended blend(const BlendCase& c, double ratio) {
  const LlamaModel& model = tiny_model();
  Blended out{make_full_cache(model.kv_shape()), {}, {}};
  model.forward(c.header, out.cache);
  for (const auto& d : c.docs) out.chunks.push_back(prefill_chunk(model, d));
  std::vector<const CachedChunk*> pointers;
  for (const auto& chunk : out.chunks) pointers.push_back(&chunk);
  out.stats = blend_chunks(model, pointers, ratio, out.cache);
  return out;
}

KvCache full_prefill(const BlendCase& c) {
  KvCache cache = make_full_cache(tiny_model().kv_shape());
  std::vector<int32_t> tokens = c.header;
  const auto docs = c.all_doc_tokens();
  tokens.insert(tokens.end(), docs.begin(), docs.end());
  tiny_model().forward(tokens, cache);
  return cache;
}

// The chunks' cached KV of one layer, keys re-rotated to where the blend placed them.
std::vector<float> rerotated_rows(const Blended& b, int32_t layer, bool keys, int32_t first_pos) {
  const ModelConfig& config = tiny_model().config();
  const int64_t width = static_cast<int64_t>(config.n_kv_heads) * config.head_dim;
  std::vector<float> rows;
  int32_t pos = first_pos;
  for (const auto& chunk : b.chunks) {
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    const std::vector<float>& src = keys ? chunk.k : chunk.v;
    std::vector<float> part(src.begin() + layer * n * width, src.begin() + (layer + 1) * n * width);
    if (keys) rerotate_keys(config, part.data(), n, pos);
    rows.insert(rows.end(), part.begin(), part.end());
    pos += static_cast<int32_t>(n);
  }
  return rows;
}

}  // namespace

TEST_CASE("cache blend: a key rotated at p and re-rotated by d is the key rotated at p + d",
          "[unit]") {
  const ModelConfig& config = tiny_model().config();
  const int32_t heads = config.n_kv_heads, dim = config.head_dim;
  std::vector<float> raw(3 * heads * dim);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = std::sin(0.37f * i + 0.1f) * 2.f;
  for (const auto& [p, d] : {std::pair{0, 5}, {3, 1000}, {2000, -1990}, {7, 0}}) {
    INFO("p " << p << " d " << d);
    const std::vector<int32_t> at_p(3, p), at_pd(3, p + d);
    std::vector<float> moved = raw, direct = raw;
    rope_interleaved_cpu(moved.data(), at_p.data(), 3, heads, dim, config.rope_inv_freq.data());
    rerotate_keys(config, moved.data(), 3, d);
    rope_interleaved_cpu(direct.data(), at_pd.data(), 3, heads, dim, config.rope_inv_freq.data());
    CHECK(max_abs_diff(moved.data(), direct.data(), raw.size()) < 1e-5);
  }

  // Through the model: layer 0's keys depend on the token alone, so a chunk's standalone
  // keys re-rotated by the header's length are the keys a prefill after the header stores.
  const BlendCase c;
  const CachedChunk chunk = prefill_chunk(tiny_model(), c.docs[0]);
  KvCache after_header = make_full_cache(tiny_model().kv_shape());
  std::vector<int32_t> tokens = c.header;
  tokens.insert(tokens.end(), c.docs[0].begin(), c.docs[0].end());
  tiny_model().forward(tokens, after_header);
  const int64_t n = static_cast<int64_t>(c.docs[0].size());
  const int64_t width = static_cast<int64_t>(heads) * dim;
  std::vector<float> k0(chunk.k.begin(), chunk.k.begin() + n * width);
  rerotate_keys(config, k0.data(), n, static_cast<int32_t>(c.header.size()));
  const std::vector<float> fresh = stored_rows(after_header, 0, true);
  CHECK(max_abs_diff(k0.data(), fresh.data() + c.header.size() * width, n * width) < 1e-5);
}

TEST_CASE("cache blend: ratio 1 equals a full prefill, KV and next-token logits", "[unit]") {
  const BlendCase c;
  LlamaModel& model = tiny_model();
  // Chunks of 16 rows cross the documents' borders in both the full and the partial layers.
  model.prefill_chunk = 16;
  Blended b = blend(c, 1.0);
  KvCache full = full_prefill(c);
  model.prefill_chunk = 512;

  const int64_t n = static_cast<int64_t>(c.all_doc_tokens().size());
  CHECK(b.stats.tokens == n);
  CHECK(b.stats.recomputed == n);
  CHECK(b.cache.next_position() == full.next_position());
  for (int32_t l = 0; l < model.config().n_layers; ++l) {
    for (bool keys : {true, false}) {
      INFO("layer " << l << (keys ? " keys" : " values"));
      const auto got = stored_rows(b.cache, l, keys), want = stored_rows(full, l, keys);
      REQUIRE(got.size() == want.size());
      CHECK(max_abs_diff(got.data(), want.data(), got.size()) < 1e-4);
    }
  }
  const auto blended_logits = model.forward(c.query, b.cache);
  const auto full_logits = model.forward(c.query, full);
  CHECK(max_abs_diff(blended_logits.data(), full_logits.data(), full_logits.size()) < 1e-4);
}

TEST_CASE("cache blend: ratio 0 stores exactly the re-rotated cached KV and recomputes nothing",
          "[unit]") {
  const BlendCase c;
  Blended b = blend(c, 0.0);
  CHECK(b.stats.recomputed == 0);
  const int32_t first = static_cast<int32_t>(c.header.size());
  const int64_t width =
      static_cast<int64_t>(tiny_model().config().n_kv_heads) * tiny_model().config().head_dim;
  for (int32_t l = 0; l < tiny_model().config().n_layers; ++l) {
    for (bool keys : {true, false}) {
      INFO("layer " << l << (keys ? " keys" : " values"));
      const auto stored = stored_rows(b.cache, l, keys);
      const auto cached = rerotated_rows(b, l, keys, first);
      REQUIRE(stored.size() == first * width + cached.size());
      CHECK(std::equal(cached.begin(), cached.end(), stored.begin() + first * width));
    }
  }
}

TEST_CASE("cache blend: the recompute count is ceil(ratio * n)", "[unit]") {
  CHECK(LlamaModel::recompute_count(0.0, 100) == 0);
  CHECK(LlamaModel::recompute_count(1.0, 100) == 100);
  CHECK(LlamaModel::recompute_count(0.15, 100) == 15);  // not 16 from 0.15's binary excess
  CHECK(LlamaModel::recompute_count(0.15, 7) == 2);
  CHECK(LlamaModel::recompute_count(1e-6, 10) == 1);
  const BlendCase c;
  const int64_t n = static_cast<int64_t>(c.all_doc_tokens().size());
  for (double ratio : {0.1, 0.15, 0.5}) {
    INFO("ratio " << ratio);
    CHECK(blend(c, ratio).stats.recomputed == static_cast<int64_t>(std::ceil(ratio * n - 1e-9)));
  }
}

TEST_CASE("cache blend: the tokens recomputed are those whose layer-1 keys deviate most",
          "[unit]") {
  const BlendCase c;
  const ModelConfig& config = tiny_model().config();
  const int64_t width = static_cast<int64_t>(config.n_kv_heads) * config.head_dim;
  const int32_t first = static_cast<int32_t>(c.header.size());
  const double ratio = 0.3;
  Blended b = blend(c, ratio);
  KvCache full = full_prefill(c);
  const int64_t n = b.stats.tokens;

  // Layers up to the selection layer are computed in full: equal to a full prefill.
  for (int32_t l = 0; l <= 1; ++l) {
    const auto got = stored_rows(b.cache, l, true), want = stored_rows(full, l, true);
    CHECK(max_abs_diff(got.data(), want.data(), got.size()) < 1e-4);
  }
  // The expected choice: fresh layer-1 keys (the full prefill's) against the cached ones.
  const auto fresh = stored_rows(full, 1, true);
  const auto cached1 = rerotated_rows(b, 1, true, first);
  std::vector<std::pair<double, int64_t>> deviation;
  for (int64_t t = 0; t < n; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < width; ++j) {
      const double d = fresh[(first + t) * width + j] - cached1[t * width + j];
      sum += d * d;
    }
    deviation.emplace_back(-sum, t);
  }
  std::sort(deviation.begin(), deviation.end());
  std::vector<bool> expected(n, false);
  for (int64_t i = 0; i < b.stats.recomputed; ++i) expected[deviation[i].second] = true;

  // In the later layers a recomputed token's KV is fresh (so it differs from the cache),
  // every other token's is the cached one exactly.
  for (int32_t l = 2; l < config.n_layers; ++l) {
    const auto stored = stored_rows(b.cache, l, false);
    const auto cached = rerotated_rows(b, l, false, first);
    for (int64_t t = 0; t < n; ++t) {
      INFO("layer " << l << " token " << t);
      const bool same = std::equal(cached.begin() + t * width, cached.begin() + (t + 1) * width,
                                   stored.begin() + (first + t) * width);
      CHECK(same == !expected[t]);
    }
  }
}

TEST_CASE("cache blend: bad ratio, layer or empty input is an InputError", "[unit]") {
  const LlamaModel& model = tiny_model();
  const CachedChunk chunk = prefill_chunk(model, encode("some words"));
  KvCache cache = make_full_cache(model.kv_shape());
  CHECK_THROWS_AS(blend_chunks(model, {&chunk}, 1.5, cache), InputError);
  CHECK_THROWS_AS(blend_chunks(model, {&chunk}, -0.1, cache), InputError);
  CHECK_THROWS_AS(blend_chunks(model, {&chunk}, 0.2, cache, 4), InputError);
  CHECK_THROWS_AS(blend_chunks(model, {}, 0.2, cache), InputError);
  CHECK(cache.next_position() == 0);
  CHECK(chunk.bytes() == static_cast<int64_t>(chunk.tokens.size() * 4 + chunk.k.size() * 8));
}

TEST_CASE("cache blend: a chunk prefilled after a header, rotated back to position 0",
          "[unit]") {
  // Layer 0's keys and values depend on a token and its position only: after rotating back
  // they equal a standalone prefill's; deeper layers saw the header, so they differ.
  const LlamaModel& model = tiny_model();
  const std::vector<int32_t> header = encode("<|im_start|>user\n");
  const std::vector<int32_t> tokens = encode("the access code of project maple is 4417.");
  const CachedChunk alone = prefill_chunk(model, tokens);
  const CachedChunk after = prefill_chunk_after(model, header, tokens);
  REQUIRE(after.tokens == tokens);
  REQUIRE(after.k.size() == alone.k.size());
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t layer_floats = n * model.config().n_kv_heads * model.config().head_dim;
  float first = 0, deeper = 0;
  for (int64_t i = 0; i < layer_floats; ++i) {
    first = std::max({first, std::abs(after.k[i] - alone.k[i]), std::abs(after.v[i] - alone.v[i])});
    deeper = std::max(deeper, std::abs(after.v[layer_floats + i] - alone.v[layer_floats + i]));
  }
  CHECK(first < 1e-4f);
  CHECK(deeper > 1e-3f);
  CHECK(prefill_chunk_after(model, {}, tokens).k == alone.k);
}
