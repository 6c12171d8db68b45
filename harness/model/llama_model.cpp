#include "harness/model/llama_model.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>

#include <dlfcn.h>
#include <omp.h>

#include <cmath>
#include <string>

#include "harness/model/dequant.h"
#include "harness/model/gguf.h"
#include "harness/model/tokenizer.h"
#include "kernels/cpu/block_matvec.h"
#include "kernels/cpu/layer_ops.h"

namespace kvbench {

namespace {

// Up to this many rows, a linear layer reads its weights in their stored block format
// (decode is bandwidth-bound); past it, an fp32 GEMM on the dequantized copy is faster.
constexpr int64_t kMaxBlockRows = 4;

// One threading layer: OpenBLAS runs single-threaded and GEMMs are split over OpenMP
// threads, like every other kernel: two pools (OpenBLAS pthreads and OpenMP) spinning in
// turn on 2 cores made a 37-token prefill 3x slower. Looked up at run time
// so another BLAS (MKL, reference) still works, just with its own threading.
void use_openmp_threads_only() {
  using SetThreads = void (*)(int);
  static const bool done = [] {
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(1);
    }
    return true;
  }();
  (void)done;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool block_format_of(GgmlType type, BlockFormat* format) {
  switch (type) {
    case GgmlType::Q4_0: *format = BlockFormat::Q4_0; return true;
    case GgmlType::Q4_1: *format = BlockFormat::Q4_1; return true;
    case GgmlType::Q8_0: *format = BlockFormat::Q8_0; return true;
    default: return false;
  }
}

// A weight matrix [rows (out), cols (in)]: kept in its GGUF block format for few-row
// products, and dequantized once to fp32 for GEMMs over prefill chunks.
struct Linear {
  int64_t rows = 0;
  int64_t cols = 0;
  BlockMatrix block{};
  at::Tensor dense;         // [rows, cols] fp32
  std::vector<float> bias;  // [rows], or empty

  void apply(const float* x, int64_t n, float* y) const {
    if (n <= kMaxBlockRows) {
      block_matmul_cpu(block, x, y, n);
    } else {
      // Each thread multiplies x by its own slice of weight rows (output columns).
      at::Tensor xt = at::from_blob(const_cast<float*>(x), {n, cols});
      at::Tensor yt = at::from_blob(y, {n, rows});
      const int threads = std::max(1, std::min<int>(omp_get_max_threads(), rows / 64));
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int part = 0; part < threads; ++part) {
        const int64_t begin = rows * part / threads, end = rows * (part + 1) / threads;
        at::Tensor out = yt.narrow(1, begin, end - begin);
        at::mm_out(out, xt, dense.narrow(0, begin, end - begin).t());
      }
    }
    if (!bias.empty()) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < rows; ++i) y[r * rows + i] += bias[i];
      }
    }
  }
};

const GgufTensorInfo& checked_tensor(const GgufFile& file, const std::string& name,
                                     const std::vector<int64_t>& expected_shape) {
  const GgufTensorInfo& t = file.tensor(name);
  if (t.shape != expected_shape) {
    throw InputError(file.path() + ": tensor " + name + " has shape " + shape_text(t.shape) +
                     ", expected " + shape_text(expected_shape));
  }
  return t;
}

Linear load_linear(const GgufFile& file, const std::string& name, int64_t rows, int64_t cols) {
  const GgufTensorInfo& t = checked_tensor(file, name, {cols, rows});
  Linear linear;
  linear.rows = rows;
  linear.cols = cols;
  linear.dense = at::empty({rows, cols});
  float* dense = linear.dense.data_ptr<float>();
  const int64_t row_bytes = ggml_row_bytes(t.type, cols);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type, t.data + r * row_bytes, dense + r * cols, cols);
  }
  BlockFormat format;
  if (block_format_of(t.type, &format)) {
    linear.block = BlockMatrix{t.data, format, rows, cols, row_bytes};
  } else {
    linear.block = BlockMatrix{dense, BlockFormat::F32, rows, cols,
                               cols * static_cast<int64_t>(sizeof(float))};
  }
  return linear;
}

