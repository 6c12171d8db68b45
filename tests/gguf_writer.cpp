#include "gguf_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "harness/model/dequant.h"
#include "harness/model/unicode.h"

// ggml's reference quantizers round each multiply and add separately; a fused
// multiply-add would move a value across a rounding boundary now and then.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace kvbench::testing {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
constexpr int kQK = 32;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.insert(out.end(), buf, buf + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// One scalar of type t, narrowed from the widened value the reader uses.
void put_unsigned(std::vector<uint8_t>& out, GgufValueType t, uint64_t v) {
  switch (t) {
    case GgufValueType::UINT8:
      put<uint8_t>(out, static_cast<uint8_t>(v));
      break;
    case GgufValueType::UINT16:
      put<uint16_t>(out, static_cast<uint16_t>(v));
      break;
    case GgufValueType::UINT32:
      put<uint32_t>(out, static_cast<uint32_t>(v));
      break;
    default:
      put<uint64_t>(out, v);
  }
}

void put_signed(std::vector<uint8_t>& out, GgufValueType t, int64_t v) {
  switch (t) {
    case GgufValueType::INT8:
      put<int8_t>(out, static_cast<int8_t>(v));
      break;
    case GgufValueType::INT16:
      put<int16_t>(out, static_cast<int16_t>(v));
      break;
    case GgufValueType::INT32:
      put<int32_t>(out, static_cast<int32_t>(v));
      break;
    default:
      put<int64_t>(out, v);
  }
}

void put_float(std::vector<uint8_t>& out, GgufValueType t, double v) {
  if (t == GgufValueType::FLOAT32) {
    put<float>(out, static_cast<float>(v));
  } else {
    put<double>(out, v);
  }
}

void put_value(std::vector<uint8_t>& out, const GgufValue& value) {
  struct Visitor {
    std::vector<uint8_t>& out;
    const GgufValue& v;
    void operator()(uint64_t x) { put_unsigned(out, v.type, x); }
    void operator()(int64_t x) { put_signed(out, v.type, x); }
    void operator()(double x) { put_float(out, v.type, x); }
    void operator()(bool x) { put<uint8_t>(out, x ? 1 : 0); }
    void operator()(const std::string& x) { put_string(out, x); }
    void header(size_t n) {
      put<uint32_t>(out, static_cast<uint32_t>(v.array_type));
      put<uint64_t>(out, n);
    }
    void operator()(const std::vector<uint64_t>& x) {
      header(x.size());
      for (uint64_t e : x) put_unsigned(out, v.array_type, e);
    }
    void operator()(const std::vector<int64_t>& x) {
      header(x.size());
      for (int64_t e : x) put_signed(out, v.array_type, e);
    }
    void operator()(const std::vector<double>& x) {
      header(x.size());
      for (double e : x) put_float(out, v.array_type, e);
    }
    void operator()(const std::vector<bool>& x) {
      header(x.size());
      for (bool e : x) put<uint8_t>(out, e ? 1 : 0);
    }
    void operator()(const std::vector<std::string>& x) {
      header(x.size());
      for (const std::string& e : x) put_string(out, e);
    }
  };
  std::visit(Visitor{out, value}, value.value);
}

template <typename T>
GgufValue scalar(GgufValueType type, T v) {
  GgufValue out;
  out.type = type;
  out.value = std::move(v);
  return out;
}

template <typename Vec>
GgufValue array_of(GgufValueType elem, Vec v) {
  GgufValue out;
  out.type = GgufValueType::ARRAY;
  out.array_type = elem;
  out.value = std::move(v);
  return out;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// ggml_compute_fp32_to_bf16: NaN forced quiet, everything else rounded to nearest even.
uint16_t fp32_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7FFF + ((u >> 16) & 1))) >> 16);
}

void quantize_q8_0(const float* x, int64_t n, std::vector<uint8_t>& out) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* b = x + i * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(b[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put<uint16_t>(out, fp32_to_fp16(d));
    for (int j = 0; j < kQK; ++j) put<int8_t>(out, static_cast<int8_t>(std::round(b[j] * id)));
  }
}

