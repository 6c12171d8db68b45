#include "harness/model/llama_model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "harness/model/dequant.h"
#include "harness/model/gguf.h"
#include "harness/model/hf_folder.h"
#include "harness/model/tokenizer.h"
#include "kernels/cpu/block_matvec.h"
#include "kernels/cpu/block_matvec_q8.h"
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_q8.h"
#include "kernels/cpu/layer_ops.h"

#ifdef KVBENCH_WITH_CUDA
#include "harness/model/cuda_forward.h"
#endif

namespace kvbench {

namespace {

// Up to this many rows, a linear layer reads its weights in their stored block format
// (decode is bandwidth-bound); past it, an fp32 GEMM on the dequantized copy is faster.
constexpr int64_t kMaxBlockRows = 4;

// Whether a chunk of n rows counts as few (a decode step; `decode_rows`: a decode batch):
// few rows take the decode activations, longer chunks the prefill ones.
bool few_rows_of(int64_t n, bool decode_rows = false) { return n <= kMaxBlockRows || decode_rows; }

Activations rounding_of(CpuActivations activations, int64_t n, bool decode_rows = false) {
  return few_rows_of(n, decode_rows) ? activations.decode : activations.prefill;
}

bool block_format_of(GgmlType type, BlockFormat* format) {
  switch (type) {
    case GgmlType::Q4_0: *format = BlockFormat::Q4_0; return true;
    case GgmlType::Q4_1: *format = BlockFormat::Q4_1; return true;
    case GgmlType::Q5_0: *format = BlockFormat::Q5_0; return true;
    case GgmlType::Q5_1: *format = BlockFormat::Q5_1; return true;
    case GgmlType::Q8_0: *format = BlockFormat::Q8_0; return true;
    case GgmlType::Q4_K: *format = BlockFormat::Q4_K; return true;
    case GgmlType::Q6_K: *format = BlockFormat::Q6_K; return true;
    default: return false;
  }
}

// The rows a linear layer multiplies, with their int8 rounding made the first time a layer
// asks for it: q, k and v (and gate and up) read the same rows and share one rounding.
class LinearInput {
 public:
  LinearInput(const float* x, int64_t n, int64_t cols) : x_(x), n_(n), cols_(cols) {}
  const float* x() const { return x_; }
  int64_t n() const { return n_; }
  const Q8Activations& int8() const {
    if (!rounded_) {
      quantize_activations_q8(x_, n_, cols_, &rounding_);
      rounded_ = true;
    }
    return rounding_;
  }

 private:
  const float* x_;
  int64_t n_, cols_;
  mutable Q8Activations rounding_;
  mutable bool rounded_ = false;
};

// A weight matrix [rows (out), cols (in)]: kept in its GGUF block format for few-row
// products, dequantized once to fp32 for the GEMMs over prefill chunks, and repacked for
// the int8 GEMM when prefill runs on int8 activations.
struct Linear {
  int64_t rows = 0;
  int64_t cols = 0;
  BlockMatrix block{};
  std::vector<uint8_t> reordered_blocks;  // block's rows when they are not the file's order
  std::unique_ptr<float[]> dense;  // [rows, cols] fp32; not zero-filled (it is written whole)
  PackedQ8Matrix packed;  // gemm_q8's byte-wide layout of block (prefill chunks on int8)
  PackedQ8Matrix narrow;  // the same at the format's width (few rows on int8: decode)
  std::vector<float> bias;  // [rows], or empty

  bool quantized() const { return block.format != BlockFormat::F32; }
  // Without VNNI the int8 GEMM would be its scalar reference: the AVX2 row kernels
  // (block_matmul_q8) are faster there, so nothing is packed and apply() takes them.
  void pack(CodeWidth width) {
    PackedQ8Matrix& p = width == CodeWidth::Byte ? packed : narrow;
    if (quantized() && p.empty() && gemm_q8_uses_vnni()) p = pack_q8(block, width);
  }

