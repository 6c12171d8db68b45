#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/narrow_element.h"
#include "kernels/sparse_pairs.h"

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
constexpr int kKeyTile = 64;       // a sparse pattern skips slots in tiles of this many
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

// Which visible keys a block's query heads read: all of them (dense) ...
struct AllKeys {
  static constexpr bool kSparse = false;
  __device__ __forceinline__ bool reads(int, int32_t, int32_t) const { return true; }
};

// ... or those of a sparse pattern (SparsePattern's rule), its lists as one byte per (query
// head, position) on the device: column[h * span + kp], offset[h * span + (qp - kp)]. span is
// one past the last query position, so every visible key and offset falls inside.
struct PatternKeys {
  static constexpr bool kSparse = true;
  int32_t sink;
  int32_t local;
  int32_t dense_from;
  const uint8_t* column;  // [n_heads, span]; nullptr without columns
  const uint8_t* offset;  // [n_heads, span]; nullptr without offsets
  int64_t span;
  __device__ __forceinline__ bool reads(int h, int32_t qp, int32_t kp) const {
    if (qp >= dense_from || kp < sink || qp - kp < local) return true;
    if (column != nullptr && column[h * span + kp]) return true;
    return offset != nullptr && offset[h * span + (qp - kp)];
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
// A sparse pattern (Keys) first tests each tile of kKeyTile slots: one that no head of the
// block reads is skipped whole; in the others a head folds only the keys it reads.
template <int D, class Slots, class Rows, class Keys>
__global__ void __launch_bounds__(kWarps * 32)
    attention_split_kernel(AttentionQuery query, Rows kv, Slots slots, int64_t n_slots,
                           int group, int head_chunks, int64_t split_len, int n_splits,
                           float* partial, Keys keys) {
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
  auto fetch = [&](int64_t j, int64_t end, float (&k)[E], float (&v)[E], int32_t& p) {
    p = INT32_MAX;  // invisible unless loaded
    if (j >= end) return;
    const int64_t t = slots.slot(kvh, j);
    if (t < 0 || t >= rows.n_tokens) return;  // past a ragged head's own count
    p = rows.positions[t];
    rows.template load<E>(t, lane, k, v);
  };
  // Slot indices [a, b), warp w taking a + w, a + w + kWarps, ...: every key a head reads
  // folded into its online softmax.
  auto walk = [&](int64_t a, int64_t b) {
    fetch(a + warp, b, kr, vr, pos);
    for (int64_t j = a + warp; j < b; j += kWarps) {
      fetch(j + kWarps, b, kn, vn, pos_next);
      if (pos <= qpos) {  // uniform across the warp
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < ng && keys.reads(kvh * group + g0 + g, qpos, pos)) {
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
  };
  if constexpr (!Keys::kSparse) {
    walk(t0, t1);
  } else {
    // Tiles start at t0 and hold a multiple of kWarps slots, so each warp folds the keys it
    // folds in the dense walk, in the same order: a pattern that reads every key gives the
    // dense output bit for bit. Each warp tests the tile itself (its lanes two slots each).
    for (int64_t a = t0; a < t1; a += kKeyTile) {
      const int64_t b = min(t1, a + static_cast<int64_t>(kKeyTile));
      bool read = false;
      for (int64_t j = a + lane; j < b && !read; j += 32) {
        const int64_t t = slots.slot(kvh, j);
        if (t < 0 || t >= rows.n_tokens) continue;
        const int32_t p = rows.positions[t];
        for (int g = 0; g < ng && p <= qpos && !read; ++g) {
          read = keys.reads(kvh * group + g0 + g, qpos, p);
        }
      }
      if (__any_sync(0xffffffffu, read)) walk(a, b);
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

template <int D, class Slots, class Rows, class Keys>
void launch(const AttentionQuery& query, int32_t n_kv_heads, Rows kv, Slots slots,
            int64_t n_slots, const char* who, cudaStream_t stream, Keys keys) {
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
    attention_split_kernel<D><<<grid, kWarps * 32, 0, stream>>>(
        query, kv, slots, n_slots, group, head_chunks, split_len, 1, nullptr, keys);
    check(cudaGetLastError(), who, "split kernel launch");
    return;
  }
  float* partial = nullptr;
  const size_t bytes =
      static_cast<size_t>(query.n_queries) * query.n_heads * splits * (D + 2) * sizeof(float);
  cuda::keep_pool_memory(who);
  check(cudaMallocAsync(reinterpret_cast<void**>(&partial), bytes, stream), who, "cudaMallocAsync");
  attention_split_kernel<D><<<grid, kWarps * 32, 0, stream>>>(
      query, kv, slots, n_slots, group, head_chunks, split_len, static_cast<int>(splits), partial,
      keys);
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

void check_head_dim(int32_t head_dim, const char* who) {
  if (head_dim != 64 && head_dim != 128) {
    throw std::invalid_argument(std::string(who) + ": head_dim must be 64 or 128, got " +
                                std::to_string(head_dim));
  }
}

// One head_dim table for every entry point.
template <class Slots, class Rows, class Keys = AllKeys>
void dispatch(const AttentionQuery& query, int32_t n_kv_heads, int32_t head_dim, Rows kv,
              Slots slots, int64_t n_slots, const char* who, cudaStream_t stream,
              Keys keys = Keys{}) {
  check_head_dim(head_dim, who);
  if (head_dim == 64) {
    launch<64>(query, n_kv_heads, kv, slots, n_slots, who, stream, keys);
  } else {
    launch<128>(query, n_kv_heads, kv, slots, n_slots, who, stream, keys);
  }
}

// marks[h * span + x] = 1 for each entry x in [0, span) of row h of list [n_heads, n].
__global__ void mark_positions_kernel(const int32_t* list, int32_t n, int64_t n_entries,
                                      int64_t span, uint8_t* marks) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_entries) return;
  const int32_t x = list[idx];
  if (x >= 0 && x < span) marks[(idx / n) * span + x] = 1;
}

// A host copy of n elements at device pointer `from`, enqueued on the stream.
template <class T>
std::vector<T> copy_down(const T* from, int64_t n, const char* who, cudaStream_t stream) {
  std::vector<T> host(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n > 0) {
    check(cudaMemcpyAsync(host.data(), from, n * sizeof(T), cudaMemcpyDeviceToHost, stream), who,
          "copy to the host");
  }
  return host;
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

AttentionPairs attention_sparse_cuda(const AttentionQuery& query, const DenseKv& kv,
                                     const SparsePattern& pattern, cudaStream_t stream) {
  const char* who = "attention_sparse_cuda";
  if (query.n_queries <= 0) return AttentionPairs{};
  check_heads(query, kv.n_kv_heads, who);
  check_head_dim(kv.head_dim, who);
  // Host copies of the positions and the lists: the pairs are counted there, and the lists'
  // marks span the positions up to the last query's.
  const int64_t n_columns = static_cast<int64_t>(query.n_heads) * std::max(0, pattern.n_columns);
  const int64_t n_offsets = static_cast<int64_t>(query.n_heads) * std::max(0, pattern.n_offsets);
  const std::vector<int32_t> q_positions =
      copy_down(query.q_positions, query.n_queries, who, stream);
  const std::vector<int32_t> columns = copy_down(pattern.columns, n_columns, who, stream);
  const std::vector<int32_t> offsets = copy_down(pattern.offsets, n_offsets, who, stream);
  std::vector<int32_t> key_positions(static_cast<size_t>(kv.n_kv_heads * kv.n_tokens));
  if (kv.n_tokens > 0) {
    const size_t row = static_cast<size_t>(kv.n_tokens) * sizeof(int32_t);
    check(cudaMemcpy2DAsync(key_positions.data(), row, kv.positions,
                            static_cast<size_t>(kv.capacity) * sizeof(int32_t), row,
                            static_cast<size_t>(kv.n_kv_heads), cudaMemcpyDeviceToHost, stream),
          who, "copy positions to the host");
  }
  check(cudaStreamSynchronize(stream), who, "cudaStreamSynchronize");
  SparsePattern on_host = pattern;
  on_host.columns = n_columns > 0 ? columns.data() : nullptr;
  on_host.offsets = n_offsets > 0 ? offsets.data() : nullptr;
  const AttentionPairs pairs =
      count_sparse_pairs(q_positions.data(), query.n_queries, query.n_heads, key_positions.data(),
                         kv.n_kv_heads, kv.n_tokens, kv.n_tokens, on_host);

  int32_t last = 0;
  for (int32_t qp : q_positions) last = std::max(last, qp);
  PatternKeys keys{pattern.sink, pattern.local, pattern.dense_from, nullptr, nullptr,
                   static_cast<int64_t>(last) + 1};
  const int64_t marks = static_cast<int64_t>(query.n_heads) * keys.span;
  const int n_lists = (n_columns > 0) + (n_offsets > 0);
  uint8_t* lists = nullptr;
  if (n_lists > 0) {
    cuda::keep_pool_memory(who);
    check(cudaMallocAsync(reinterpret_cast<void**>(&lists), n_lists * marks, stream), who,
          "cudaMallocAsync");
    check(cudaMemsetAsync(lists, 0, n_lists * marks, stream), who, "cudaMemsetAsync");
    uint8_t* next = lists;
    const auto mark = [&](const int32_t* list, int32_t n, int64_t n_entries) {
      const unsigned blocks = static_cast<unsigned>((n_entries + 255) / 256);
      mark_positions_kernel<<<blocks, 256, 0, stream>>>(list, n, n_entries, keys.span, next);
      check(cudaGetLastError(), who, "mark kernel launch");
      const uint8_t* marked = next;
      next += marks;
      return marked;
    };
    if (n_columns > 0) keys.column = mark(pattern.columns, pattern.n_columns, n_columns);
    if (n_offsets > 0) keys.offset = mark(pattern.offsets, pattern.n_offsets, n_offsets);
  }
  dispatch(query, kv.n_kv_heads, kv.head_dim, f32_rows(kv), AllSlots{}, kv.n_tokens, who, stream,
           keys);
  if (lists != nullptr) check(cudaFreeAsync(lists, stream), who, "cudaFreeAsync");
  return pairs;
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
