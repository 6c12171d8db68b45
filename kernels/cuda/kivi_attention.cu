#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kivi_attention.h"

// How a block reads the cache: its warps take 32-slot windows in turn (a window is one KIVI block,
// or 32 slots of the fp32 tail: blocks end on a multiple of 32, so windows never straddle both).
// In a KIVI block lane t owns token t for the scores (every lane reads the same code bytes of a
// key channel: one broadcast load) and channels lane, lane + 32, ... for the values (a token's
// value codes are consecutive bytes: coalesced). Tail windows are read as attention.cu reads
// dense keys. One online-softmax step per window, then the block merges its warps and split-K
// partials are merged as in attention.cu.

namespace kvbench {
namespace {

using cuda::merge_splits_kernel;
using cuda::warp_max;
using cuda::warp_sum;

constexpr int kWarps = 4;            // warps per block, each walking its own windows
constexpr int kMaxGroup = 8;         // query heads of one KV group handled by one block
constexpr int kWindow = 32;          // slots per window: KIVI's group, and the warp size
constexpr int kMinSplitWindows = 8;  // split-K never makes a split shorter than this
constexpr float kLog2e = 1.4426950408889634f;

void check(cudaError_t err, const char* what) { cuda::check(err, "attention_kivi_cuda", what); }

// The windows a KV head reads, as units u in [0, n_units). Without a selection unit u is window
// u. With one, unit (i, k) = i * per_page + k is the k-th window page i touches; a window is read
// once, by the first selected page touching it, with every selected slot in it.
struct Units {
  const int32_t* pages;  // [n_kv_heads, n_selected] or nullptr
  int32_t n_selected;
  int32_t page_tokens;
  int32_t per_page;  // windows a page can touch
  int64_t n_total;   // slots: blocks, then tail

  // The window of unit u (-1 for none) and, as a warp ballot, which of its slots are read.
  __device__ int64_t window(int kvh, int64_t u, int lane, uint32_t& sel) const {
    int64_t w = u;
    bool read = false;
    if (pages == nullptr) {
      read = w * kWindow + lane < n_total;
    } else {
      const int32_t* row = pages + static_cast<int64_t>(kvh) * n_selected;
      const int64_t i = u / per_page;
      const int64_t page = row[i];
      const int64_t lo = page * page_tokens, hi = min(n_total, lo + page_tokens);
      w = (lo >= 0 ? lo / kWindow : 0) + u % per_page;
      const bool mine = page >= 0 && w * kWindow < hi &&
                        !(i > 0 && row[i - 1] >= 0 &&
                          (static_cast<int64_t>(row[i - 1]) + 1) * page_tokens > w * kWindow);
      if (!mine) {  // uniform across the warp
        sel = 0;
        return -1;
      }
      // This lane's slot is read if its page is selected: pages before row[i] that touch this
      // window are not (else row[i - 1] would), later ones are found by a short scan.
      const int64_t s = w * kWindow + lane;
      if (s < n_total) {
        const int64_t ps = s / page_tokens;
        int64_t j = i;
        while (j < n_selected && row[j] < ps) ++j;
        read = j < n_selected && row[j] == ps;
      }
    }
    sel = __ballot_sync(0xffffffffu, read);
    return w;
  }
};

// One block: query i, up to kMaxGroup heads of KV head kvh, units [u0, u1). Each warp keeps an
// online softmax (max m, denominator l, unnormalised acc; lane holds channels lane, lane + 32,
// ...) per head over its windows; the block then merges its warps. One split writes normalised
// output; several write (acc, m, l) partials.
template <int D, int BITS>
__global__ void __launch_bounds__(kWarps * 32)
    kivi_split_kernel(AttentionQuery query, KiviKv kv, Units units, int64_t n_units, int group,
                      int head_chunks, int64_t split_len, int n_splits, float* partial) {
  constexpr int E = D / 32;
  constexpr int kCodeBytes = kWindow * D * BITS / 8;  // a block's key (or value) codes per head
  constexpr int kGroupBytes = kWindow * BITS / 8;     // one key channel's codes
  constexpr uint32_t kMask = (1u << BITS) - 1;
  const int i = blockIdx.x;
  const int kvh = blockIdx.y / head_chunks;
  const int g0 = (blockIdx.y % head_chunks) * kMaxGroup;
  const int ng = min(kMaxGroup, group - g0);
  const int split = blockIdx.z;
  const int64_t u0 = split * split_len;
  const int64_t u1 = min(n_units, u0 + split_len);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int32_t qpos = query.q_positions[i];
  const int n_kv_heads = kv.tail.n_kv_heads;
  const DenseKv& tail = kv.tail;

  __shared__ float sm_q[kMaxGroup][D];  // queries pre-scaled into the log2 domain; 0 past ng
  const float qscale = query.scale * kLog2e;
  for (int idx = threadIdx.x; idx < kMaxGroup * D; idx += blockDim.x) {
    const int g = idx / D;
    const int h = kvh * group + g0 + g;
    sm_q[g][idx % D] =
        g < ng ? query.q[(static_cast<int64_t>(i) * query.n_heads + h) * D + idx % D] * qscale
               : 0.0f;
  }
  __syncthreads();

  float acc[kMaxGroup][E], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }

  const int64_t n_block_slots = kv.n_blocks * kWindow;
  for (int64_t u = u0 + warp; u < u1; u += kWarps) {
    uint32_t sel = 0;
    const int64_t w = units.window(kvh, u, lane, sel);
    if (w < 0 || sel == 0) continue;  // uniform across the warp
    const bool in_blocks = w * kWindow < n_block_slots;
    const int64_t blk = w * n_kv_heads + kvh;  // in_blocks: block w's index
    const int64_t tail_row = kvh * tail.capacity + (w * kWindow - n_block_slots);  // else
    const bool selected = (sel >> lane) & 1u;
    int32_t pos = 0;
    if (selected)
      pos = in_blocks ? kv.positions[blk * kWindow + lane] : tail.positions[tail_row + lane];
    const uint32_t vis = __ballot_sync(0xffffffffu, selected && pos <= qpos);
    if (vis == 0) continue;  // no slot of the window visible: its codes are not read

    // Scores: lane t holds token t's logit for each head (-inf where not visible).
    float s[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
    if (in_blocks) {
      const uint8_t* codes = kv.k_codes + blk * kCodeBytes + lane * BITS / 8;
      const float* scale = kv.k_scale + blk * D;
      const float* lo = kv.k_min + blk * D;
      const int shift = (lane * BITS) % 8;
#pragma unroll 4
      for (int d = 0; d < D; ++d) {
        const float c = static_cast<float>((codes[d * kGroupBytes] >> shift) & kMask);
        const float k = fmaf(c, scale[d], lo[d]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) s[g] = fmaf(sm_q[g][d], k, s[g]);
      }
    } else {
      for (uint32_t rest = vis; rest != 0; rest &= rest - 1) {
        const int t = __ffs(rest) - 1;
        const float* k = tail.k + (tail_row + t) * D;
        float kr[E];
#pragma unroll
        for (int e = 0; e < E; ++e) kr[e] = k[e * 32 + lane];
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < ng) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) dot = fmaf(sm_q[g][e * 32 + lane], kr[e], dot);
            dot = warp_sum(dot);
            if (lane == t) s[g] = dot;
          }
        }
      }
    }

    // One online-softmax step per head over the window.
    const bool visible = (vis >> lane) & 1u;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < ng) {
        const float sg = visible ? s[g] : -INFINITY;
        const float m_new = fmaxf(m[g], warp_max(sg));  // finite: some slot is visible
        const float alpha = exp2f(m[g] - m_new);        // 0 while m was -inf
        s[g] = exp2f(sg - m_new);                       // now the probability, 0 where hidden
        l[g] = l[g] * alpha + warp_sum(s[g]);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] *= alpha;
        m[g] = m_new;
      }
    }

    // Values: lane holds channels lane, lane + 32, ... of each visible token in turn.
    for (uint32_t rest = vis; rest != 0; rest &= rest - 1) {
      const int t = __ffs(rest) - 1;
      float vr[E];
      if (in_blocks) {
        const int64_t token = blk * kWindow + t;
        const uint8_t* codes = kv.v_codes + token * (D * BITS / 8);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int d = e * 32 + lane;
          const float c = static_cast<float>((codes[d * BITS / 8] >> ((d * BITS) % 8)) & kMask);
          vr[e] = fmaf(c, kv.v_scale[token * E + e], kv.v_min[token * E + e]);
        }
      } else {
        const float* v = tail.v + (tail_row + t) * D;
#pragma unroll
        for (int e = 0; e < E; ++e) vr[e] = v[e * 32 + lane];
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < ng) {
          const float p = __shfl_sync(0xffffffffu, s[g], t);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] = fmaf(p, vr[e], acc[g][e]);
        }
      }
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
        const float c = exp2f(sm_m[w][g] - mx);  // 0 for a warp that saw no slot
        o += c * sm_acc[w][g][d];
        sum += c * sm_l[w][g];
      }
    }
    const int h = kvh * group + g0 + g;
    const int64_t row = static_cast<int64_t>(i) * query.n_heads + h;
    if (partial == nullptr) {
      query.out[row * D + d] = sum > 0.0f ? o / sum : 0.0f;  // no visible slot: zeros
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

template <int D, int BITS>
void launch(const AttentionQuery& query, const KiviKv& kv, const PageSelection* pages,
            cudaStream_t stream) {
  const int n_kv_heads = kv.tail.n_kv_heads;
  const int group = query.n_heads / n_kv_heads;
  const int head_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t n_total = kv.n_blocks * kWindow + kv.tail.n_tokens;
  Units units{nullptr, 0, 1, 1, n_total};
  int64_t n_units = (n_total + kWindow - 1) / kWindow;
  if (pages != nullptr) {
    units.pages = pages->pages;
    units.n_selected = pages->n_selected;
    units.page_tokens = pages->page_tokens;
    units.per_page = (pages->page_tokens + kWindow - 2) / kWindow + 1;
    n_units = static_cast<int64_t>(pages->n_selected) * units.per_page;
  }
  int device = 0, sms = 1;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  // Split-K only when (query, head chunk) blocks alone would leave SMs idle.
  const int64_t base = static_cast<int64_t>(query.n_queries) * n_kv_heads * head_chunks;
  const int64_t want = 2LL * sms;
  int64_t splits = 1;
  if (base < want) {
    const int64_t most = std::max<int64_t>(1, n_units / kMinSplitWindows);
    splits = std::min<int64_t>({(want + base - 1) / base, most, 65535});
  }
  const int64_t split_len = std::max<int64_t>(1, (n_units + splits - 1) / splits);
  splits = std::max<int64_t>(1, (n_units + split_len - 1) / split_len);

  const dim3 grid(query.n_queries, n_kv_heads * head_chunks, static_cast<unsigned>(splits));
  if (splits == 1) {
    kivi_split_kernel<D, BITS><<<grid, kWarps * 32, 0, stream>>>(
        query, kv, units, n_units, group, head_chunks, split_len, 1, nullptr);
    check(cudaGetLastError(), "split kernel launch");
    return;
  }
  float* partial = nullptr;
  const size_t bytes =
      static_cast<size_t>(query.n_queries) * query.n_heads * splits * (D + 2) * sizeof(float);
  cuda::keep_pool_memory("attention_kivi_cuda");
  check(cudaMallocAsync(reinterpret_cast<void**>(&partial), bytes, stream), "cudaMallocAsync");
  kivi_split_kernel<D, BITS><<<grid, kWarps * 32, 0, stream>>>(
      query, kv, units, n_units, group, head_chunks, split_len, static_cast<int>(splits), partial);
  check(cudaGetLastError(), "split kernel launch");
  merge_splits_kernel<D><<<static_cast<unsigned>(query.n_queries * query.n_heads), D, 0, stream>>>(
      query, static_cast<int>(splits), partial);
  check(cudaGetLastError(), "merge kernel launch");
  check(cudaFreeAsync(partial, stream), "cudaFreeAsync");
}

using Launch = void (*)(const AttentionQuery&, const KiviKv&, const PageSelection*, cudaStream_t);

// [head_dim == 128][bits == 4]
constexpr Launch kLaunch[2][2] = {{launch<64, 2>, launch<64, 4>}, {launch<128, 2>, launch<128, 4>}};

}  // namespace

void attention_kivi_cuda(const AttentionQuery& query, const KiviKv& kv, const PageSelection* pages,
                         cudaStream_t stream) {
  if (query.n_queries <= 0) return;
  const int n_kv_heads = kv.tail.n_kv_heads;
  const int dim = kv.tail.head_dim;
  if (n_kv_heads <= 0 || query.n_heads % n_kv_heads != 0) {
    throw std::invalid_argument("attention_kivi_cuda: n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(n_kv_heads) + ")");
  }
  if ((dim != 64 && dim != 128) || kv.group != kWindow || (kv.bits != 2 && kv.bits != 4)) {
    throw std::invalid_argument(
        "attention_kivi_cuda: head_dim must be 64 or 128, group 32 and bits 2 or 4, got "
        "head_dim " +
        std::to_string(dim) + ", group " + std::to_string(kv.group) + ", bits " +
        std::to_string(kv.bits));
  }
  if (pages != nullptr && (pages->page_tokens <= 0 || pages->n_selected < 0)) {
    throw std::invalid_argument("attention_kivi_cuda: page_tokens must be > 0 and n_selected >= 0");
  }
  kLaunch[dim == 128][kv.bits == 4](query, kv, pages, stream);
}

}  // namespace kvbench