  // y = x W^T + bias for the n rows of `in`. `decode_rows`: the rows are decode steps of
  // different sequences (LlamaModel::decode_batch): the block kernels for any n, which
  // stream each weight row once for all rows and give every row the result it gets alone.
  void apply(const LinearInput& in, float* y, CpuActivations activations,
             bool decode_rows = false) const {
    const int64_t n = in.n();
    const bool few_rows = few_rows_of(n, decode_rows);
    const Activations rounding = few_rows ? activations.decode : activations.prefill;
    if (rounding == Activations::Int8 && quantized()) {
      // Few rows read the narrow packing (about the GGUF's bytes), a prefill chunk the byte
      // one (fewer instructions a block): the same values, so the same floats either way.
      const PackedQ8Matrix& tiles = few_rows ? narrow : packed;
      if (tiles.empty()) {
        block_matmul_q8(block, in.int8(), y);
      } else {
        gemm_q8(tiles, in.int8(), y);
      }
    } else if (few_rows) {
      block_matmul_cpu(block, in.x(), y, n);
    } else {
      gemm_f32(in.x(), n, dense.get(), rows, cols, y);
    }
    if (!bias.empty()) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < rows; ++i) y[r * rows + i] += bias[i];
      }
    }
  }
  void apply(const float* x, int64_t n, float* y, CpuActivations activations,
             bool decode_rows = false) const {
    apply(LinearInput(x, n, cols), y, activations, decode_rows);
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

// Row r of the returned matrix is row row_order[r] of the file's (all rows in order when
// row_order is empty).
Linear load_linear(const GgufFile& file, const std::string& name, int64_t rows, int64_t cols,
                   const std::vector<int64_t>& row_order = {}) {
  const GgufTensorInfo& t = checked_tensor(file, name, {cols, rows});
  Linear linear;
  linear.rows = rows;
  linear.cols = cols;
  linear.dense.reset(new float[static_cast<size_t>(rows * cols)]);
  float* dense = linear.dense.get();
  const int64_t row_bytes = ggml_row_bytes(t.type, cols);
  const auto file_row = [&](int64_t r) { return row_order.empty() ? r : row_order[r]; };
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type, t.data + file_row(r) * row_bytes, dense + r * cols, cols);
  }
  BlockFormat format;
  if (block_format_of(t.type, &format)) {
    const uint8_t* blocks = t.data;
    if (!row_order.empty()) {
      linear.reordered_blocks.resize(rows * row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(t.data + file_row(r) * row_bytes, row_bytes,
                    linear.reordered_blocks.data() + r * row_bytes);
      }
      blocks = linear.reordered_blocks.data();
    }
    linear.block = BlockMatrix{blocks, format, rows, cols, row_bytes};
  } else {
    linear.block = BlockMatrix{dense, BlockFormat::F32, rows, cols,
                               cols * static_cast<int64_t>(sizeof(float))};
  }
  return linear;
}

std::vector<float> load_vector(const GgufFile& file, const std::string& name, int64_t n,
                               const std::vector<int64_t>& order = {}) {
  const GgufTensorInfo& t = checked_tensor(file, name, {n});
  std::vector<float> values(n);
  dequantize_row(t.type, t.data, values.data(), n);
  if (order.empty()) return values;
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = values[order[i]];
  return out;
}

// The order of Q or K rows (n_heads heads of head_dim) that turns NeoX RoPE pairs (i, i + d/2)
// into interleaved pairs (2i, 2i + 1): row 2i of a head is its row i, row 2i + 1 its row
// i + d/2. Q and K get the same order, so every q.k is unchanged; V and O are untouched.
std::vector<int64_t> neox_to_interleaved_rows(int64_t n_heads, int64_t head_dim) {
  std::vector<int64_t> order(n_heads * head_dim);
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      order[h * head_dim + 2 * i] = h * head_dim + i;
      order[h * head_dim + 2 * i + 1] = h * head_dim + i + half;
    }
  }
  return order;
}

struct Layer {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> q_norm, k_norm;  // [head_dim] (Architecture::qk_norm), else empty
  Linear q, k, v, o, gate, up, down;
};

// KvShape::value_out_gram from each layer's output projection ([n_embd, n_heads * head_dim]):
// per query head h, G_h = W_o_h^T W_o_h over h's head_dim columns. One pass over W_o's rows
// per layer (n_embd * n_heads * head_dim^2 multiply-adds: 1.2 G for Qwen2.5-0.5B, 0.2-0.4 s
// on one core), the layers in parallel.
std::vector<float> value_out_gram(const std::vector<Layer>& layers, const ModelConfig& c) {
  const int64_t d = c.head_dim, width = static_cast<int64_t>(c.n_heads) * d;
  const int64_t per_layer = c.n_heads * d * d;
  std::vector<float> gram(layers.size() * per_layer, 0.f);
#pragma omp parallel for schedule(dynamic)
  for (int64_t l = 0; l < static_cast<int64_t>(layers.size()); ++l) {
    const float* o = layers[l].o.dense.get();
    for (int64_t r = 0; r < c.n_embd; ++r) {
      const float* row = o + r * width;
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const float* w = row + h * d;
        float* g = gram.data() + l * per_layer + h * d * d;
        for (int64_t i = 0; i < d; ++i) {
          const float a = w[i];
          for (int64_t j = 0; j < d; ++j) g[i * d + j] += a * w[j];
        }
      }
    }
  }
  return gram;
}

