#include "harness/model/cuda_forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/linear.h"

namespace kvbench {

namespace {

struct DeviceLinear {
  DeviceBuffer<float> w;          // [rows, cols] in fp32, or empty
  DeviceBuffer<uint16_t> w_bf16;  // [rows, cols] bf16 bits in bf16, or empty
  DeviceBuffer<float> bias;       // [rows], or empty
  int64_t rows = 0;
  int64_t cols = 0;
};

// Weights as the dtype holds them. bf16 goes through `staging` (fp32, at least the largest
// matrix, reused: every copy and conversion is on the default stream, so in order).
class WeightUploader {
 public:
  WeightUploader(ModelDtype dtype, int64_t largest) : dtype_(dtype) {
    if (dtype_ == ModelDtype::Bf16) staging_ = DeviceBuffer<float>(largest);
  }

  // A norm weight or bias: fp32, with bf16's values in bf16.
  DeviceBuffer<float> vector(const float* host, int64_t n) const {
    DeviceBuffer<float> d(host, n);
    if (dtype_ == ModelDtype::Bf16) round_to_bf16_cuda(d.data(), n, nullptr);
    return d;
  }

  DeviceLinear linear(const HostLinear& l) const {
    DeviceLinear d;
    const int64_t n = l.rows * l.cols;
    if (dtype_ == ModelDtype::Bf16) {
      staging_.upload(l.w, n);
      d.w_bf16 = DeviceBuffer<uint16_t>(n);
      fp32_to_bf16_cuda(staging_.data(), d.w_bf16.data(), n, nullptr);
    } else {
      d.w = DeviceBuffer<float>(l.w, n);
    }
    if (l.bias) d.bias = vector(l.bias, l.rows);
    d.rows = l.rows;
    d.cols = l.cols;
    return d;
  }

 private:
  ModelDtype dtype_;
  mutable DeviceBuffer<float> staging_;
};

int64_t bytes_of(const DeviceLinear& l) { return l.w.bytes() + l.w_bf16.bytes() + l.bias.bytes(); }

struct DeviceLayer {
  DeviceBuffer<float> attn_norm, ffn_norm;
  DeviceBuffer<float> q_norm, k_norm;  // Architecture::qk_norm, else empty
  DeviceLinear q, k, v, o, gate, up, down;
};

}  // namespace

bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

struct CudaForward::Impl {
  ModelConfig config;
  ModelDtype dtype = ModelDtype::Fp32;
  CublasHandle cublas;
  std::vector<DeviceLayer> layers;
  DeviceBuffer<float> output_norm;
  DeviceLinear lm_head;
  DeviceBuffer<float> inv_freq;  // [head_dim / 2]

  // One chunk's buffers, grown to the largest chunk seen: decode reuses them every step
  // instead of allocating (a forward is not reentrant, as on the CPU).
  struct Scratch {
    int64_t rows = 0;
    DeviceBuffer<float> x, h, q, k, v, attn, gate, up, logits;
    DeviceBuffer<uint16_t> gemm_in;  // bf16: the operand of the next GEMMs
    DeviceBuffer<int32_t> positions;
  };
  mutable Scratch s;

  bool bf16() const { return dtype == ModelDtype::Bf16; }

  // An activation stored as an engine stores it: rounded to bf16 in bf16, as is in fp32.
  void store_rounded(float* x, int64_t count) const {
    if (bf16()) round_to_bf16_cuda(x, count, nullptr);
  }

  // The input rows of the GEMMs that follow, as their dtype's operand: in bf16 rounded into
  // s.gemm_in once, for every GEMM that reads them (q, k and v; gate and up).
  struct GemmInput {
    const float* fp32 = nullptr;
    const uint16_t* bf16 = nullptr;
  };
  GemmInput gemm_input(const float* x, int64_t count) const {
    if (!bf16()) return {x, nullptr};
    fp32_to_bf16_cuda(x, s.gemm_in.data(), count, nullptr);
    return {nullptr, s.gemm_in.data()};
  }

  // y = x . w^T + bias, then stored as an activation (rounded in bf16) unless it is logits.
  void linear(const DeviceLinear& l, GemmInput x, int64_t n, float* y,
              bool is_logits = false) const {
    if (bf16()) {
      linear_bf16_cuda(cublas.get(), l.w_bf16.data(), l.rows, l.cols, x.bf16, n, y);
    } else {
      linear_cuda(cublas.get(), l.w.data(), l.rows, l.cols, x.fp32, n, y);
    }
    if (l.bias.size() > 0) add_bias_rows_cuda(y, l.bias.data(), n, l.rows, nullptr);
    if (!is_logits) store_rounded(y, n * l.rows);
  }

