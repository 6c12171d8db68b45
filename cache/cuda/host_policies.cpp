#include "cache/cuda/host_policies.h"

#include <string>

#include "common/input_error.h"
#include "kernels/cuda/scores.h"

namespace kvbench {

namespace {

constexpr const char* kWho = "cuda_host_policies";

template <class T>
std::vector<T> download(const T* device, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  if (n > 0) {
    cuda_check(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), kWho,
               "copy to the host");
  }
  return host;
}

// A host copy of a query whose pointers are on the device (no output: policies read).
struct HostQuery {
  std::vector<float> q;
  std::vector<int32_t> positions;
  AttentionQuery query;
  HostQuery(const AttentionQuery& on_device, int32_t head_dim)
      : q(download(on_device.q,
                   static_cast<int64_t>(on_device.n_queries) * on_device.n_heads * head_dim)),
        positions(download(on_device.q_positions, on_device.n_queries)),
        query{q.data(), positions.data(), nullptr, on_device.n_queries, on_device.n_heads,
              on_device.scale} {}
};

// A host copy of a device layer's stored tokens, packed to capacity n_tokens; the shape alone
// for a layer whose heads hold their own counts (its view has no pointers, as on the host).
struct HostKv {
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  DenseKv kv;
  explicit HostKv(const DenseKv& on_device)
      : k(rows(on_device.k, on_device, on_device.head_dim)),
        v(rows(on_device.v, on_device, on_device.head_dim)),
        positions(rows(on_device.positions, on_device, 1)),
        kv{on_device.k ? k.data() : nullptr,
           on_device.v ? v.data() : nullptr,
           on_device.positions ? positions.data() : nullptr,
           on_device.n_kv_heads,
           on_device.head_dim,
           on_device.k ? on_device.n_tokens : 0,
           on_device.n_tokens} {}

  // Each head's first n_tokens rows of `width` elements, one strided copy.
  template <class T>
  static std::vector<T> rows(const T* device, const DenseKv& kv, int64_t width) {
    if (device == nullptr) return {};  // ragged: shape only
    const size_t row = static_cast<size_t>(kv.n_tokens * width) * sizeof(T);
    std::vector<T> host(static_cast<size_t>(kv.n_kv_heads * kv.n_tokens * width));
    if (!host.empty()) {
      cuda_check(cudaMemcpy2D(host.data(), row, device, kv.capacity * width * sizeof(T), row,
                              kv.n_kv_heads, cudaMemcpyDeviceToHost),
                 kWho, "copy of a layer to the host");
    }
    return host;
  }
};

}  // namespace

HostPolicyOnDevice::HostPolicyOnDevice(std::unique_ptr<TokenPolicy> inner)
    : inner_(std::move(inner)) {}

std::unique_ptr<TokenPolicy> HostPolicyOnDevice::clone() const {
  return std::make_unique<HostPolicyOnDevice>(inner_->clone());
}

void HostPolicyOnDevice::observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) {
  const TokenPolicy::ScoredRows rows = inner_->scored_rows();
  if (rows == TokenPolicy::ScoredRows::None) {
    const HostQuery host_query(query, kv.head_dim);
    const HostKv host_kv(kv);
    inner_->observe(layer, host_query.query, host_kv.kv);
    return;
  }
  // The attention the slots receive, summed on the device over the rows the policy reads:
  // [n_heads, n_tokens] floats come down instead of the layer's keys and values.
  const AttentionQuery scored =
      rows == TokenPolicy::ScoredRows::Last ? last_query_row(query, kv.head_dim) : query;
  const int64_t n = static_cast<int64_t>(query.n_heads) * kv.n_tokens;
  const DeviceBuffer<float> scores(n);
  if (n > 0) {
    cuda_check(cudaMemsetAsync(scores.data(), 0, n * sizeof(float), nullptr), kWho,
               "clear the scores");
    attention_scores_cuda(scored, kv, scores.data(), nullptr);
  }
  const std::vector<float> host = download(scores.data(), n);  // waits for the kernel
  inner_->observe_scores(layer, host.data(), query.n_heads, kv.n_tokens);
}

bool HostPolicyOnDevice::plan(int32_t layer, const DenseKv& kv, CachePhase phase,
                              RetainPlan& plan) {
  if (!inner_->plans_on_kv()) {  // positions are enough
    const std::vector<int32_t> positions = HostKv::rows(kv.positions, kv, 1);
    const DenseKv host{nullptr,     nullptr,     positions.data(), kv.n_kv_heads,
                       kv.head_dim, kv.n_tokens, kv.n_tokens};
    return inner_->plan(layer, host, phase, plan);
  }
  const HostKv host_kv(kv);
  return inner_->plan(layer, host_kv.kv, phase, plan);
}

void HostPolicyOnDevice::context_ending(int32_t layer, const DenseKv& kv) {
  const HostKv host_kv(kv);
  inner_->context_ending(layer, host_kv.kv);
}

HostReaderOnDevice::HostReaderOnDevice(std::unique_ptr<ReadPolicy> inner, int32_t n_kv_heads,
                                       int32_t head_dim)
    : inner_(std::move(inner)), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {}

std::unique_ptr<ReadPolicy> HostReaderOnDevice::clone() const {
  return std::make_unique<HostReaderOnDevice>(inner_->clone(), n_kv_heads_, head_dim_);
}

void HostReaderOnDevice::appended(int32_t layer, const float* k, int64_t first_slot,
                                  int64_t n_new) {
  const std::vector<float> host_k = download(k, n_new * n_kv_heads_ * head_dim_);
  inner_->appended(layer, host_k.data(), first_slot, n_new);
}

const PageSelection* HostReaderOnDevice::select(int32_t layer, const AttentionQuery& query,
                                                int64_t n_tokens, int64_t* bytes_read) {
  const HostQuery host_query(query, head_dim_);
  const PageSelection* chosen = inner_->select(layer, host_query.query, n_tokens, bytes_read);
  if (!chosen) return nullptr;
  const int64_t n = static_cast<int64_t>(n_kv_heads_) * chosen->n_selected;
  if (pages_.size() < n) pages_ = DeviceBuffer<int32_t>(n);
  pages_.upload(chosen->pages, n);
  selection_ = PageSelection{pages_.data(), chosen->n_selected, chosen->page_tokens};
  return &selection_;
}

}  // namespace kvbench