void add_in_place(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// CacheBlend's choice of tokens to recompute, as LMCache makes it: the `count` rows whose
// fresh keys lie farthest (squared L2 over all KV heads) from the cached, re-rotated keys.
// Ties go to the earlier row, so the choice is deterministic. Returned in row order.
std::vector<int64_t> most_deviating_rows(const float* fresh_k, const float* cached_k, int64_t n,
                                         int64_t width, int64_t count) {
  std::vector<double> deviation(n);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < width; ++j) {
      const double d = static_cast<double>(fresh_k[i * width + j]) - cached_k[i * width + j];
      sum += d * d;
    }
    deviation[i] = sum;
  }
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = i;
  std::nth_element(rows.begin(), rows.begin() + (count - 1), rows.end(), [&](int64_t a, int64_t b) {
    return deviation[a] != deviation[b] ? deviation[a] > deviation[b] : a < b;
  });
  rows.resize(count);
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace

struct LlamaModel::Impl {
  std::unique_ptr<GgufFile> file;
  ModelDevice device = ModelDevice::Cpu;
  ModelDtype dtype = ModelDtype::Fp32;
  CpuActivations activations;
#ifdef KVBENCH_WITH_CUDA
  std::unique_ptr<CudaForward> cuda;  // the forward pass on a GPU (ModelDevice::Cuda)
#endif
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  const GgufTensorInfo* token_embd = nullptr;
  std::vector<Layer> layers;
  std::vector<float> output_norm;
  Linear lm_head;
  std::vector<float> head_retrieval;  // KvShape::head_retrieval, once a probe gave it
  std::shared_ptr<const std::vector<float>> value_out_gram;  // KvShape::value_out_gram