void quantize_q4_0(const float* x, int64_t n, std::vector<uint8_t>& out) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* b = x + i * kQK;
    // The signed value of largest magnitude (first one on ties) maps to -8.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(b[j])) {
        amax = std::fabs(b[j]);
        max = b[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put<uint16_t>(out, fp32_to_fp16(d));
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(b[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(b[j + kQK / 2] * id + 8.5f));
      put<uint8_t>(out, static_cast<uint8_t>(lo | (hi << 4)));
    }
  }
}

void quantize_q4_1(const float* x, int64_t n, std::vector<uint8_t>& out) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* b = x + i * kQK;
    float min = b[0];
    float max = b[0];
    for (int j = 1; j < kQK; ++j) {
      min = std::min(min, b[j]);
      max = std::max(max, b[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put<uint16_t>(out, fp32_to_fp16(d));
    put<uint16_t>(out, fp32_to_fp16(min));
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>((b[j] - min) * id + 0.5f));
      const int hi = std::min(15, static_cast<int>((b[j + kQK / 2] - min) * id + 0.5f));
      put<uint8_t>(out, static_cast<uint8_t>(lo | (hi << 4)));
    }
  }
}

// Normal deviates from mt19937 through Box-Muller, so the weights are the same with every
// standard library (std::normal_distribution is not specified bit for bit).
class NormalRng {
 public:
  explicit NormalRng(uint32_t seed) : gen_(seed) {}
  float next(float mean, float std) {
    const double u1 = (static_cast<double>(gen_()) + 0.5) / 4294967296.0;
    const double u2 = (static_cast<double>(gen_()) + 0.5) / 4294967296.0;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return static_cast<float>(mean + std * z);
  }
  std::vector<float> fill(int64_t n, float mean, float std) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = next(mean, std);
    return v;
  }

 private:
  std::mt19937 gen_;
};

}  // namespace

GgufValue gguf_u8(uint8_t v) { return scalar(GgufValueType::UINT8, uint64_t{v}); }
GgufValue gguf_i8(int8_t v) { return scalar(GgufValueType::INT8, int64_t{v}); }
GgufValue gguf_u16(uint16_t v) { return scalar(GgufValueType::UINT16, uint64_t{v}); }
GgufValue gguf_i16(int16_t v) { return scalar(GgufValueType::INT16, int64_t{v}); }
GgufValue gguf_u32(uint32_t v) { return scalar(GgufValueType::UINT32, uint64_t{v}); }
GgufValue gguf_i32(int32_t v) { return scalar(GgufValueType::INT32, int64_t{v}); }
GgufValue gguf_u64(uint64_t v) { return scalar(GgufValueType::UINT64, v); }
GgufValue gguf_i64(int64_t v) { return scalar(GgufValueType::INT64, v); }
GgufValue gguf_f32(float v) { return scalar(GgufValueType::FLOAT32, double{v}); }
GgufValue gguf_f64(double v) { return scalar(GgufValueType::FLOAT64, v); }
GgufValue gguf_bool(bool v) { return scalar(GgufValueType::BOOL, v); }
GgufValue gguf_str(const std::string& v) { return scalar(GgufValueType::STRING, v); }

GgufValue gguf_array(GgufValueType elem, std::vector<uint64_t> v) {
  return array_of(elem, std::move(v));
}
GgufValue gguf_array(GgufValueType elem, std::vector<int64_t> v) {
  return array_of(elem, std::move(v));
}
GgufValue gguf_array(GgufValueType elem, std::vector<double> v) {
  return array_of(elem, std::move(v));
}
GgufValue gguf_array(std::vector<bool> v) { return array_of(GgufValueType::BOOL, std::move(v)); }
GgufValue gguf_array(std::vector<std::string> v) {
  return array_of(GgufValueType::STRING, std::move(v));
}

std::vector<uint8_t> quantize(GgmlType type, const float* x, int64_t n) {
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(ggml_row_bytes(type, n)));
  switch (type) {
    case GgmlType::F32:
      for (int64_t i = 0; i < n; ++i) put<float>(out, x[i]);
      break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, fp32_to_fp16(x[i]));
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, fp32_to_bf16(x[i]));
      break;
    case GgmlType::Q8_0:
      quantize_q8_0(x, n, out);
      break;
    case GgmlType::Q4_0:
      quantize_q4_0(x, n, out);
      break;
    case GgmlType::Q4_1:
      quantize_q4_1(x, n, out);
      break;
    default:
      throw std::invalid_argument(std::string("quantize: type ") + ggml_type_name(type) +
                                  " is not supported by the test writer");
  }
  return out;
}

