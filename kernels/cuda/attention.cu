#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/narrow_element.h"

namespace kvbench {
namespace {

using cuda::check;
using cuda::merge_splits_kernel;
using cuda::warp_sum;

constexpr int kWarps = 4;           // warps per block, each walking its own keys
constexpr int kMaxGroup = 8;        // query heads of one KV group handled by one block
constexpr int kMinSplitKeys = 64;  // split-K never makes a split shorter than this
constexpr int kMaxSplits = 256;    // nor more splits than this (the merge walks them in turn)
constexpr int kBlocksPerSm = 8;    // split until about this many blocks per SM (latency hiding)
constexpr float kLog2e = 1.4426950408889634f;

// The stored slots a block walks, as indices j in [0, count): every slot in order (dense) ...
struct AllSlots {
  __device__ __forceinline__ int64_t slot(int, int64_t j) const { return j; }
};

// ... or KV head kvh's selected pages one after another (Quest's gathered attention), j / page
// tokens picking the page; -1 past a partial last page or for a negative page.
struct SelectedSlots {
  const int32_t* pages;  // [n_kv_heads, n_selected]
  int32_t n_selected;
  int32_t page_tokens;
  int64_t n_tokens;
  __device__ __forceinline__ int64_t slot(int kvh, int64_t j) const {
    const int32_t page = pages[static_cast<int64_t>(kvh) * n_selected + j / page_tokens];
    const int64_t t = static_cast<int64_t>(page) * page_tokens + j % page_tokens;
    return page >= 0 && t < n_tokens ? t : -1;
  }
};

// How a block reads stored rows: head(kvh) is KV head kvh's rows, whose load gives lane's
// elements e * 32 + lane of slot t's key and value in fp32. One head of a DenseKv ...
struct F32Head {
  const float* k;            // [n_tokens, D] from slot 0
  const float* v;
  const int32_t* positions;  // [n_tokens]
  int64_t n_tokens;          // slots held: a slot at or past it is never read
  template <int E>
  __device__ __forceinline__ void load(int64_t t, int lane, float (&k_out)[E],
                                       float (&v_out)[E]) const {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      k_out[e] = k[t * (E * 32) + e * 32 + lane];
      v_out[e] = v[t * (E * 32) + e * 32 + lane];
    }
  }
};

// ... of the rectangle [n_kv_heads, capacity, D] (DenseKv) ...
struct F32Rows {
  const float* k;
  const float* v;
  const int32_t* positions;  // [n_kv_heads, capacity]
  int64_t capacity;
  int64_t n_tokens;
  int32_t head_dim;
  __device__ __forceinline__ F32Head head(int kvh) const {
    const int64_t at = static_cast<int64_t>(kvh) * capacity;
    return F32Head{k + at * head_dim, v + at * head_dim, positions + at, n_tokens};
  }
};

// ... or of heads held apart, each with its own count (a ragged layer: `heads` is a device
// array of one-head DenseKv, as attention_ragged_cpu takes on the host) ...
struct RaggedRows {
  const DenseKv* heads;  // [n_kv_heads], on the device
  __device__ __forceinline__ F32Head head(int kvh) const {
    const DenseKv h = heads[kvh];
    return F32Head{h.k, h.v, h.positions, h.n_tokens};
  }
};

// ... or in a narrow element (NarrowKv), widened as it is loaded: the conversion is fused into
// the kernel's reads, nothing is widened in memory. Each value equals decode_kv_rows's (fp8:
// the code's value times the row's scale, one rounding).
template <KvElement Element>
struct NarrowHead {
  const void* k;  // [n_tokens, D] elements from slot 0
  const void* v;
  const float* k_scale;  // [n_tokens], fp8 only
  const float* v_scale;
  const int32_t* positions;
  int64_t n_tokens;
  template <int E>
  __device__ __forceinline__ void load(int64_t t, int lane, float (&k_out)[E],
                                       float (&v_out)[E]) const {
    constexpr int D = E * 32;
    if constexpr (Element == KvElement::F8E4M3) {
      const uint8_t* kb = static_cast<const uint8_t*>(k) + t * D;
      const uint8_t* vb = static_cast<const uint8_t*>(v) + t * D;
      const float ks = k_scale[t], vs = v_scale[t];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        k_out[e] = narrow::e4m3_value(kb[e * 32 + lane]) * ks;
        v_out[e] = narrow::e4m3_value(vb[e * 32 + lane]) * vs;
      }
    } else {
      const uint16_t* kb = static_cast<const uint16_t*>(k) + t * D;
      const uint16_t* vb = static_cast<const uint16_t*>(v) + t * D;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if constexpr (Element == KvElement::F16) {
          k_out[e] = narrow::half_value(kb[e * 32 + lane]);
          v_out[e] = narrow::half_value(vb[e * 32 + lane]);
        } else {
          k_out[e] = narrow::bf16_value(kb[e * 32 + lane]);
          v_out[e] = narrow::bf16_value(vb[e * 32 + lane]);
        }
      }
    }
  }
};