  // Every linear layer repacked for the int8 GEMM at `width` (once; kept after).
  void pack_linears(CodeWidth width) {
    for (Layer& layer : layers) {
      for (Linear* linear : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up,
                             &layer.down}) {
        linear->pack(width);
      }
    }
    lm_head.pack(width);
  }

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

  // Buffers of one layer's computation for up to `rows` rows at a time.
  struct LayerScratch {
    std::vector<float> h, q, k, v, attn, gate, up;
    LayerScratch(const ModelConfig& c, int64_t rows)
        : h(rows * c.n_embd),
          q(rows * c.n_heads * c.head_dim),
          k(rows * c.n_kv_heads * c.head_dim),
          v(rows * c.n_kv_heads * c.head_dim),
          attn(rows * c.n_heads * c.head_dim),
          gate(rows * c.n_ff),
          up(rows * c.n_ff) {}
  };

  float attention_scale() const { return 1.f / std::sqrt(static_cast<float>(config.head_dim)); }

  // A query chunk of n rows on int8 activations lets a quantized cache round q and p to int8.
  QueryRounding query_rounding(int64_t n) const {
    return rounding_of(activations, n) == Activations::Int8 ? QueryRounding::Int8
                                                            : QueryRounding::None;
  }

  // Attention inputs of n rows of x into s.q, s.k, s.v, RoPE applied at `positions`.
  // `decode_rows`: the rows are one decode step each of different sequences (Linear::apply).
  void attention_inputs(const Layer& w, const float* x, const int32_t* positions, int64_t n,
                        LayerScratch& s, bool decode_rows = false) const {
    const ModelConfig& c = config;
    rms_norm_cpu(x, w.attn_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps);
    const LinearInput h(s.h.data(), n, c.n_embd);
    w.q.apply(h, s.q.data(), activations, decode_rows);
    w.k.apply(h, s.k.data(), activations, decode_rows);
    w.v.apply(h, s.v.data(), activations, decode_rows);
    if (c.arch->qk_norm) {
      rms_norm_cpu(s.q.data(), w.q_norm.data(), s.q.data(), n * c.n_heads, c.head_dim, c.rms_eps);
      rms_norm_cpu(s.k.data(), w.k_norm.data(), s.k.data(), n * c.n_kv_heads, c.head_dim,
                   c.rms_eps);
    }
    rope_interleaved_cpu(s.q.data(), positions, n, c.n_heads, c.head_dim, c.rope_inv_freq.data());
    rope_interleaved_cpu(s.k.data(), positions, n, c.n_kv_heads, c.head_dim,
                         c.rope_inv_freq.data());
  }

  // The rest of the block once s.attn holds the attention output of n rows:
  // x += o(attn), then x += down(silu(gate(norm x)) * up(norm x)).
  void finish_block(const Layer& w, float* x, int64_t n, LayerScratch& s,
                    bool decode_rows = false) const {
    const ModelConfig& c = config;
    w.o.apply(s.attn.data(), n, s.h.data(), activations, decode_rows);
    add_in_place(x, s.h.data(), n * c.n_embd);
    rms_norm_cpu(x, w.ffn_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps);
    const LinearInput h(s.h.data(), n, c.n_embd);
    w.gate.apply(h, s.gate.data(), activations, decode_rows);
    w.up.apply(h, s.up.data(), activations, decode_rows);
    silu_mul_cpu(s.gate.data(), s.up.data(), s.gate.data(), n * c.n_ff);
    w.down.apply(s.gate.data(), n, s.h.data(), activations, decode_rows);
    add_in_place(x, s.h.data(), n * c.n_embd);
  }

  // Layer l over n rows that are all stored and all attend: the plain prefill step.
  void dense_layer(int32_t l, float* x, const int32_t* positions, int64_t n, KvCache& cache,
                   LayerScratch& s) const {
    attention_inputs(layers[l], x, positions, n, s);
    cache.append(l, s.k.data(), s.v.data(), positions, n);
    cache.attend(l, AttentionQuery{s.q.data(), positions, s.attn.data(), static_cast<int32_t>(n),
                                   config.n_heads, attention_scale(), query_rounding(n)});
    finish_block(layers[l], x, n, s);
  }

  // One chunk through every layer; writes logits of the last row, or of all rows.
  void forward_chunk(const int32_t* tokens, int64_t n, KvCache& cache, bool all_logits,
                     float* logits) const {
    const ModelConfig& c = config;

    std::vector<float> x(n * c.n_embd);
    embed(tokens, n, x.data());
#ifdef KVBENCH_WITH_CUDA
    if (cuda) {
      cuda->forward_chunk(x.data(), n, cache, all_logits, logits);
      return;
    }
#endif
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);
    LayerScratch s(c, n);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      dense_layer(l, x.data(), positions.data(), n, cache, s);
    }
    cache.advance(static_cast<int32_t>(n));

    const int64_t first = all_logits ? 0 : n - 1;
    rms_norm_cpu(x.data() + first * c.n_embd, output_norm.data(), s.h.data(), n - first, c.n_embd,
                 c.rms_eps);
    lm_head.apply(s.h.data(), n - first, logits, activations);
  }

  // forward()'s chunk loop, once the cache knows where the forward ends.
  std::vector<float> feed(const std::vector<int32_t>& tokens, KvCache& cache, bool all_logits,
                          int64_t chunk_rows) const {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int64_t vocab = config.vocab_size;
    std::vector<float> logits((all_logits ? n : 1) * vocab);
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t len = std::min<int64_t>(chunk_rows, n - start);
      const bool last = start + len == n;
      if (!all_logits && !last) {
        // Logits of a non-final chunk are not needed: compute the last row only and drop it.
        std::vector<float> scratch(vocab);
        forward_chunk(tokens.data() + start, len, cache, false, scratch.data());
      } else {
        float* out = all_logits ? logits.data() + start * vocab : logits.data();
        forward_chunk(tokens.data() + start, len, cache, all_logits, out);
      }
    }
    return logits;
  }

  // One decode step of n sequences (LlamaModel::decode_batch): the linear layers over the n
  // rows at once, each row's attention through its own cache. Writes logits [n, vocab].
  void decode_rows(const int32_t* tokens, int64_t n, KvCache* const* caches, float* logits) const {
    const ModelConfig& c = config;
    std::vector<float> x(n * c.n_embd);
    embed(tokens, n, x.data());
#ifdef KVBENCH_WITH_CUDA
    if (cuda) {
      cuda->decode_rows(x.data(), n, caches, logits);
      return;
    }
#endif
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = caches[i]->next_position();
    const int64_t q_width = static_cast<int64_t>(c.n_heads) * c.head_dim;
    const int64_t kv_width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
    LayerScratch s(c, n);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      attention_inputs(layers[l], x.data(), positions.data(), n, s, true);
      for (int64_t i = 0; i < n; ++i) {
        caches[i]->append(l, s.k.data() + i * kv_width, s.v.data() + i * kv_width,
                          positions.data() + i, 1);
        caches[i]->attend(l, AttentionQuery{s.q.data() + i * q_width, positions.data() + i,
                                            s.attn.data() + i * q_width, 1, c.n_heads,
                                            attention_scale(), query_rounding(1)});
      }
      finish_block(layers[l], x.data(), n, s, true);
    }
    for (int64_t i = 0; i < n; ++i) caches[i]->advance(1);
    rms_norm_cpu(x.data(), output_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps);
    lm_head.apply(s.h.data(), n, logits, activations, true);
  }

  // Token-selective propagation (LlamaModel::forward_propagating): each chunk of chunk_rows
  // rows through layers 0..tsp_layer, as forward_chunk runs it; then the rows select names go
  // on alone through the later layers, chunk by chunk again, at their own positions. Writes
  // the last row's logits.
  void propagate(const int32_t* tokens, int64_t n, int32_t tsp_layer, const RowSelector& select,
                 int64_t chunk_rows, KvCache& cache, float* logits) const {
    const ModelConfig& c = config;
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);
    // Each layer's store is sized for the tokens it will hold: a later layer reserved for
    // all n would keep that room (nothing is evicted from it when it holds its budget or less).
    cache.reserve_more(n, 0, tsp_layer + 1);
    std::vector<float> x(n * c.n_embd);
    LayerScratch s(c, std::min(n, chunk_rows));
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t len = std::min(chunk_rows, n - start);
      float* xs = x.data() + start * c.n_embd;
      embed(tokens + start, len, xs);
      for (int32_t l = 0; l <= tsp_layer; ++l) {
        dense_layer(l, xs, positions.data() + start, len, cache, s);
      }
    }

    const std::vector<int64_t> selected = select(tsp_layer);
    const int64_t m = static_cast<int64_t>(selected.size());
    if (m == 0 || selected.back() != n - 1) {
      throw std::invalid_argument("forward_propagating: the selected rows must include the last");
    }
    for (int64_t j = 0; j < m; ++j) {
      if (selected[j] < 0 || (j > 0 && selected[j] <= selected[j - 1])) {
        throw std::invalid_argument("forward_propagating: selected rows must be ascending rows");
      }
    }
    std::vector<float> xsel(m * c.n_embd);
    std::vector<int32_t> sel_positions(m);
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(x.data() + selected[j] * c.n_embd, c.n_embd, xsel.data() + j * c.n_embd);
      sel_positions[j] = positions[selected[j]];
    }
    x = {};

    cache.reserve_more(m, tsp_layer + 1, c.n_layers);
    for (int64_t a = 0; a < m; a += chunk_rows) {
      const int64_t len = std::min(chunk_rows, m - a);
      float* xs = xsel.data() + a * c.n_embd;
      for (int32_t l = tsp_layer + 1; l < c.n_layers; ++l) {
        dense_layer(l, xs, sel_positions.data() + a, len, cache, s);
      }
    }
    cache.advance(static_cast<int32_t>(n));

    rms_norm_cpu(xsel.data() + (m - 1) * c.n_embd, output_norm.data(), s.h.data(), 1, c.n_embd,
                 c.rms_eps);
    lm_head.apply(s.h.data(), 1, logits, activations);
  }

  // CacheBlend (LlamaModel::forward_blend): layers 0..select_layer in full, in chunks of
  // chunk_rows; then the n_recompute tokens whose select_layer keys deviate most from the
  // cached ones go on alone through the later layers, the others keeping their cached KV.
  void blend(const int32_t* tokens, int64_t n, const float* cached_k, const float* cached_v,
             int64_t n_recompute, int32_t select_layer, int64_t chunk_rows, KvCache& cache) const {
    const ModelConfig& c = config;
    const int64_t kv_width = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
    const int64_t layer_stride = n * kv_width;  // one layer of cached_k / cached_v
    std::vector<int32_t> positions(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);
    cache.reserve_more(n);

    if (n_recompute == 0) {  // naive reuse: nothing to compute, not even the first layers
      for (int32_t l = 0; l < c.n_layers; ++l) {
        cache.append(l, cached_k + l * layer_stride, cached_v + l * layer_stride, positions.data(),
                     n);
      }
      cache.advance(static_cast<int32_t>(n));
      return;
    }

    // Full layers, chunk by chunk as forward() does; keep select_layer's fresh keys.
    std::vector<float> x(n * c.n_embd), fresh_k(n * kv_width);
    LayerScratch s(c, std::min(n, chunk_rows));
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t len = std::min(chunk_rows, n - start);
      float* xs = x.data() + start * c.n_embd;
      embed(tokens + start, len, xs);
      for (int32_t l = 0; l <= select_layer; ++l) {
        dense_layer(l, xs, positions.data() + start, len, cache, s);
      }
      std::copy(s.k.begin(), s.k.begin() + len * kv_width, fresh_k.begin() + start * kv_width);
    }

    const std::vector<int64_t> selected = most_deviating_rows(
        fresh_k.data(), cached_k + select_layer * layer_stride, n, kv_width, n_recompute);
    const int64_t m = static_cast<int64_t>(selected.size());
    std::vector<float> xsel(m * c.n_embd);
    std::vector<int32_t> sel_positions(m);
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(x.data() + selected[j] * c.n_embd, c.n_embd, xsel.data() + j * c.n_embd);
      sel_positions[j] = positions[selected[j]];
    }
    x = {};

    // Later layers: chunks of selected rows. Before a chunk attends, each layer stores every
    // token up to the chunk's last one (the cached KV, with the selected tokens' fresh rows
    // in place of theirs), so each query sees all tokens before it, as in a prefill.
    std::vector<float> stage_k(n * kv_width), stage_v(n * kv_width);
    int64_t stored = 0;  // tokens the later layers hold so far
    for (int64_t a = 0; a < m; a += chunk_rows) {
      const int64_t len = std::min(chunk_rows, m - a);
      const int64_t store_end = a + len == m ? n : selected[a + len - 1] + 1;
      const int64_t n_store = store_end - stored;
      float* xs = xsel.data() + a * c.n_embd;
      for (int32_t l = select_layer + 1; l < c.n_layers; ++l) {
        attention_inputs(layers[l], xs, sel_positions.data() + a, len, s);
        std::copy_n(cached_k + l * layer_stride + stored * kv_width, n_store * kv_width,
                    stage_k.data());
        std::copy_n(cached_v + l * layer_stride + stored * kv_width, n_store * kv_width,
                    stage_v.data());
        for (int64_t j = 0; j < len; ++j) {
          const int64_t row = selected[a + j] - stored;
          std::copy_n(s.k.data() + j * kv_width, kv_width, stage_k.data() + row * kv_width);
          std::copy_n(s.v.data() + j * kv_width, kv_width, stage_v.data() + row * kv_width);
        }
        cache.append(l, stage_k.data(), stage_v.data(), positions.data() + stored, n_store);
        cache.attend(l, AttentionQuery{s.q.data(), sel_positions.data() + a, s.attn.data(),
                                       static_cast<int32_t>(len), c.n_heads, attention_scale(),
                                       query_rounding(len)});
        finish_block(layers[l], xs, len, s);
      }
      stored = store_end;
    }
    cache.advance(static_cast<int32_t>(n));
  }
};