  void reserve_rows(int64_t n, bool all_logits) const {
    const ModelConfig& c = config;
    const int64_t logit_rows = all_logits ? n : 1;
    if (n > s.rows) {
      s.rows = n;
      s.x = DeviceBuffer<float>(n * c.n_embd);
      s.h = DeviceBuffer<float>(n * c.n_embd);
      s.q = DeviceBuffer<float>(n * c.n_heads * c.head_dim);
      s.k = DeviceBuffer<float>(n * c.n_kv_heads * c.head_dim);
      s.v = DeviceBuffer<float>(n * c.n_kv_heads * c.head_dim);
      s.attn = DeviceBuffer<float>(n * c.n_heads * c.head_dim);
      s.gate = DeviceBuffer<float>(n * c.n_ff);
      s.up = DeviceBuffer<float>(n * c.n_ff);
      s.positions = DeviceBuffer<int32_t>(n);
      if (bf16()) {
        const int64_t widest =
            std::max<int64_t>({c.n_embd, int64_t{c.n_heads} * c.head_dim, c.n_ff});
        s.gemm_in = DeviceBuffer<uint16_t>(n * widest);
      }
    }
    if (s.logits.size() < logit_rows * c.vocab_size) {
      s.logits = DeviceBuffer<float>(logit_rows * c.vocab_size);
    }
  }

  // The n rows' new KV into the cache and their attention over it: one cache for every row (a
  // chunk of one sequence), or, with one_each, caches[i] for row i alone (a decode step of n
  // sequences, each through its own stores).
  void attend_rows(int32_t l, int64_t n, KvCache* const* caches, bool one_each) const {
    const ModelConfig& c = config;
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    if (!one_each) {
      caches[0]->append(l, s.k.data(), s.v.data(), s.positions.data(), n);
      caches[0]->attend(l, AttentionQuery{s.q.data(), s.positions.data(), s.attn.data(),
                                          static_cast<int32_t>(n), c.n_heads, scale});
      return;
    }
    const int64_t q_width = int64_t{c.n_heads} * c.head_dim;
    const int64_t kv_width = int64_t{c.n_kv_heads} * c.head_dim;
    for (int64_t i = 0; i < n; ++i) {
      caches[i]->append(l, s.k.data() + i * kv_width, s.v.data() + i * kv_width,
                        s.positions.data() + i, 1);
      caches[i]->attend(l, AttentionQuery{s.q.data() + i * q_width, s.positions.data() + i,
                                          s.attn.data() + i * q_width, 1, c.n_heads, scale});
    }
  }

  // n = positions.size() rows at those positions (x: their embeddings on the host) through
  // every layer, the cache(s) as attend_rows takes them, each cache advanced past its rows;
  // then the logits of rows [first, n) to the host.
  void run(const float* x, const std::vector<int32_t>& positions, KvCache* const* caches,
           bool one_each, int64_t first, float* logits) const {
    const ModelConfig& c = config;
    const int64_t n = static_cast<int64_t>(positions.size());
    reserve_rows(n, /*all_logits=*/first == 0);
    s.positions.upload(positions.data(), n);
    s.x.upload(x, n * c.n_embd);
    store_rounded(s.x.data(), n * c.n_embd);  // a bf16 embedding table's rows
    for (int32_t l = 0; l < c.n_layers; ++l) layer(l, n, caches, one_each);
    if (one_each) {
      for (int64_t i = 0; i < n; ++i) caches[i]->advance(1);
    } else {
      caches[0]->advance(static_cast<int32_t>(n));
    }
    rms_norm_cuda(s.x.data() + first * c.n_embd, output_norm.data(), s.h.data(), n - first,
                  c.n_embd, c.rms_eps, nullptr);
    linear(lm_head, gemm_input(s.h.data(), (n - first) * c.n_embd), n - first, s.logits.data(),
           /*is_logits=*/true);
    s.logits.download(logits, (n - first) * c.vocab_size);  // waits for the step
  }