template <KvElement Element>
struct NarrowRows {
  const void* k;  // [n_kv_heads, capacity, D] elements
  const void* v;
  const float* k_scale;  // [n_kv_heads, capacity], fp8 only
  const float* v_scale;
  const int32_t* positions;
  int64_t capacity;
  int64_t n_tokens;
  int32_t head_dim;
  __device__ __forceinline__ NarrowHead<Element> head(int kvh) const {
    const int64_t at = static_cast<int64_t>(kvh) * capacity;
    const int64_t bytes = at * head_dim * (Element == KvElement::F8E4M3 ? 1 : 2);
    const bool scaled = Element == KvElement::F8E4M3;
    return NarrowHead<Element>{static_cast<const uint8_t*>(k) + bytes,
                               static_cast<const uint8_t*>(v) + bytes,
                               scaled ? k_scale + at : nullptr,
                               scaled ? v_scale + at : nullptr,
                               positions + at,
                               n_tokens};
  }
};

// One block: query i, up to kMaxGroup heads of KV head kvh, slot indices [t0, t1) of `slots`.
// Each warp keeps an online softmax (max m, denominator l, unnormalised acc) per head over
// the keys it visits (coalesced: lane holds elements lane, lane + 32, ...); the block then
// merges its warps. One split writes normalised output; several write (acc, m, l) partials.
template <int D, class Slots, class Rows>
__global__ void __launch_bounds__(kWarps * 32)
    attention_split_kernel(AttentionQuery query, Rows kv, Slots slots, int64_t n_slots,
                           int group, int head_chunks, int64_t split_len, int n_splits,
                           float* partial) {
  constexpr int E = D / 32;
  const int i = blockIdx.x;
  const int kvh = blockIdx.y / head_chunks;
  const int g0 = (blockIdx.y % head_chunks) * kMaxGroup;
  const int ng = min(kMaxGroup, group - g0);
  const int split = blockIdx.z;
  const int64_t t0 = split * split_len;
  const int64_t t1 = min(n_slots, t0 + split_len);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int32_t qpos = query.q_positions[i];

  float q[kMaxGroup][E], acc[kMaxGroup][E], m[kMaxGroup], l[kMaxGroup];
  const float qscale = query.scale * kLog2e;  // scores in the log2 domain: exp2f below
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      acc[g][e] = 0.0f;
      q[g][e] = 0.0f;
      if (g < ng) {
        const int h = kvh * group + g0 + g;
        q[g][e] =
            query.q[(static_cast<int64_t>(i) * query.n_heads + h) * D + e * 32 + lane] * qscale;
      }
    }
  }

  const auto rows = kv.head(kvh);
  // Software-pipelined: the next key's position, K and V rows are loaded before this key's
  // math, so each warp has two keys' loads in flight instead of one (decode is bound by
  // load latency, not bandwidth, at these few blocks). A slot past the pages (-1) loads
  // nothing; visibility is decided when the key is used.
  float kr[E], vr[E], kn[E], vn[E];
  int32_t pos = INT32_MAX, pos_next = INT32_MAX;
  auto fetch = [&](int64_t j, float (&k)[E], float (&v)[E], int32_t& p) {
    p = INT32_MAX;  // invisible unless loaded
    if (j >= t1) return;
    const int64_t t = slots.slot(kvh, j);
    if (t < 0 || t >= rows.n_tokens) return;  // past a ragged head's own count
    p = rows.positions[t];
    rows.template load<E>(t, lane, k, v);
  };
  fetch(t0 + warp, kr, vr, pos);
  for (int64_t j = t0 + warp; j < t1; j += kWarps) {
    fetch(j + kWarps, kn, vn, pos_next);
    if (pos <= qpos) {  // uniform across the warp
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < ng) {
          float s = 0.0f;
#pragma unroll
          for (int e = 0; e < E; ++e) s = fmaf(q[g][e], kr[e], s);
          s = warp_sum(s);
          const float m_new = fmaxf(m[g], s);
          const float alpha = exp2f(m[g] - m_new);  // 0 while m was -inf
          const float p = exp2f(s - m_new);
          l[g] = l[g] * alpha + p;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] = fmaf(acc[g][e], alpha, p * vr[e]);
          m[g] = m_new;
        }
      }
    }
    pos = pos_next;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kr[e] = kn[e];
      vr[e] = vn[e];
    }
  }

  __shared__ float sm_acc[kWarps][kMaxGroup][D];
  __shared__ float sm_m[kWarps][kMaxGroup];
  __shared__ float sm_l[kWarps][kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) sm_acc[warp][g][e * 32 + lane] = acc[g][e];
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < ng * D; idx += blockDim.x) {
    const int g = idx / D;
    const int d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float o = 0.0f, sum = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float c = exp2f(sm_m[w][g] - mx);  // 0 for a warp that saw no key
        o += c * sm_acc[w][g][d];
        sum += c * sm_l[w][g];
      }
    }
    const int h = kvh * group + g0 + g;
    const int64_t row = static_cast<int64_t>(i) * query.n_heads + h;
    if (partial == nullptr) {
      query.out[row * D + d] = sum > 0.0f ? o / sum : 0.0f;  // no visible key: zeros
    } else {
      float* p = partial + (row * n_splits + split) * (D + 2);
      p[d] = o;
      if (d == 0) {
        p[D] = mx;
        p[D + 1] = sum;
      }
    }
  }
}