LlamaModel::LlamaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LlamaModel::~LlamaModel() = default;

namespace {

#ifdef KVBENCH_WITH_CUDA
HostLinear host_view(const Linear& l) {
  return HostLinear{l.dense.get(), l.rows, l.cols,
                    l.bias.empty() ? nullptr : l.bias.data()};
}

// The model's fp32 weights as the GPU forward copies them.
HostWeights host_weights(const std::vector<Layer>& layers, const std::vector<float>& output_norm,
                         const Linear& lm_head) {
  HostWeights w;
  for (const Layer& l : layers) {
    w.layers.push_back(HostLayer{l.attn_norm.data(), l.ffn_norm.data(), host_view(l.q),
                                 host_view(l.k), host_view(l.v), host_view(l.o),
                                 host_view(l.gate), host_view(l.up), host_view(l.down),
                                 l.q_norm.data(), l.k_norm.data()});
  }
  w.output_norm = output_norm.data();
  w.lm_head = host_view(lm_head);
  return w;
}
#endif

}  // namespace

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& path, ModelDevice device,
                                             ModelDtype dtype) {
  use_openmp_threads_only();
  if (dtype != ModelDtype::Fp32 && device != ModelDevice::Cuda) {
    throw InputError(std::string("--dtype ") + dtype_name(dtype) +
                     ": runs only with --device cuda (the CPU forward is fp32)");
  }
#ifdef KVBENCH_WITH_CUDA
  if (device == ModelDevice::Cuda && !cuda_device_present()) {
    throw InputError("--device cuda: no CUDA device is present on this machine");
  }
#else
  if (device == ModelDevice::Cuda) {
    throw InputError("--device cuda: this kvbench was built without CUDA (nvcc was not found)");
  }
#endif
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->dtype = dtype;
  // A Hugging Face folder is read as the GGUF its converter would write (hf_folder.h).
  impl->file = open_model_file(path);
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
  std::vector<int64_t> q_order, k_order;  // empty: the file's order
  const bool neox = c.arch->rope == RopeStyle::Neox;
  if (neox) {
    q_order = neox_to_interleaved_rows(c.n_heads, c.head_dim);
    k_order = neox_to_interleaved_rows(c.n_kv_heads, c.head_dim);
  }
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer layer;
    layer.attn_norm = load_vector(f, p + "attn_norm.weight", c.n_embd);
    layer.ffn_norm = load_vector(f, p + "ffn_norm.weight", c.n_embd);
    layer.q = load_linear(f, p + "attn_q.weight", q_width, c.n_embd, q_order);
    layer.k = load_linear(f, p + "attn_k.weight", kv_width, c.n_embd, k_order);
    layer.v = load_linear(f, p + "attn_v.weight", kv_width, c.n_embd);
    if (c.arch->qk_norm) {  // per head, in the order the Q and K rows were put in
      const std::vector<int64_t> head_order =
          neox ? neox_to_interleaved_rows(1, c.head_dim) : std::vector<int64_t>{};
      layer.q_norm = load_vector(f, p + "attn_q_norm.weight", c.head_dim, head_order);
      layer.k_norm = load_vector(f, p + "attn_k_norm.weight", c.head_dim, head_order);
    }
    if (c.qkv_bias) {
      layer.q.bias = load_vector(f, p + "attn_q.bias", q_width, q_order);
      layer.k.bias = load_vector(f, p + "attn_k.bias", kv_width, k_order);
      layer.v.bias = load_vector(f, p + "attn_v.bias", kv_width);
    }
    layer.o = load_linear(f, p + "attn_output.weight", c.n_embd, q_width);
    layer.gate = load_linear(f, p + "ffn_gate.weight", c.n_ff, c.n_embd);
    layer.up = load_linear(f, p + "ffn_up.weight", c.n_ff, c.n_embd);
    layer.down = load_linear(f, p + "ffn_down.weight", c.n_embd, c.n_ff);
    impl->layers.push_back(std::move(layer));
  }
  impl->value_out_gram =
      std::make_shared<const std::vector<float>>(value_out_gram(impl->layers, c));
  impl->output_norm = load_vector(f, "output_norm.weight", c.n_embd);
  impl->lm_head = load_linear(f, c.tied_embeddings ? "token_embd.weight" : "output.weight",
                              c.vocab_size, c.n_embd);