  // As LlamaModel's CPU block: attention inputs, the cache(s) (attend_rows), then the MLP,
  // all on the device. In bf16, rounded where cuda_forward.h's rule says.
  void layer(int32_t l, int64_t n, KvCache* const* caches, bool one_each) const {
    const ModelConfig& c = config;
    const DeviceLayer& w = layers[l];
    const int64_t q_count = n * c.n_heads * c.head_dim, kv_count = n * c.n_kv_heads * c.head_dim;
    rms_norm_cuda(s.x.data(), w.attn_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps, nullptr);
    GemmInput in = gemm_input(s.h.data(), n * c.n_embd);
    linear(w.q, in, n, s.q.data());
    linear(w.k, in, n, s.k.data());
    linear(w.v, in, n, s.v.data());
    if (c.arch->qk_norm) {  // each head over head_dim, in place, as the CPU block
      rms_norm_cuda(s.q.data(), w.q_norm.data(), s.q.data(), n * c.n_heads, c.head_dim, c.rms_eps,
                    nullptr);
      rms_norm_cuda(s.k.data(), w.k_norm.data(), s.k.data(), n * c.n_kv_heads, c.head_dim,
                    c.rms_eps, nullptr);
    }
    rope_interleaved_cuda(s.q.data(), s.positions.data(), n, c.n_heads, c.head_dim,
                          inv_freq.data(), nullptr);
    rope_interleaved_cuda(s.k.data(), s.positions.data(), n, c.n_kv_heads, c.head_dim,
                          inv_freq.data(), nullptr);
    store_rounded(s.q.data(), q_count);
    store_rounded(s.k.data(), kv_count);
    attend_rows(l, n, caches, one_each);
    linear(w.o, gemm_input(s.attn.data(), q_count), n, s.h.data());
    add_in_place_cuda(s.x.data(), s.h.data(), n * c.n_embd, nullptr);
    store_rounded(s.x.data(), n * c.n_embd);
    rms_norm_cuda(s.x.data(), w.ffn_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps, nullptr);
    in = gemm_input(s.h.data(), n * c.n_embd);
    linear(w.gate, in, n, s.gate.data());
    linear(w.up, in, n, s.up.data());
    silu_mul_cuda(s.gate.data(), s.up.data(), s.gate.data(), n * c.n_ff, nullptr);
    linear(w.down, gemm_input(s.gate.data(), n * c.n_ff), n, s.h.data());
    add_in_place_cuda(s.x.data(), s.h.data(), n * c.n_embd, nullptr);
    store_rounded(s.x.data(), n * c.n_embd);
  }
};

CudaForward::CudaForward(const ModelConfig& config, const HostWeights& weights,
                         ModelDtype dtype)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.config = config;
  m.dtype = dtype;
  int64_t largest = weights.lm_head.rows * weights.lm_head.cols;
  for (const HostLayer& h : weights.layers) {
    for (const HostLinear* l : {&h.q, &h.k, &h.v, &h.o, &h.gate, &h.up, &h.down}) {
      largest = std::max(largest, l->rows * l->cols);
    }
  }
  const WeightUploader upload(dtype, largest);
  for (const HostLayer& h : weights.layers) {
    DeviceLayer d;
    d.attn_norm = upload.vector(h.attn_norm, config.n_embd);
    d.ffn_norm = upload.vector(h.ffn_norm, config.n_embd);
    if (config.arch->qk_norm) {
      d.q_norm = upload.vector(h.q_norm, config.head_dim);
      d.k_norm = upload.vector(h.k_norm, config.head_dim);
    }
    d.q = upload.linear(h.q);
    d.k = upload.linear(h.k);
    d.v = upload.linear(h.v);
    d.o = upload.linear(h.o);
    d.gate = upload.linear(h.gate);
    d.up = upload.linear(h.up);
    d.down = upload.linear(h.down);
    m.layers.push_back(std::move(d));
  }
  m.output_norm = upload.vector(weights.output_norm, config.n_embd);
  m.lm_head = upload.linear(weights.lm_head);
  m.inv_freq = DeviceBuffer<float>(config.rope_inv_freq.data(),
                                   static_cast<int64_t>(config.rope_inv_freq.size()));
  // The staging buffer is freed on return: wait until the conversions have read it.
  cuda_check(cudaDeviceSynchronize(), "CudaForward", "weight upload");
}

CudaForward::~CudaForward() = default;

void CudaForward::forward_chunk(const float* x, int64_t n, KvCache& cache, bool all_logits,
                                float* logits) const {
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);
  KvCache* const one[] = {&cache};
  impl_->run(x, positions, one, false, all_logits ? 0 : n - 1, logits);
}

void CudaForward::decode_rows(const float* x, int64_t n, KvCache* const* caches,
                              float* logits) const {
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = caches[i]->next_position();
  impl_->run(x, positions, caches, true, 0, logits);
}

ModelDtype CudaForward::dtype() const { return impl_->dtype; }

int64_t CudaForward::weight_bytes() const {
  const Impl& m = *impl_;
  int64_t bytes = m.output_norm.bytes() + bytes_of(m.lm_head);
  for (const DeviceLayer& l : m.layers) {
    bytes += l.attn_norm.bytes() + l.ffn_norm.bytes() + l.q_norm.bytes() + l.k_norm.bytes();
    for (const DeviceLinear* d : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      bytes += bytes_of(*d);
    }
  }
  return bytes;
}

}  // namespace kvbench