std::vector<float> load_vector(const GgufFile& file, const std::string& name, int64_t n) {
  const GgufTensorInfo& t = checked_tensor(file, name, {n});
  std::vector<float> out(n);
  dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

struct Layer {
  std::vector<float> attn_norm, ffn_norm;
  Linear q, k, v, o, gate, up, down;
};

void add_in_place(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

struct LlamaModel::Impl {
  std::unique_ptr<GgufFile> file;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  const GgufTensorInfo* token_embd = nullptr;
  std::vector<Layer> layers;
  std::vector<float> output_norm;
  Linear lm_head;

  void embed(const int32_t* tokens, int64_t n, float* x) const {
    const int64_t row_bytes = ggml_row_bytes(token_embd->type, config.n_embd);
    for (int64_t t = 0; t < n; ++t) {
      if (tokens[t] < 0 || tokens[t] >= config.vocab_size) {
        throw InputError("token id " + std::to_string(tokens[t]) + " is outside the vocabulary of " +
                         std::to_string(config.vocab_size));
      }
      dequantize_row(token_embd->type, token_embd->data + tokens[t] * row_bytes,
                     x + t * config.n_embd, config.n_embd);
    }
  }

  // One chunk through every layer; writes logits of the last row, or of all rows.
  void forward_chunk(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                     float* logits) const {
    const ModelConfig& c = config;
    const int64_t q_width = static_cast<int64_t>(c.n_heads) * c.head_dim;
    const int64_t kv_width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);

    std::vector<float> x(n * c.n_embd), h(n * c.n_embd), q(n * q_width), k(n * kv_width),
        v(n * kv_width), attn(n * q_width), gate(n * c.n_ff), up(n * c.n_ff);
    embed(tokens, n, x.data());
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));

    for (int32_t l = 0; l < c.n_layers; ++l) {
      const Layer& w = layers[l];
      rms_norm_cpu(x.data(), w.attn_norm.data(), h.data(), n, c.n_embd, c.rms_eps);
      w.q.apply(h.data(), n, q.data());
      w.k.apply(h.data(), n, k.data());
      w.v.apply(h.data(), n, v.data());
      rope_interleaved_cpu(q.data(), positions.data(), n, c.n_heads, c.head_dim,
                           c.rope_inv_freq.data());
      rope_interleaved_cpu(k.data(), positions.data(), n, c.n_kv_heads, c.head_dim,
                           c.rope_inv_freq.data());
      cache.append(l, k.data(), v.data(), positions.data(), n);
      cache.attend(l, AttentionQuery{q.data(), positions.data(), attn.data(),
                                     static_cast<int32_t>(n), c.n_heads, scale});
      w.o.apply(attn.data(), n, h.data());
      add_in_place(x.data(), h.data(), n * c.n_embd);

      rms_norm_cpu(x.data(), w.ffn_norm.data(), h.data(), n, c.n_embd, c.rms_eps);
      w.gate.apply(h.data(), n, gate.data());
      w.up.apply(h.data(), n, up.data());
      silu_mul_cpu(gate.data(), up.data(), gate.data(), n * c.n_ff);
      w.down.apply(gate.data(), n, h.data());
      add_in_place(x.data(), h.data(), n * c.n_embd);
    }
    cache.advance(static_cast<int32_t>(n));

    const int64_t first = all_logits ? 0 : n - 1;
    rms_norm_cpu(x.data() + first * c.n_embd, output_norm.data(), h.data(), n - first, c.n_embd,
                 c.rms_eps);
    lm_head.apply(h.data(), n - first, logits);
  }
};