#ifdef KVBENCH_WITH_CUDA
  if (device == ModelDevice::Cuda) {
    if (c.head_dim != 64 && c.head_dim != 128) {
      throw InputError("--device cuda: " + path + " has head_dim " + std::to_string(c.head_dim) +
                       "; the CUDA attention kernels take 64 or 128");
    }
    impl->cuda = std::make_unique<CudaForward>(
        c, host_weights(impl->layers, impl->output_norm, impl->lm_head), dtype);
  }
#endif
  return std::unique_ptr<LlamaModel>(new LlamaModel(std::move(impl)));
}

const ModelConfig& LlamaModel::config() const { return impl_->config; }
const Tokenizer& LlamaModel::tokenizer() const { return *impl_->tokenizer; }
const GgufFile& LlamaModel::file() const { return *impl_->file; }

KvShape LlamaModel::kv_shape() const {
  const ModelConfig& c = impl_->config;
  return KvShape{c.n_layers,          c.n_kv_heads, c.head_dim,
                 c.rope_inv_freq,     impl_->head_retrieval,
                 c.n_heads,           impl_->value_out_gram};
}

void LlamaModel::set_head_retrieval(std::vector<float> scores) {
  const ModelConfig& c = impl_->config;
  if (scores.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads) {
    throw std::invalid_argument("set_head_retrieval: " + std::to_string(scores.size()) +
                                " scores for " + std::to_string(c.n_layers) + " layers of " +
                                std::to_string(c.n_kv_heads) + " KV heads");
  }
  impl_->head_retrieval = std::move(scores);
}