GgufWriter::GgufWriter(uint32_t version, uint32_t alignment)
    : version_(version), alignment_(alignment) {
  if (alignment != 32) add("general.alignment", gguf_u32(alignment));
}

void GgufWriter::add(const std::string& key, const GgufValue& value) {
  std::vector<uint8_t> kv;
  put_string(kv, key);
  put<uint32_t>(kv, static_cast<uint32_t>(value.type));
  put_value(kv, value);
  kv_.push_back(std::move(kv));
}

void GgufWriter::add_raw(const std::string& key, GgufValueType type, std::vector<uint8_t> payload) {
  std::vector<uint8_t> kv;
  put_string(kv, key);
  put<uint32_t>(kv, static_cast<uint32_t>(type));
  kv.insert(kv.end(), payload.begin(), payload.end());
  kv_.push_back(std::move(kv));
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                            const std::vector<float>& values) {
  add_tensor_bytes(name, std::move(shape), type,
                   quantize(type, values.data(), static_cast<int64_t>(values.size())));
}

void GgufWriter::add_tensor_bytes(const std::string& name, std::vector<int64_t> shape,
                                  GgmlType type, std::vector<uint8_t> bytes) {
  tensors_.push_back(Tensor{name, std::move(shape), type, std::move(bytes)});
}

std::vector<uint8_t> GgufWriter::bytes() const {
  std::vector<uint8_t> out;
  put<uint32_t>(out, kGgufMagic);
  put<uint32_t>(out, version_);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& kv : kv_) out.insert(out.end(), kv.begin(), kv.end());
  auto pad = [this](uint64_t n) { return (n + alignment_ - 1) / alignment_ * alignment_; };
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put<int64_t>(out, d);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset = pad(offset + t.data.size());
  }
  if (tensors_.empty()) return out;
  out.resize(pad(out.size()), 0);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    if (&t != &tensors_.back()) out.resize(pad(out.size()), 0);
  }
  return out;
}

void GgufWriter::write(const std::string& path) const { write_file(path, bytes()); }

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string temp_path(const std::string& file_name) {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string templ =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/kvbench_test_XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    return templ;
  }();
  return dir + "/" + file_name;
}

std::vector<uint8_t> small_gguf_bytes() {
  GgufWriter w(3);
  w.add("general.architecture", gguf_str("llama"));
  w.add("test.u8", gguf_u8(200));
  w.add("test.i8", gguf_i8(-100));
  w.add("test.u16", gguf_u16(60000));
  w.add("test.i16", gguf_i16(-30000));
  w.add("test.u32", gguf_u32(4000000000u));
  w.add("test.i32", gguf_i32(-2000000000));
  w.add("test.f32", gguf_f32(0.25f));
  w.add("test.bool", gguf_bool(true));
  w.add("test.u64", gguf_u64(1ull << 40));
  w.add("test.i64", gguf_i64(-(1ll << 40)));
  w.add("test.f64", gguf_f64(-1.5));
  w.add("test.strings", gguf_array(std::vector<std::string>{"a", "bc", ""}));
  w.add("test.ints", gguf_array(GgufValueType::INT32, std::vector<int64_t>{1, -2, 3}));
  std::vector<float> norm(8);
  for (int i = 0; i < 8; ++i) norm[i] = 1.0f + 0.125f * static_cast<float>(i);
  w.add_tensor("norm.weight", {8}, GgmlType::F32, norm);
  std::vector<float> mat(64);
  for (int i = 0; i < 64; ++i) mat[i] = std::sin(0.3f * static_cast<float>(i));
  w.add_tensor("mat.weight", {32, 2}, GgmlType::Q8_0, mat);
  return w.bytes();
}

std::vector<std::string> tiny_llama_merges() {
  return {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġa n", "Ġan d"};
}

std::vector<std::string> tiny_llama_tokens() {
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_to_token_char(static_cast<uint8_t>(b)));
  for (const std::string& m : tiny_llama_merges()) {
    const size_t space = m.find(' ');
    tokens.push_back(m.substr(0, space) + m.substr(space + 1));
  }
  return tokens;
}