LlamaModel::LlamaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LlamaModel::~LlamaModel() = default;

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& path) {
  use_openmp_threads_only();
  auto impl = std::make_unique<Impl>();
  impl->file = std::make_unique<GgufFile>(path);
  const GgufFile& f = *impl->file;
  impl->config = ModelConfig::from_gguf(f);
  const ModelConfig& c = impl->config;
  impl->tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
  if (impl->tokenizer->vocab_size() > c.vocab_size) {
    throw InputError(path + ": tokenizer has " + std::to_string(impl->tokenizer->vocab_size()) +
                     " tokens but the embedding only " + std::to_string(c.vocab_size));
  }

  impl->token_embd = &checked_tensor(f, "token_embd.weight", {c.n_embd, c.vocab_size});
  const int64_t q_width = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer layer;
    layer.attn_norm = load_vector(f, p + "attn_norm.weight", c.n_embd);
    layer.ffn_norm = load_vector(f, p + "ffn_norm.weight", c.n_embd);
    layer.q = load_linear(f, p + "attn_q.weight", q_width, c.n_embd);
    layer.k = load_linear(f, p + "attn_k.weight", kv_width, c.n_embd);
    layer.v = load_linear(f, p + "attn_v.weight", kv_width, c.n_embd);
    if (c.qkv_bias) {
      layer.q.bias = load_vector(f, p + "attn_q.bias", q_width);
      layer.k.bias = load_vector(f, p + "attn_k.bias", kv_width);
      layer.v.bias = load_vector(f, p + "attn_v.bias", kv_width);
    }
    layer.o = load_linear(f, p + "attn_output.weight", c.n_embd, q_width);
    layer.gate = load_linear(f, p + "ffn_gate.weight", c.n_ff, c.n_embd);
    layer.up = load_linear(f, p + "ffn_up.weight", c.n_ff, c.n_embd);
    layer.down = load_linear(f, p + "ffn_down.weight", c.n_embd, c.n_ff);
    impl->layers.push_back(std::move(layer));
  }
  impl->output_norm = load_vector(f, "output_norm.weight", c.n_embd);
  impl->lm_head = load_linear(f, c.tied_embeddings ? "token_embd.weight" : "output.weight",
                              c.vocab_size, c.n_embd);
  return std::unique_ptr<LlamaModel>(new LlamaModel(std::move(impl)));
}

const ModelConfig& LlamaModel::config() const { return impl_->config; }
const Tokenizer& LlamaModel::tokenizer() const { return *impl_->tokenizer; }
const GgufFile& LlamaModel::file() const { return *impl_->file; }

KvShape LlamaModel::kv_shape() const {
  return KvShape{impl_->config.n_layers, impl_->config.n_kv_heads, impl_->config.head_dim};
}

std::vector<float> LlamaModel::forward(const std::vector<int32_t>& tokens, KvCache& cache,
                                       bool all_logits) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = impl_->config.vocab_size;
  if (n == 0) throw InputError("forward: no tokens to feed");
  if (cache.next_position() + n > impl_->config.context_length) {
    throw InputError("input of " + std::to_string(cache.next_position() + n) +
                     " tokens does not fit the model's context of " +
                     std::to_string(impl_->config.context_length) + " tokens");
  }
  std::vector<float> logits((all_logits ? n : 1) * vocab);
  for (int64_t start = 0; start < n; start += prefill_chunk) {
    const int64_t len = std::min<int64_t>(prefill_chunk, n - start);
    const bool last = start + len == n;
    if (!all_logits && !last) {
      // Logits of a non-final chunk are not needed: compute the last row only and drop it.
      std::vector<float> scratch(vocab);
      impl_->forward_chunk(tokens.data() + start, len, cache, false, scratch.data());
    } else {
      float* out = all_logits ? logits.data() + start * vocab : logits.data();
      impl_->forward_chunk(tokens.data() + start, len, cache, all_logits, out);
    }
  }
  return logits;
}

}  // namespace kvbench