ModelDevice LlamaModel::device() const { return impl_->device; }
ModelDtype LlamaModel::dtype() const { return impl_->dtype; }

namespace {

// int8 activations are a CPU path: the GPU forward rounds as --dtype says.
void require_cpu_for(const char* flag, Activations activations, ModelDevice device) {
  if (activations != Activations::Fp32 && device != ModelDevice::Cpu) {
    throw InputError(std::string(flag) + " " + activations_name(activations) +
                     ": runs only on the CPU (the GPU forward rounds by --dtype)");
  }
}

}  // namespace

void LlamaModel::set_decode_activations(Activations activations) {
  require_cpu_for("--decode-activations", activations, impl_->device);
  // Repacked once at the format's width: about the GGUF blocks' bytes again (a third more for
  // Q4_K). One x row or a batch of them go through the same tiles, so a sequence's logits in
  // a decode batch are the ones it gets alone.
  if (activations == Activations::Int8) impl_->pack_linears(CodeWidth::Format);
  impl_->activations.decode = activations;
}

Activations LlamaModel::decode_activations() const { return impl_->activations.decode; }

void LlamaModel::set_prefill_activations(Activations activations) {
  require_cpu_for("--prefill-activations", activations, impl_->device);
  // Repacked once: 1.25 bytes a weight (1.5 for Q6_K) beside the fp32 copy's 4.
  if (activations == Activations::Int8) impl_->pack_linears(CodeWidth::Byte);
  impl_->activations.prefill = activations;
}

Activations LlamaModel::prefill_activations() const { return impl_->activations.prefill; }

int64_t LlamaModel::device_weight_bytes() const {
#ifdef KVBENCH_WITH_CUDA
  if (impl_->cuda) return impl_->cuda->weight_bytes();
#endif
  return 0;
}

std::vector<float> LlamaModel::decode(int32_t token, KvCache& cache) const {
  cache.mark_decode_step();
  return forward({token}, cache);
}

std::vector<float> LlamaModel::decode_batch(const std::vector<int32_t>& tokens,
                                            const std::vector<KvCache*>& caches) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = impl_->config.vocab_size;
  if (n == 0 || caches.size() != tokens.size()) {
    throw std::invalid_argument("decode_batch: " + std::to_string(tokens.size()) + " tokens for " +
                                std::to_string(caches.size()) + " caches");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (caches[i]->next_position() + 1 > impl_->config.context_length) {
      throw InputError("input of " + std::to_string(caches[i]->next_position() + 1) +
                       " tokens does not fit the model's context of " +
                       std::to_string(impl_->config.context_length) + " tokens");
    }
    for (int64_t j = 0; j < i; ++j) {
      if (caches[j] == caches[i]) throw std::invalid_argument("decode_batch: a cache given twice");
    }
  }
  std::vector<float> logits(n * vocab);
  for (int64_t i = 0; i < n; ++i) {
    caches[i]->mark_decode_step();
    caches[i]->begin_forward(1);
  }
  impl_->decode_rows(tokens.data(), n, caches.data(), logits.data());
  return logits;
}