template <int D, class Slots, class Rows>
void launch(const AttentionQuery& query, int32_t n_kv_heads, Rows kv, Slots slots,
            int64_t n_slots, const char* who, cudaStream_t stream) {
  const int group = query.n_heads / n_kv_heads;
  const int head_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  int device = 0, sms = 1;
  check(cudaGetDevice(&device), who, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), who, "SM count");
  // Split-K only when (query, head chunk) blocks alone would leave SMs short of warps: a
  // decode step has n_kv_heads blocks, and one warp walks its keys one load at a time, so
  // measured on an H200 (132 SMs) 2 blocks per SM and 256-key splits left decode attention
  // at 6% of the memory bandwidth, bound by load latency.
  const int64_t base = static_cast<int64_t>(query.n_queries) * n_kv_heads * head_chunks;
  const int64_t want = static_cast<int64_t>(kBlocksPerSm) * sms;
  int64_t splits = 1;
  if (base < want) {
    const int64_t most = std::max<int64_t>(1, n_slots / kMinSplitKeys);
    splits = std::min<int64_t>({(want + base - 1) / base, most, int64_t{kMaxSplits}});
  }
  const int64_t split_len = std::max<int64_t>(1, (n_slots + splits - 1) / splits);
  splits = std::max<int64_t>(1, (n_slots + split_len - 1) / split_len);

  const dim3 grid(query.n_queries, n_kv_heads * head_chunks, static_cast<unsigned>(splits));
  if (splits == 1) {
    attention_split_kernel<D><<<grid, kWarps * 32, 0, stream>>>(query, kv, slots, n_slots, group,
                                                                head_chunks, split_len, 1, nullptr);
    check(cudaGetLastError(), who, "split kernel launch");
    return;
  }
  float* partial = nullptr;
  const size_t bytes =
      static_cast<size_t>(query.n_queries) * query.n_heads * splits * (D + 2) * sizeof(float);
  cuda::keep_pool_memory(who);
  check(cudaMallocAsync(reinterpret_cast<void**>(&partial), bytes, stream), who, "cudaMallocAsync");
  attention_split_kernel<D><<<grid, kWarps * 32, 0, stream>>>(
      query, kv, slots, n_slots, group, head_chunks, split_len, static_cast<int>(splits), partial);
  check(cudaGetLastError(), who, "split kernel launch");
  merge_splits_kernel<D><<<static_cast<unsigned>(query.n_queries * query.n_heads), D, 0, stream>>>(
      query, static_cast<int>(splits), partial);
  check(cudaGetLastError(), who, "merge kernel launch");
  check(cudaFreeAsync(partial, stream), who, "cudaFreeAsync");
}

void check_heads(const AttentionQuery& query, int32_t n_kv_heads, const char* who) {
  if (n_kv_heads <= 0 || query.n_heads % n_kv_heads != 0) {
    throw std::invalid_argument(std::string(who) + ": n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(n_kv_heads) + ")");
  }
}