void write_tiny_llama_gguf(const std::string& path, const TinyLlamaSpec& spec) {
  std::vector<std::string> tokens = tiny_llama_tokens();
  const size_t tiny_vocab = tokens.size();
  while (static_cast<int64_t>(tokens.size()) < spec.vocab_size) {
    tokens.push_back("<|unused_" + std::to_string(tokens.size() - tiny_vocab) + "|>");
  }
  const auto n_vocab = static_cast<int64_t>(tokens.size());
  const int head_dim = spec.n_embd / spec.n_head;
  const int64_t n_embd = spec.n_embd;
  const int64_t n_embd_kv = static_cast<int64_t>(head_dim) * spec.n_head_kv;
  const int64_t n_ff = spec.n_ff;

  // general.file_type follows llama_ftype: the type of most weights.
  uint32_t file_type = 0;
  switch (spec.weight_type) {
    case GgmlType::F16:
      file_type = 1;
      break;
    case GgmlType::Q4_0:
      file_type = 2;
      break;
    case GgmlType::Q4_1:
      file_type = 3;
      break;
    case GgmlType::Q8_0:
      file_type = 7;
      break;
    case GgmlType::BF16:
      file_type = 32;
      break;
    default:
      file_type = 0;
  }

  GgufWriter w(3);
  w.add("general.architecture", gguf_str("llama"));
  w.add("general.type", gguf_str("model"));
  w.add("general.name", gguf_str("kvbench tiny llama"));
  w.add("general.file_type", gguf_u32(file_type));
  w.add("general.quantization_version", gguf_u32(2));
  w.add("llama.block_count", gguf_u32(static_cast<uint32_t>(spec.n_layer)));
  w.add("llama.context_length", gguf_u32(static_cast<uint32_t>(spec.context_length)));
  w.add("llama.embedding_length", gguf_u32(static_cast<uint32_t>(spec.n_embd)));
  w.add("llama.feed_forward_length", gguf_u32(static_cast<uint32_t>(spec.n_ff)));
  w.add("llama.attention.head_count", gguf_u32(static_cast<uint32_t>(spec.n_head)));
  w.add("llama.attention.head_count_kv", gguf_u32(static_cast<uint32_t>(spec.n_head_kv)));
  w.add("llama.rope.freq_base", gguf_f32(spec.rope_theta));
  w.add("llama.attention.layer_norm_rms_epsilon", gguf_f32(spec.rms_eps));
  w.add("llama.vocab_size", gguf_u32(static_cast<uint32_t>(n_vocab)));
  w.add("llama.rope.dimension_count", gguf_u32(static_cast<uint32_t>(head_dim)));

  std::vector<int64_t> token_types(tokens.size(), 1);  // 1 = normal, 3 = control
  for (int i = 0; i < kTinyLlamaByteTokenBase; ++i) token_types[i] = 3;
  w.add("tokenizer.ggml.model", gguf_str("gpt2"));
  w.add("tokenizer.ggml.pre", gguf_str("smollm"));
  w.add("tokenizer.ggml.tokens", gguf_array(tokens));
  w.add("tokenizer.ggml.token_type", gguf_array(GgufValueType::INT32, token_types));
  w.add("tokenizer.ggml.merges", gguf_array(tiny_llama_merges()));
  w.add("tokenizer.ggml.bos_token_id", gguf_u32(1));
  w.add("tokenizer.ggml.eos_token_id", gguf_u32(2));
  w.add("tokenizer.ggml.unknown_token_id", gguf_u32(0));
  w.add("tokenizer.ggml.padding_token_id", gguf_u32(2));
  w.add("tokenizer.ggml.add_bos_token", gguf_bool(false));
  w.add("tokenizer.ggml.add_space_prefix", gguf_bool(false));
  w.add("tokenizer.chat_template",
        gguf_str("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"));

  NormalRng rng(spec.seed);
  const GgmlType wt = spec.weight_type;
  const float w_std = spec.weight_std;
  auto matrix = [&](const std::string& name, int64_t in, int64_t out) {
    w.add_tensor(name, {in, out}, wt, rng.fill(in * out, 0.0f, w_std));
  };
  auto norm_or_bias = [&](const std::string& name, int64_t n, float mean, float std) {
    w.add_tensor(name, {n}, GgmlType::F32, rng.fill(n, mean, std));
  };

  matrix("token_embd.weight", n_embd, n_vocab);
  if (spec.llama3_rope_scaling) {
    // convert_hf_to_gguf.py's llama3 rope factors: high frequencies untouched, low ones
    // divided by the factor, a smooth blend between.
    std::vector<float> factors;
    const double low_wavelen = spec.rope_original_context_length / spec.rope_low_freq_factor;
    const double high_wavelen = spec.rope_original_context_length / spec.rope_high_freq_factor;
    for (int i = 0; i < head_dim; i += 2) {
      const double freq =
          1.0 / std::pow(static_cast<double>(spec.rope_theta), static_cast<double>(i) / head_dim);
      const double wavelen = 6.283185307179586 / freq;
      double f = 1.0;
      if (wavelen > low_wavelen) {
        f = spec.rope_scaling_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (spec.rope_original_context_length / wavelen - spec.rope_low_freq_factor) /
            (spec.rope_high_freq_factor - spec.rope_low_freq_factor);
        f = 1.0 / ((1.0 - smooth) / spec.rope_scaling_factor + smooth);
      }
      factors.push_back(static_cast<float>(f));
    }
    w.add_tensor("rope_freqs.weight", {static_cast<int64_t>(factors.size())}, GgmlType::F32,
                 factors);
  }
  norm_or_bias("output_norm.weight", n_embd, 1.0f, 0.05f);
  if (!spec.tied_embeddings) {
    w.add_tensor("output.weight", {n_embd, n_vocab}, wt,
                 rng.fill(n_embd * n_vocab, 0.0f, spec.output_std));
  }
  for (int l = 0; l < spec.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm_or_bias(p + "attn_norm.weight", n_embd, 1.0f, 0.05f);
    matrix(p + "attn_q.weight", n_embd, n_embd);
    matrix(p + "attn_k.weight", n_embd, n_embd_kv);
    matrix(p + "attn_v.weight", n_embd, n_embd_kv);
    if (spec.qkv_bias) {
      norm_or_bias(p + "attn_q.bias", n_embd, 0.0f, 0.02f);
      norm_or_bias(p + "attn_k.bias", n_embd_kv, 0.0f, 0.02f);
      norm_or_bias(p + "attn_v.bias", n_embd_kv, 0.0f, 0.02f);
    }
    matrix(p + "attn_output.weight", n_embd, n_embd);
    norm_or_bias(p + "ffn_norm.weight", n_embd, 1.0f, 0.05f);
    matrix(p + "ffn_gate.weight", n_embd, n_ff);
    matrix(p + "ffn_up.weight", n_embd, n_ff);
    matrix(p + "ffn_down.weight", n_ff, n_embd);
  }
  w.write(path);
}

