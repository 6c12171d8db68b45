// A tiny random-weight llama GGUF, written by the test itself, through loader, tokenizer and
// forward pass, checked against a plain double-precision forward written out here.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "gguf_writer.h"
#include "harness/generate.h"
#include "harness/model/dequant.h"
#include "harness/model/gguf.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"

using namespace kvbench;
using testing::TinyLlamaSpec;

namespace {

// Matrix [rows, cols] from a GGUF tensor of ggml shape [cols, rows], in double.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<double> w;
  std::vector<double> apply(const std::vector<double>& x) const {
    std::vector<double> y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
    }
    return y;
  }
};

Matrix read_matrix(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo& t = f.tensor(name);
  Matrix m;
  m.cols = t.shape[0];
  m.rows = t.shape.size() > 1 ? t.shape[1] : 1;
  std::vector<float> values(t.n_elements());
  dequantize_row(t.type, t.data, values.data(), t.n_elements());
  m.w.assign(values.begin(), values.end());
  return m;
}

std::vector<double> rms_norm(const std::vector<double>& x, const Matrix& weight, double eps) {
  double sum = 0;
  for (double v : x) sum += v * v;
  const double scale = 1.0 / std::sqrt(sum / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * weight.w[i];
  return y;
}

// RoPE on adjacent pairs, one head at a time, the textbook formula.
void rope(std::vector<double>& x, int n_heads, int head_dim, int pos, double theta,
          const std::vector<double>& divisors) {
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < head_dim / 2; ++i) {
      const double freq = std::pow(theta, -2.0 * i / head_dim) / divisors[i];
      const double c = std::cos(pos * freq), s = std::sin(pos * freq);
      double& a = x[h * head_dim + 2 * i];
      double& b = x[h * head_dim + 2 * i + 1];
      const double a0 = a, b0 = b;
      a = a0 * c - b0 * s;
      b = a0 * s + b0 * c;
    }
  }
}

// Logits at every position of `tokens`, recomputing everything from the GGUF file.
std::vector<std::vector<double>> reference_logits(const std::string& path,
                                                  const std::vector<int32_t>& tokens,
                                                  const TinyLlamaSpec& spec) {
  GgufFile f(path);
  const int E = spec.n_embd, H = spec.n_head, Hkv = spec.n_head_kv, D = E / H;
  std::vector<double> divisors(D / 2, 1.0);
  if (const GgufTensorInfo* freqs = f.find_tensor("rope_freqs.weight")) {
    std::vector<float> d(D / 2);
    dequantize_row(freqs->type, freqs->data, d.data(), D / 2);
    divisors.assign(d.begin(), d.end());
  }
  const Matrix embd = read_matrix(f, "token_embd.weight");
  std::vector<std::vector<std::vector<double>>> keys(spec.n_layer), values(spec.n_layer);
  std::vector<std::vector<double>> out;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    std::vector<double> x(embd.w.begin() + tokens[pos] * E, embd.w.begin() + (tokens[pos] + 1) * E);
    for (int l = 0; l < spec.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      auto h = rms_norm(x, read_matrix(f, p + "attn_norm.weight"), spec.rms_eps);
      auto q = read_matrix(f, p + "attn_q.weight").apply(h);
      auto k = read_matrix(f, p + "attn_k.weight").apply(h);
      auto v = read_matrix(f, p + "attn_v.weight").apply(h);
      if (spec.qkv_bias) {
        for (auto [vec, name] : {std::pair{&q, "attn_q.bias"}, {&k, "attn_k.bias"}, {&v, "attn_v.bias"}}) {
          const Matrix b = read_matrix(f, p + name);
          for (size_t i = 0; i < vec->size(); ++i) (*vec)[i] += b.w[i];
        }
      }
      rope(q, H, D, static_cast<int>(pos), spec.rope_theta, divisors);
      rope(k, Hkv, D, static_cast<int>(pos), spec.rope_theta, divisors);
      keys[l].push_back(k);
      values[l].push_back(v);
      std::vector<double> attn(H * D, 0.0);
      for (int head = 0; head < H; ++head) {
        const int kvh = head / (H / Hkv);
        std::vector<double> scores;
        double best = -1e300;
        for (size_t t = 0; t <= pos; ++t) {
          double s = 0;
          for (int d = 0; d < D; ++d) s += q[head * D + d] * keys[l][t][kvh * D + d];
          scores.push_back(s / std::sqrt(static_cast<double>(D)));
          best = std::max(best, scores.back());
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - best));
        for (size_t t = 0; t <= pos; ++t) {
          for (int d = 0; d < D; ++d) attn[head * D + d] += scores[t] / total * values[l][t][kvh * D + d];
        }
      }
      auto o = read_matrix(f, p + "attn_output.weight").apply(attn);
      for (int i = 0; i < E; ++i) x[i] += o[i];
      h = rms_norm(x, read_matrix(f, p + "ffn_norm.weight"), spec.rms_eps);
      auto gate = read_matrix(f, p + "ffn_gate.weight").apply(h);
      auto up = read_matrix(f, p + "ffn_up.weight").apply(h);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      auto down = read_matrix(f, p + "ffn_down.weight").apply(gate);
      for (int i = 0; i < E; ++i) x[i] += down[i];
    }
    auto h = rms_norm(x, read_matrix(f, "output_norm.weight"), spec.rms_eps);
    out.push_back((spec.tied_embeddings ? embd : read_matrix(f, "output.weight")).apply(h));
  }
  return out;
}