void check_pages(const PageSelection& pages, const char* who) {
  if (pages.page_tokens <= 0 || pages.n_selected < 0) {
    throw std::invalid_argument(std::string(who) +
                                ": page_tokens must be > 0 and n_selected >= 0");
  }
}

// One head_dim table for every entry point.
template <class Slots, class Rows>
void dispatch(const AttentionQuery& query, int32_t n_kv_heads, int32_t head_dim, Rows kv,
              Slots slots, int64_t n_slots, const char* who, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      launch<64>(query, n_kv_heads, kv, slots, n_slots, who, stream);
      break;
    case 128:
      launch<128>(query, n_kv_heads, kv, slots, n_slots, who, stream);
      break;
    default:
      throw std::invalid_argument(std::string(who) + ": head_dim must be 64 or 128, got " +
                                  std::to_string(head_dim));
  }
}

// Every stored slot, or only the selected pages.
template <class Rows>
void dispatch_slots(const AttentionQuery& query, int32_t n_kv_heads, int32_t head_dim,
                    int64_t n_tokens, Rows kv, const PageSelection* pages, const char* who,
                    cudaStream_t stream) {
  if (pages == nullptr) {
    dispatch(query, n_kv_heads, head_dim, kv, AllSlots{}, n_tokens, who, stream);
    return;
  }
  check_pages(*pages, who);
  const SelectedSlots slots{pages->pages, pages->n_selected, pages->page_tokens, n_tokens};
  dispatch(query, n_kv_heads, head_dim, kv, slots,
           static_cast<int64_t>(pages->n_selected) * pages->page_tokens, who, stream);
}

F32Rows f32_rows(const DenseKv& kv) {
  return F32Rows{kv.k, kv.v, kv.positions, kv.capacity, kv.n_tokens, kv.head_dim};
}

template <KvElement Element>
NarrowRows<Element> narrow_rows(const NarrowKv& kv) {
  return NarrowRows<Element>{kv.k,         kv.v,        kv.k_scale,   kv.v_scale,
                             kv.positions, kv.capacity, kv.n_tokens, kv.head_dim};
}

}  // namespace

void attention_dense_cuda(const AttentionQuery& query, const DenseKv& kv, cudaStream_t stream) {
  const char* who = "attention_dense_cuda";
  if (query.n_queries <= 0) return;
  check_heads(query, kv.n_kv_heads, who);
  dispatch_slots(query, kv.n_kv_heads, kv.head_dim, kv.n_tokens, f32_rows(kv), nullptr, who,
                 stream);
}

void attention_pages_cuda(const AttentionQuery& query, const DenseKv& kv,
                          const PageSelection& pages, cudaStream_t stream) {
  const char* who = "attention_pages_cuda";
  if (query.n_queries <= 0) return;
  check_heads(query, kv.n_kv_heads, who);
  dispatch_slots(query, kv.n_kv_heads, kv.head_dim, kv.n_tokens, f32_rows(kv), &pages, who,
                 stream);
}

void attention_ragged_cuda(const AttentionQuery& query, const DenseKv* heads, int32_t n_kv_heads,
                           int32_t head_dim, int64_t max_tokens, cudaStream_t stream) {
  const char* who = "attention_ragged_cuda";
  if (query.n_queries <= 0) return;
  check_heads(query, n_kv_heads, who);
  dispatch(query, n_kv_heads, head_dim, RaggedRows{heads}, AllSlots{}, max_tokens, who, stream);
}

void attention_narrow_cuda(const AttentionQuery& query, const NarrowKv& kv,
                           const PageSelection* pages, cudaStream_t stream) {
  const char* who = "attention_narrow_cuda";
  if (query.n_queries <= 0) return;
  check_heads(query, kv.n_kv_heads, who);
  const auto run = [&](auto rows) {
    dispatch_slots(query, kv.n_kv_heads, kv.head_dim, kv.n_tokens, rows, pages, who, stream);
  };
  switch (kv.element) {
    case KvElement::F16:
      run(narrow_rows<KvElement::F16>(kv));
      break;
    case KvElement::BF16:
      run(narrow_rows<KvElement::BF16>(kv));
      break;
    case KvElement::F8E4M3:
      if (kv.k_scale == nullptr || kv.v_scale == nullptr) {
        throw std::invalid_argument(std::string(who) + ": fp8 needs k_scale and v_scale");
      }
      run(narrow_rows<KvElement::F8E4M3>(kv));
      break;
  }
}

}  // namespace kvbench
