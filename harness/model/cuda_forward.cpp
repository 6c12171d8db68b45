#include "harness/model/cuda_forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/linear.h"

namespace kvbench {

namespace {

struct DeviceLinear {
  DeviceBuffer<float> w;     // [rows, cols]
  DeviceBuffer<float> bias;  // [rows], or empty
  int64_t rows = 0;
  int64_t cols = 0;
};

DeviceLinear upload(const HostLinear& l) {
  DeviceLinear d;
  d.w = DeviceBuffer<float>(l.w, l.rows * l.cols);
  if (l.bias) d.bias = DeviceBuffer<float>(l.bias, l.rows);
  d.rows = l.rows;
  d.cols = l.cols;
  return d;
}

struct DeviceLayer {
  DeviceBuffer<float> attn_norm, ffn_norm;
  DeviceLinear q, k, v, o, gate, up, down;
};

}  // namespace

bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

struct CudaForward::Impl {
  ModelConfig config;
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
    DeviceBuffer<int32_t> positions;
  };
  mutable Scratch s;

  void linear(const DeviceLinear& l, const float* x, int64_t n, float* y) const {
    linear_cuda(cublas.get(), l.w.data(), l.rows, l.cols, x, n, y);
    if (l.bias.size() > 0) add_bias_rows_cuda(y, l.bias.data(), n, l.rows, nullptr);
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
    }
    if (s.logits.size() < logit_rows * c.vocab_size) {
      s.logits = DeviceBuffer<float>(logit_rows * c.vocab_size);
    }
  }

  // As LlamaModel's CPU block: attention inputs, the cache, then the MLP, all on the device.
  void layer(int32_t l, int64_t n, KvCache& cache) const {
    const ModelConfig& c = config;
    const DeviceLayer& w = layers[l];
    rms_norm_cuda(s.x.data(), w.attn_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps, nullptr);
    linear(w.q, s.h.data(), n, s.q.data());
    linear(w.k, s.h.data(), n, s.k.data());
    linear(w.v, s.h.data(), n, s.v.data());
    rope_interleaved_cuda(s.q.data(), s.positions.data(), n, c.n_heads, c.head_dim,
                          inv_freq.data(), nullptr);
    rope_interleaved_cuda(s.k.data(), s.positions.data(), n, c.n_kv_heads, c.head_dim,
                          inv_freq.data(), nullptr);
    cache.append(l, s.k.data(), s.v.data(), s.positions.data(), n);
    cache.attend(l, AttentionQuery{s.q.data(), s.positions.data(), s.attn.data(),
                                   static_cast<int32_t>(n), c.n_heads,
                                   1.f / std::sqrt(static_cast<float>(c.head_dim))});
    linear(w.o, s.attn.data(), n, s.h.data());
    add_in_place_cuda(s.x.data(), s.h.data(), n * c.n_embd, nullptr);
    rms_norm_cuda(s.x.data(), w.ffn_norm.data(), s.h.data(), n, c.n_embd, c.rms_eps, nullptr);
    linear(w.gate, s.h.data(), n, s.gate.data());
    linear(w.up, s.h.data(), n, s.up.data());
    silu_mul_cuda(s.gate.data(), s.up.data(), s.gate.data(), n * c.n_ff, nullptr);
    linear(w.down, s.gate.data(), n, s.h.data());
    add_in_place_cuda(s.x.data(), s.h.data(), n * c.n_embd, nullptr);
  }
};

CudaForward::CudaForward(const ModelConfig& config, const HostWeights& weights)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.config = config;
  for (const HostLayer& h : weights.layers) {
    DeviceLayer d;
    d.attn_norm = DeviceBuffer<float>(h.attn_norm, config.n_embd);
    d.ffn_norm = DeviceBuffer<float>(h.ffn_norm, config.n_embd);
    d.q = upload(h.q);
    d.k = upload(h.k);
    d.v = upload(h.v);
    d.o = upload(h.o);
    d.gate = upload(h.gate);
    d.up = upload(h.up);
    d.down = upload(h.down);
    m.layers.push_back(std::move(d));
  }
  m.output_norm = DeviceBuffer<float>(weights.output_norm, config.n_embd);
  m.lm_head = upload(weights.lm_head);
  m.inv_freq = DeviceBuffer<float>(config.rope_inv_freq.data(),
                                   static_cast<int64_t>(config.rope_inv_freq.size()));
}

CudaForward::~CudaForward() = default;

void CudaForward::forward_chunk(const float* x, int64_t n, KvCache& cache, bool all_logits,
                                float* logits) const {
  const Impl& m = *impl_;
  const ModelConfig& c = m.config;
  m.reserve_rows(n, all_logits);
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);
  m.s.positions.upload(positions.data(), n);
  m.s.x.upload(x, n * c.n_embd);
  for (int32_t l = 0; l < c.n_layers; ++l) m.layer(l, n, cache);
  cache.advance(static_cast<int32_t>(n));

  const int64_t first = all_logits ? 0 : n - 1;
  rms_norm_cuda(m.s.x.data() + first * c.n_embd, m.output_norm.data(), m.s.h.data(), n - first,
                c.n_embd, c.rms_eps, nullptr);
  m.linear(m.lm_head, m.s.h.data(), n - first, m.s.logits.data());
  m.s.logits.download(logits, (n - first) * c.vocab_size);  // waits for the chunk
}

}  // namespace kvbench