std::string write_tiny(const TinyLlamaSpec& spec, const std::string& name) {
  const std::string path = testing::temp_path(name);
  testing::write_tiny_llama_gguf(path, spec);
  return path;
}

}  // namespace

TEST_CASE("tiny llama: forward pass equals a plain double-precision forward", "[unit]") {
  TinyLlamaSpec spec;
  std::string label = "Q8_0 tied";
  SECTION("Q8_0, tied embeddings") {}
  SECTION("Q4_1, separate LM head, q/k/v bias") {
    spec.weight_type = GgmlType::Q4_1;
    spec.tied_embeddings = false;
    spec.qkv_bias = true;
    label = "Q4_1 untied bias";
  }
  SECTION("F16 with llama3 rope scaling, 8 heads over 1 KV head") {
    spec.weight_type = GgmlType::F16;
    spec.llama3_rope_scaling = true;
    spec.rope_original_context_length = 32;
    spec.n_head = 8;
    spec.n_head_kv = 1;
    label = "F16 llama3";
  }
  INFO(label);
  const std::string path = write_tiny(spec, "tiny_forward.gguf");
  auto model = LlamaModel::load(path);
  CHECK(model->config().n_layers == spec.n_layer);
  CHECK(model->config().n_kv_heads == spec.n_head_kv);
  CHECK(model->config().tied_embeddings == spec.tied_embeddings);

  const std::vector<int32_t> tokens =
      model->tokenizer().encode("<|im_start|>user\nthe cat sat on the mat, then 42 more.<|im_end|>");
  REQUIRE(tokens.size() > 20);
  const auto expected = reference_logits(path, tokens, spec);
  const int64_t vocab = model->config().vocab_size;

  // Chunks of 7 exercise chunked prefill across chunk borders; the cache sees every token.
  model->prefill_chunk = 7;
  KvCache cache = make_full_cache(model->kv_shape());
  const std::vector<float> logits = model->forward(tokens, cache, /*all_logits=*/true);
  REQUIRE(logits.size() == tokens.size() * vocab);
  double max_diff = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t i = 0; i < vocab; ++i) {
      max_diff = std::max(max_diff, std::abs(logits[t * vocab + i] - expected[t][i]));
    }
  }
  // 1e-3: fp32 arithmetic (GEMM, online softmax) against double over 2 layers, logits ~O(1).
  CHECK(max_diff < 1e-3);
  CHECK(cache.next_position() == static_cast<int32_t>(tokens.size()));
  CHECK(cache.layer(0).n_tokens() == static_cast<int64_t>(tokens.size()));
}

TEST_CASE("tiny llama: one-token decode continues a prefill exactly", "[unit]") {
  const TinyLlamaSpec spec;
  auto model = LlamaModel::load(write_tiny(spec, "tiny_decode.gguf"));
  const std::vector<int32_t> tokens = model->tokenizer().encode("hello there, the model speaks");
  const int64_t vocab = model->config().vocab_size;

  KvCache whole = make_full_cache(model->kv_shape());
  const std::vector<float> all = model->forward(tokens, whole, true);

  KvCache stepwise = make_full_cache(model->kv_shape());
  const std::vector<int32_t> head(tokens.begin(), tokens.end() - 3);
  model->forward(head, stepwise);
  for (size_t t = head.size(); t < tokens.size(); ++t) {
    const std::vector<float> step = model->forward({tokens[t]}, stepwise);
    for (int64_t i = 0; i < vocab; ++i) {
      // 1e-2: decode multiplies block-format weights by activations quantized to int8 per
      // 32-block (as llama.cpp does, ~0.4% per product); prefill runs an fp32 GEMM. A cache
      // bug (wrong position, lost token) moves logits by O(1).
      REQUIRE(step[i] == Approx(all[t * vocab + i]).margin(1e-2));
    }
  }
}