std::vector<float> LlamaModel::forward_part(const std::vector<int32_t>& prompt, int64_t begin,
                                            int64_t end, KvCache& cache) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (begin < 0 || end <= begin || end > n) {
    throw std::invalid_argument("forward_part: [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") is not a part of a prompt of " +
                                std::to_string(n) + " tokens");
  }
  if (cache.next_position() + (n - begin) > impl_->config.context_length) {
    throw InputError("input of " + std::to_string(cache.next_position() + (n - begin)) +
                     " tokens does not fit the model's context of " +
                     std::to_string(impl_->config.context_length) + " tokens");
  }
  // The forward ends where the prompt ends, not with this part (a sparse prefill's dense
  // last rows are the prompt's).
  cache.begin_forward(n - begin);
  return impl_->feed(std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end), cache,
                     false, prefill_chunk);
}

std::vector<float> LlamaModel::forward(const std::vector<int32_t>& tokens, KvCache& cache,
                                       bool all_logits) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw InputError("forward: no tokens to feed");
  if (cache.next_position() + n > impl_->config.context_length) {
    throw InputError("input of " + std::to_string(cache.next_position() + n) +
                     " tokens does not fit the model's context of " +
                     std::to_string(impl_->config.context_length) + " tokens");
  }
  cache.begin_forward(n);
  return impl_->feed(tokens, cache, all_logits, prefill_chunk);
}

std::vector<float> LlamaModel::forward_propagating(const std::vector<int32_t>& tokens,
                                                   int32_t tsp_layer, const RowSelector& select,
                                                   KvCache& cache) const {
  const ModelConfig& c = impl_->config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (impl_->device != ModelDevice::Cpu) {
    throw InputError(
        "forward_propagating: token-selective propagation runs on the CPU only, not on "
        "--device cuda");
  }
  if (n == 0) throw InputError("forward_propagating: no tokens to feed");
  if (tsp_layer < 0 || tsp_layer >= c.n_layers) {
    throw InputError("forward_propagating: layer " + std::to_string(tsp_layer) +
                     " is not a layer of this " + std::to_string(c.n_layers) + "-layer model");
  }
  if (cache.next_position() + n > c.context_length) {
    throw InputError("input of " + std::to_string(cache.next_position() + n) +
                     " tokens does not fit the model's context of " +
                     std::to_string(c.context_length) + " tokens");
  }
  std::vector<float> logits(c.vocab_size);
  impl_->propagate(tokens.data(), n, tsp_layer, select, std::max<int32_t>(1, prefill_chunk), cache,
                   logits.data());
  return logits;
}

int64_t LlamaModel::recompute_count(double ratio, int64_t n_tokens) {
  // The small epsilon keeps ratio * n that is an integer in exact arithmetic (0.15 * 100)
  // from rounding up past it in binary.
  return std::min<int64_t>(n_tokens, static_cast<int64_t>(std::ceil(ratio * n_tokens - 1e-9)));
}

int64_t LlamaModel::forward_blend(const std::vector<int32_t>& tokens, const float* cached_k,
                                  const float* cached_v, double recompute_ratio,
                                  int32_t select_layer, KvCache& cache) const {
  const ModelConfig& c = impl_->config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (impl_->device != ModelDevice::Cpu) {
    throw InputError("forward_blend: CacheBlend runs on the CPU only, not on --device cuda");
  }
  if (n == 0) throw InputError("forward_blend: no tokens to feed");
  if (!(recompute_ratio >= 0 && recompute_ratio <= 1)) {
    throw InputError("forward_blend: recompute ratio must be in [0, 1], not " +
                     std::to_string(recompute_ratio));
  }
  if (select_layer < 0 || select_layer >= c.n_layers) {
    throw InputError("forward_blend: selection layer " + std::to_string(select_layer) +
                     " is not a layer of this " + std::to_string(c.n_layers) + "-layer model");
  }
  if (cache.next_position() + n > c.context_length) {
    throw InputError("input of " + std::to_string(cache.next_position() + n) +
                     " tokens does not fit the model's context of " +
                     std::to_string(c.context_length) + " tokens");
  }
  const int64_t n_recompute = recompute_count(recompute_ratio, n);
  impl_->blend(tokens.data(), n, cached_k, cached_v, n_recompute, select_layer,
               std::max<int32_t>(1, prefill_chunk), cache);
  return n_recompute;
}

}  // namespace kvbench