TinyLlamaSpec smollm2_135m_shape(int context_length) {
  TinyLlamaSpec spec;
  spec.n_layer = 30;
  spec.n_embd = 576;
  spec.n_head = 9;
  spec.n_head_kv = 3;
  spec.n_ff = 1536;
  spec.context_length = context_length;
  spec.rope_theta = 100000.0f;
  spec.vocab_size = 49152;
  spec.seed = 135;
  // Untied, with a wide head: SmolLM2 ties its embeddings, but random tied weights give
  // logits so flat that a CPU and a GPU, summing in other orders, may pick other tokens.
  spec.tied_embeddings = false;
  spec.output_std = 1.0f;
  // GPT-2's initialisation scale: each block adds a small update to the residual stream, as
  // in a trained model. At 0.05 the 30 random blocks amplify a perturbation (bf16's rounding
  // moved the logits by up to 8 there, against about 1 on the real SmolLM2).
  spec.weight_std = 0.02f;
  return spec;
}

std::string random_smollm2_gguf(int context_length, int n_layer) {
  const char* base = std::getenv("TMPDIR");
  const std::string dir = base != nullptr && *base != '\0' ? base : "/tmp";
  TinyLlamaSpec spec = smollm2_135m_shape(context_length);
  const bool all_layers = n_layer == spec.n_layer;
  spec.n_layer = n_layer;
  const std::string path =
      dir + "/kvbench_random_smollm2_135m_v2_ctx" + std::to_string(context_length) +
      (all_layers ? "" : "_layers" + std::to_string(n_layer)) + ".gguf";
  if (std::filesystem::exists(path)) return path;
  const std::string side = path + "." + std::to_string(getpid()) + ".part";
  write_tiny_llama_gguf(side, spec);
  std::filesystem::rename(side, path);  // atomic: a reader never sees half a file
  return path;
}

}  // namespace kvbench::testing