TEST_CASE("tiny llama: keys stay per KV head and bytes are what the cache holds", "[unit]") {
  TinyLlamaSpec spec;
  spec.n_head = 8;
  spec.n_head_kv = 2;
  auto model = LlamaModel::load(write_tiny(spec, "tiny_bytes.gguf"));
  KvCache cache = make_full_cache(model->kv_shape());
  GenerateOptions options;
  options.max_new_tokens = 5;
  const std::vector<int32_t> prompt = model->tokenizer().encode("a few words to start");
  const GenerateResult r = generate(*model, cache, prompt, options);
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  const int64_t head_dim = spec.n_embd / spec.n_head;
  // K and V, 2 KV heads (not 8 query heads), fp32, plus an int32 position per slot.
  const int64_t per_layer =
      2 * spec.n_head_kv * capacity * head_dim * 4 + spec.n_head_kv * capacity * 4;
  CHECK(r.cache.bytes_resident == spec.n_layer * per_layer);
  CHECK(r.cache.tokens_per_layer[0] == cache.next_position());
  CHECK(r.prompt_tokens == static_cast<int64_t>(prompt.size()));
}

TEST_CASE("tiny llama: sampling is greedy at temperature 0 and reproducible with a seed",
          "[unit]") {
  auto model = LlamaModel::load(write_tiny(TinyLlamaSpec(), "tiny_sample.gguf"));
  const std::vector<int32_t> prompt = model->tokenizer().encode("sample from here");
  auto run = [&](float temperature, uint64_t seed) {
    KvCache cache = make_full_cache(model->kv_shape());
    GenerateOptions options;
    options.max_new_tokens = 12;
    options.temperature = temperature;
    options.seed = seed;
    return generate(*model, cache, prompt, options).tokens;
  };
  CHECK(run(0.f, 1) == run(0.f, 2));
  CHECK(run(1.5f, 7) == run(1.5f, 7));
  CHECK(run(1.5f, 7) != run(1.5f, 8));
}

TEST_CASE("tiny llama: bad model files and over-long inputs are InputErrors", "[unit]") {
  const std::string good = write_tiny(TinyLlamaSpec(), "tiny_bad.gguf");
  SECTION("truncated") {
    auto bytes = testing::read_file_bytes(good);
    bytes.resize(bytes.size() / 2);
    const std::string path = testing::temp_path("tiny_truncated.gguf");
    testing::write_file(path, bytes);
    CHECK_THROWS_AS(LlamaModel::load(path), InputError);
    CHECK_THROWS_WITH(LlamaModel::load(path), Catch::Contains(path));
  }
  SECTION("missing file") {
    CHECK_THROWS_AS(LlamaModel::load(testing::temp_path("no_such.gguf")), InputError);
  }
  SECTION("input longer than the context") {
    auto model = LlamaModel::load(good);
    KvCache cache = make_full_cache(model->kv_shape());
    std::vector<int32_t> tokens(model->config().context_length + 1, 5);
    CHECK_THROWS_WITH(model->forward(tokens, cache), Catch::Contains("does not fit"));
    CHECK(cache.next_position() == 0);
  }
}

TEST_CASE("model config: RoPE frequencies and hyper-parameter checks", "[unit]") {
  auto write = [](const std::string& name, double linear_factor, int32_t head_count_kv) {
    testing::GgufWriter w;
    w.add("general.architecture", testing::gguf_str("llama"));
    w.add("llama.block_count", testing::gguf_u32(1));
    w.add("llama.context_length", testing::gguf_u32(64));
    w.add("llama.embedding_length", testing::gguf_u32(32));
    w.add("llama.feed_forward_length", testing::gguf_u32(64));
    w.add("llama.attention.head_count", testing::gguf_u32(4));
    w.add("llama.attention.head_count_kv", testing::gguf_u32(head_count_kv));
    w.add("llama.rope.freq_base", testing::gguf_f32(10000.f));
    if (linear_factor > 0) {
      w.add("llama.rope.scaling.type", testing::gguf_str("linear"));
      w.add("llama.rope.scaling.factor", testing::gguf_f32(static_cast<float>(linear_factor)));
    }
    w.add_tensor("token_embd.weight", {32, 16}, GgmlType::F32, std::vector<float>(32 * 16, 0.f));
    const std::string path = testing::temp_path(name);
    w.write(path);
    return path;
  };
  const ModelConfig plain = ModelConfig::from_gguf(GgufFile(write("cfg_plain.gguf", 0, 2)));
  CHECK(plain.head_dim == 8);
  CHECK(plain.vocab_size == 16);
  REQUIRE(plain.rope_inv_freq.size() == 4);
  CHECK(plain.rope_inv_freq[0] == Approx(1.0));
  CHECK(plain.rope_inv_freq[1] == Approx(std::pow(10000.0, -2.0 / 8)));
  const ModelConfig scaled = ModelConfig::from_gguf(GgufFile(write("cfg_linear.gguf", 4, 2)));
  for (int i = 0; i < 4; ++i) CHECK(scaled.rope_inv_freq[i] == Approx(plain.rope_inv_freq[i] / 4));
  // 4 query heads cannot share 3 KV heads.
  const std::string bad = write("cfg_bad.gguf", 0, 3);
  CHECK_THROWS_WITH(ModelConfig::from_gguf(GgufFile(bad)), Catch::Contains(bad));
}

// Issue 20: int64 metadata was narrowed to int32 unchecked (block_count = 2^32 + 2 loaded as
// 2 layers), key_length = 0 was accepted, and eps, theta and the rope factors went unchecked.
TEST_CASE("model config: hostile hyper-parameters are named, not narrowed", "[unit]") {
  auto config_error = [](const std::string& key, const GgufValue& value) {
    testing::GgufWriter w;
    w.add("general.architecture", testing::gguf_str("llama"));
    const std::map<std::string, GgufValue> base = {
        {"llama.block_count", testing::gguf_u32(1)},
        {"llama.context_length", testing::gguf_u32(64)},
        {"llama.embedding_length", testing::gguf_u32(32)},
        {"llama.feed_forward_length", testing::gguf_u32(64)},
        {"llama.attention.head_count", testing::gguf_u32(4)},
        {"llama.rope.freq_base", testing::gguf_f32(10000.f)}};
    for (const auto& [k, v] : base) w.add(k, k == key ? value : v);
    if (key == "rope_freqs" || key == "rope_freqs_tiny") {  // head_dim 8: 4 divisors
      w.add_tensor("rope_freqs.weight", {4}, GgmlType::F32,
                   {1.f, 2.f, key == "rope_freqs" ? 0.f : 1e-44f, 4.f});
    } else if (!base.count(key)) {
      w.add(key, value);
    }
    w.add_tensor("token_embd.weight", {32, 16}, GgmlType::F32, std::vector<float>(32 * 16, 0.f));
    const std::string path = testing::temp_path("cfg_hostile.gguf");
    w.write(path);
    try {
      ModelConfig::from_gguf(GgufFile(path));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(config_error("llama.block_count", testing::gguf_u64((uint64_t{1} << 32) + 2))
            .find("'llama.block_count' is 4294967298") != std::string::npos);
  CHECK(config_error("llama.attention.head_count", testing::gguf_i64(-4)).find("head_count") !=
        std::string::npos);
  CHECK(config_error("llama.attention.key_length", testing::gguf_u32(0)).find("key_length' is 0") !=
        std::string::npos);
  CHECK(config_error("llama.attention.layer_norm_rms_epsilon", testing::gguf_f32(-1.f))
            .find("layer_norm_rms_epsilon") != std::string::npos);
  CHECK(config_error("llama.attention.layer_norm_rms_epsilon", testing::gguf_f32(std::nanf("")))
            .find("layer_norm_rms_epsilon") != std::string::npos);
  CHECK(config_error("llama.rope.freq_base", testing::gguf_f32(0.f)).find("freq_base") !=
        std::string::npos);
  CHECK(config_error("llama.rope.freq_base", testing::gguf_f64(1e300)).find("freq_base") !=
        std::string::npos);
  CHECK(config_error("llama.context_length", testing::gguf_u64(uint64_t{1} << 40))
            .find("context_length") != std::string::npos);
  // A rope_freqs divisor of zero would make every frequency infinite.
  CHECK(config_error("rope_freqs", GgufValue()).find("rope_freqs.weight[2] is 0") !=
        std::string::npos);
  // A divisor in range whose quotient is not (found by fuzz_gguf).
  CHECK(config_error("rope_freqs_tiny", GgufValue()).find("RoPE frequency 2 is inf") !=
        std::string::npos);
}
