#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/scores.h"

namespace kvbench {
namespace {

using cuda::check;
using cuda::warp_sum;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxGridY = 65535;

// ---- Attention scores --------------------------------------------------------------------------

constexpr int kStatWarps = 4;       // pass 1: warps per block, each walking its own slots
constexpr int kMaxGroup = 8;        // pass 1: query heads of one KV group per block
constexpr int kMinSplitKeys = 256;  // pass 1 never splits the slots into pieces shorter than this
constexpr int kKeyThreads = 128;    // pass 2: stored slots per block, a thread each
constexpr int kQueryChunk = 32;     // pass 2: query rows staged in shared memory at a time

// Pass 1. Block (query i, chunk of up to kMaxGroup query heads of one KV head, slot split z):
// each warp keeps an online max m and denominator l (log2 domain) per head over the visible
// slots it walks (lanes over channels, as attention_dense_cuda); the block merges its warps and
// writes (m, l) to stats[row * n_splits + split], row = i * n_heads + h. No visible slot:
// (-inf, 0).
template <int D>
__global__ void __launch_bounds__(kStatWarps * 32)
    row_stats_kernel(AttentionQuery query, DenseKv kv, int group, int head_chunks,
                     int64_t split_len, int n_splits, float2* stats) {
  constexpr int E = D / 32;
  const int i = blockIdx.x;
  const int kvh = blockIdx.y / head_chunks;
  const int g0 = (blockIdx.y % head_chunks) * kMaxGroup;
  const int ng = min(kMaxGroup, group - g0);
  const int split = blockIdx.z;
  const int64_t t0 = split * split_len;
  const int64_t t1 = min(kv.n_tokens, t0 + split_len);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int32_t qpos = query.q_positions[i];

  float q[kMaxGroup][E], m[kMaxGroup], l[kMaxGroup];
  const float qscale = query.scale * kLog2e;  // logits in the log2 domain: exp2f below
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      q[g][e] = 0.0f;
      if (g < ng) {
        const int h = kvh * group + g0 + g;
        q[g][e] =
            query.q[(static_cast<int64_t>(i) * query.n_heads + h) * D + e * 32 + lane] * qscale;
      }
    }
  }

  const float* k_head = kv.k + static_cast<int64_t>(kvh) * kv.capacity * D;
  const int32_t* pos_head = kv.positions + static_cast<int64_t>(kvh) * kv.capacity;
  for (int64_t t = t0 + warp; t < t1; t += kStatWarps) {
    if (pos_head[t] > qpos) continue;  // uniform across the warp
    float kr[E];
#pragma unroll
    for (int e = 0; e < E; ++e) kr[e] = k_head[t * D + e * 32 + lane];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < ng) {
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s = fmaf(q[g][e], kr[e], s);
        s = warp_sum(s);
        const float m_new = fmaxf(m[g], s);
        l[g] = l[g] * exp2f(m[g] - m_new) + exp2f(s - m_new);  // exp2f(-inf) = 0 at first
        m[g] = m_new;
      }
    }
  }

  __shared__ float sm_m[kStatWarps][kMaxGroup];
  __shared__ float sm_l[kStatWarps][kMaxGroup];
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
  }
  __syncthreads();
  if (threadIdx.x < ng) {
    const int g = threadIdx.x;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kStatWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float sum = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kStatWarps; ++w) sum += exp2f(sm_m[w][g] - mx) * sm_l[w][g];
    }
    const int64_t row = static_cast<int64_t>(i) * query.n_heads + kvh * group + g0 + g;
    stats[row * n_splits + split] = make_float2(mx, sum);
  }
}

// Pass 2. Block (slots x * kKeyThreads .. + kKeyThreads, query head y); a thread per slot keeps
// its key in registers and walks every query row, kQueryChunk rows at a time staged in shared
// memory (pre-scaled queries, positions, and the rows' merged (max, 1 / denominator)), summing
// the probabilities it receives; then adds the sum to its score. Deterministic: one thread owns
// a score, rows in order.
template <int D>
__global__ void __launch_bounds__(kKeyThreads)
    accumulate_kernel(AttentionQuery query, DenseKv kv, int group, int n_splits,
                      const float2* stats, bool keys_aligned, float* scores) {
  static_assert(D % 4 == 0, "float4 rows");
  const int h = blockIdx.y;
  const int64_t kvh = h / group;
  const int64_t n = kv.n_tokens;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kKeyThreads + threadIdx.x;
  const bool valid = t < n;

  float key[D];
  int32_t pos = 0;
  if (valid) {
    const float* src = kv.k + (kvh * kv.capacity + t) * D;
    if (keys_aligned) {
#pragma unroll
      for (int d = 0; d < D; d += 4) {
        const float4 x = *reinterpret_cast<const float4*>(src + d);
        key[d] = x.x;
        key[d + 1] = x.y;
        key[d + 2] = x.z;
        key[d + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int d = 0; d < D; ++d) key[d] = src[d];
    }
    pos = kv.positions[kvh * kv.capacity + t];
  } else {
#pragma unroll
    for (int d = 0; d < D; ++d) key[d] = 0.0f;
  }

  __shared__ __align__(16) float sq[kQueryChunk][D];
  __shared__ float sm_m[kQueryChunk];
  __shared__ float sm_inv[kQueryChunk];
  __shared__ int32_t sm_pos[kQueryChunk];
  const float qscale = query.scale * kLog2e;  // as pass 1, so the logits round the same way
  float acc = 0.0f;
  for (int i0 = 0; i0 < query.n_queries; i0 += kQueryChunk) {
    const int nq = min(kQueryChunk, query.n_queries - i0);
    __syncthreads();  // every thread is done with the previous chunk
    for (int idx = threadIdx.x; idx < nq * D; idx += kKeyThreads) {
      const int r = idx / D;
      const int d = idx % D;
      sq[r][d] = query.q[(static_cast<int64_t>(i0 + r) * query.n_heads + h) * D + d] * qscale;
    }
    if (threadIdx.x < nq) {
      const int r = threadIdx.x;
      const float2* st = stats + (static_cast<int64_t>(i0 + r) * query.n_heads + h) * n_splits;
      float mx = -INFINITY;
      for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, st[s].x);
      float sum = 0.0f;
      if (mx != -INFINITY) {
        for (int s = 0; s < n_splits; ++s) sum += exp2f(st[s].x - mx) * st[s].y;
      }
      // A row that sees no slot: +inf max and 0 weight, so it adds exactly 0 (it is also masked).
      sm_m[r] = sum > 0.0f ? mx : INFINITY;
      sm_inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      sm_pos[r] = query.q_positions[i0 + r];
    }
    __syncthreads();
    if (valid) {
      for (int r = 0; r < nq; ++r) {
        if (pos > sm_pos[r]) continue;  // causal by position
        const float4* qv = reinterpret_cast<const float4*>(sq[r]);
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
        for (int d4 = 0; d4 < D / 4; ++d4) {
          const float4 x = qv[d4];  // the same address for the whole warp: a broadcast
          s0 = fmaf(x.x, key[4 * d4], s0);
          s1 = fmaf(x.y, key[4 * d4 + 1], s1);
          s2 = fmaf(x.z, key[4 * d4 + 2], s2);
          s3 = fmaf(x.w, key[4 * d4 + 3], s3);
        }
        const float s = (s0 + s1) + (s2 + s3);
        acc += exp2f(s - sm_m[r]) * sm_inv[r];
      }
    }
  }
  if (valid) scores[h * n + t] += acc;
}

template <int D>
void scores_launch(const AttentionQuery& query, const DenseKv& kv, float* scores,
                   cudaStream_t stream) {
  const char* who = "attention_scores_cuda";
  const int group = query.n_heads / kv.n_kv_heads;
  const int head_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t n = kv.n_tokens;
  int device = 0, sms = 1;
  check(cudaGetDevice(&device), who, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), who, "SM count");
  // Pass 1 splits the slots only when (query, head chunk) blocks alone would leave SMs idle.
  const int64_t base = static_cast<int64_t>(query.n_queries) * kv.n_kv_heads * head_chunks;
  const int64_t want = 2LL * sms;
  int64_t splits = 1;
  if (base < want) {
    const int64_t most = std::max<int64_t>(1, n / kMinSplitKeys);
    splits = std::min<int64_t>({(want + base - 1) / base, most, 65535});
  }
  const int64_t split_len = std::max<int64_t>(1, (n + splits - 1) / splits);
  splits = std::max<int64_t>(1, (n + split_len - 1) / split_len);

  float2* stats = nullptr;
  const size_t bytes =
      static_cast<size_t>(query.n_queries) * query.n_heads * splits * sizeof(float2);
  cuda::keep_pool_memory(who);
  check(cudaMallocAsync(reinterpret_cast<void**>(&stats), bytes, stream), who, "cudaMallocAsync");
  const dim3 grid1(static_cast<unsigned>(query.n_queries),
                   static_cast<unsigned>(kv.n_kv_heads * head_chunks),
                   static_cast<unsigned>(splits));
  row_stats_kernel<D><<<grid1, kStatWarps * 32, 0, stream>>>(query, kv, group, head_chunks,
                                                              split_len, static_cast<int>(splits),
                                                              stats);
  check(cudaGetLastError(), who, "row stats kernel launch");
  const bool keys_aligned = reinterpret_cast<uintptr_t>(kv.k) % 16 == 0;
  const dim3 grid2(static_cast<unsigned>((n + kKeyThreads - 1) / kKeyThreads),
                   static_cast<unsigned>(query.n_heads));
  accumulate_kernel<D><<<grid2, kKeyThreads, 0, stream>>>(
      query, kv, group, static_cast<int>(splits), stats, keys_aligned, scores);
  check(cudaGetLastError(), who, "accumulate kernel launch");
  check(cudaFreeAsync(stats, stream), who, "cudaFreeAsync");
}

// ---- Key norms and KeyDiff's anchor cosine ----------------------------------------------------

constexpr int kKeyWarps = 4;           // keys per block, a warp each
constexpr int kAnchorChunk = 512;      // stored slots summed by one block into an anchor partial
constexpr int kAnchorThreads = 128;    // threads over channels in the anchor kernels

// Block (keys kKeyWarps x .. + kKeyWarps, KV head y); a warp per key, lanes over channels.
__global__ void __launch_bounds__(kKeyWarps * 32) key_norms_kernel(DenseKv kv, float* norms) {
  const int64_t h = blockIdx.y;
  const int64_t n = kv.n_tokens;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kKeyWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= n) return;  // uniform across the warp
  const int dim = kv.head_dim;
  const float* k = kv.k + (h * kv.capacity + t) * dim;
  float ss = 0.0f;
  for (int d = lane; d < dim; d += 32) ss = fmaf(k[d], k[d], ss);
  ss = warp_sum(ss);
  if (lane == 0) norms[h * n + t] = sqrtf(ss);
}

// Block (slots [x * kAnchorChunk, ..), KV head y); a thread per channel (strided): the chunk's
// sum of k / ||k|| in double, zero keys skipped, into partial[(h * n_chunks + x) * dim + d].
__global__ void __launch_bounds__(kAnchorThreads)
    anchor_partial_kernel(DenseKv kv, const float* norms, int64_t n_chunks, double* partial) {
  const int64_t h = blockIdx.y;
  const int64_t c = blockIdx.x;
  const int64_t n = kv.n_tokens;
  const int dim = kv.head_dim;
  const int64_t t0 = c * kAnchorChunk;
  const int64_t t1 = min(n, t0 + kAnchorChunk);
  for (int d = threadIdx.x; d < dim; d += kAnchorThreads) {
    double sum = 0.0;
    for (int64_t t = t0; t < t1; ++t) {
      const float norm = norms[h * n + t];
      if (norm == 0.0f) continue;  // a zero key has no direction: it adds nothing
      sum += static_cast<double>(kv.k[(h * kv.capacity + t) * dim + d]) / static_cast<double>(norm);
    }
    partial[(h * n_chunks + c) * dim + d] = sum;
  }
}

// Block per KV head; threads over channels: the anchor (chunks summed in order, divided by
// n_tokens, rounded to float as the CPU) and its norm.
__global__ void __launch_bounds__(kAnchorThreads)
    anchor_final_kernel(DenseKv kv, const double* partial, int64_t n_chunks, float* anchors,
                        float* anchor_norms) {
  const int64_t h = blockIdx.x;
  const int dim = kv.head_dim;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < dim; d += kAnchorThreads) {
    double sum = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) sum += partial[(h * n_chunks + c) * dim + d];
    const float a = static_cast<float>(sum / static_cast<double>(kv.n_tokens));
    anchors[h * dim + d] = a;
    ss = fmaf(a, a, ss);
  }
  __shared__ float sm_ss[kAnchorThreads / 32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) sm_ss[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kAnchorThreads / 32; ++w) total += sm_ss[w];
    anchor_norms[h] = sqrtf(total);
  }
}

// As key_norms_kernel's shape: cosine[e] holds the key's norm on entry, its cosine on exit.
__global__ void __launch_bounds__(kKeyWarps * 32)
    anchor_cosine_kernel(DenseKv kv, const float* anchors, const float* anchor_norms,
                         float* cosine) {
  const int64_t h = blockIdx.y;
  const int64_t n = kv.n_tokens;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kKeyWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= n) return;  // uniform across the warp
  const int dim = kv.head_dim;
  const float* k = kv.k + (h * kv.capacity + t) * dim;
  const float* a = anchors + h * dim;
  float dot = 0.0f;
  for (int d = lane; d < dim; d += 32) dot = fmaf(k[d], a[d], dot);
  dot = warp_sum(dot);
  if (lane == 0) {
    const float denom = cosine[h * n + t] * anchor_norms[h];
    cosine[h * n + t] = denom > 0.0f ? dot / denom : 0.0f;
  }
}

void check_kv_heads(const DenseKv& kv, const char* who) {
  if (kv.n_kv_heads > kMaxGridY) {
    throw std::invalid_argument(std::string(who) + ": more than 65535 KV heads");
  }
}

dim3 key_grid(const DenseKv& kv) {
  return dim3(static_cast<unsigned>((kv.n_tokens + kKeyWarps - 1) / kKeyWarps),
              static_cast<unsigned>(kv.n_kv_heads));
}

// ---- Pooling ------------------------------------------------------------------------------------

constexpr int kPoolThreads = 256;

// Grid-stride, a thread per output element; the window read left to right as pool1d_cpu.
__global__ void __launch_bounds__(kPoolThreads)
    pool1d_kernel(const float* in, float* out, int64_t rows, int64_t n, int64_t half,
                  float inv_kernel, bool max_kind) {
  const int64_t total = rows * n;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kPoolThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kPoolThreads) {
    const int64_t r = e / n;
    const int64_t j = e % n;
    const float* x = in + r * n;
    const int64_t lo = max(static_cast<int64_t>(0), j - half);
    const int64_t hi = min(n, j + half + 1);
    if (max_kind) {
      float best = x[lo];  // std::max_element: the first largest by operator<
      for (int64_t i = lo + 1; i < hi; ++i) {
        if (best < x[i]) best = x[i];
      }
      out[e] = best;
    } else {
      float sum = 0.0f;  // std::accumulate from 0.0f
      for (int64_t i = lo; i < hi; ++i) sum += x[i];
      out[e] = sum * inv_kernel;
    }
  }
}

// ---- Top-k --------------------------------------------------------------------------------------

constexpr int kTopKThreads = 512;
constexpr int kTopKWarps = kTopKThreads / 32;

// top_k_indices_cpu's order as an unsigned key, larger first: numbers by value (-0 as +0),
// every NaN 0, below -inf (0x007fffff). Equal keys are ties (the lower index first).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) return 0u;
  uint32_t bits = __float_as_uint(v);
  if ((bits << 1) == 0u) bits = 0u;  // -0 == +0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Exclusive prefix sum of x over the block's threads in thread order; `total` gets the block's
// sum. Every thread must call it. sm: kTopKWarps words of shared memory.
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t x, uint32_t& total,
                                                         uint32_t* sm) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  uint32_t inc = x;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += y;
  }
  if (lane == 31) sm[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    uint32_t w = lane < kTopKWarps ? sm[lane] : 0u;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += y;
    }
    if (lane < kTopKWarps) sm[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const uint32_t before = warp == 0 ? 0u : sm[warp - 1];
  total = sm[kTopKWarps - 1];
  __syncthreads();  // read before the next call overwrites
  return before + inc - x;
}

// Block per row. Radix select (4 passes of 8 bits, shared-memory histograms) finds T, the key
// of the k-th best element, and r, how many elements with key T are taken (the r lowest
// indices). A last pass walks the row in index order, a block-wide scan of (above T, equal
// to T) counts placing each taken index: ascending output, no sort.
__global__ void __launch_bounds__(kTopKThreads)
    top_k_kernel(const float* values, int64_t n, int64_t k, int32_t* out) {
  const float* v = values + static_cast<int64_t>(blockIdx.x) * n;
  int32_t* dst = out + static_cast<int64_t>(blockIdx.x) * k;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t sm_scan[kTopKWarps];
  __shared__ uint32_t sm_digit, sm_above;

  // Candidates: keys matching `prefix` under `mask`; the wanted element is the remaining-th
  // best of them (1-based), those above the candidates being k - remaining.
  uint32_t prefix = 0u, mask = 0u;
  uint32_t remaining = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kTopKThreads) hist[b] = 0u;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += kTopKThreads) {
      const uint32_t key = order_key(v[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Highest digit whose bin, with the bins above it, reaches `remaining` (the candidates
      // number at least `remaining`, so digit 0 at the latest).
      uint32_t above = 0u;
      int b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= remaining) break;
        above += hist[b];
      }
      sm_digit = static_cast<uint32_t>(b);
      sm_above = above;
    }
    __syncthreads();
    prefix |= sm_digit << shift;
    mask |= 0xFFu << shift;
    remaining -= sm_above;
    // The next write of hist, sm_digit or sm_above comes after two more barriers.
  }
  const uint32_t threshold = prefix;
  const uint32_t take_equal = remaining;  // 1 <= take_equal <= count of keys == threshold

  uint32_t above_before = 0u, equal_before = 0u;  // over the chunks already walked
  for (int64_t start = 0; start < n; start += kTopKThreads) {
    const int64_t j = start + threadIdx.x;
    bool above = false, equal = false;
    if (j < n) {
      const uint32_t key = order_key(v[j]);
      above = key > threshold;
      equal = key == threshold;
    }
    // Both counts of a chunk fit 16 bits (at most kTopKThreads).
    uint32_t total = 0u;
    const uint32_t ex = block_exclusive_scan((above ? 1u << 16 : 0u) | (equal ? 1u : 0u), total,
                                             sm_scan);
    const uint32_t a = above_before + (ex >> 16);
    const uint32_t e = equal_before + (ex & 0xFFFFu);
    if (above || (equal && e < take_equal)) dst[a + min(e, take_equal)] = static_cast<int32_t>(j);
    above_before += total >> 16;
    equal_before += total & 0xFFFFu;
    if (above_before + min(equal_before, take_equal) >= static_cast<uint32_t>(k)) break;  // uniform
  }
}

}  // namespace

void attention_scores_cuda(const AttentionQuery& query, const DenseKv& kv, float* scores,
                           cudaStream_t stream) {
  const char* who = "attention_scores_cuda";
  if (kv.n_kv_heads <= 0 || query.n_heads % kv.n_kv_heads != 0) {
    throw std::invalid_argument(std::string(who) + ": n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(kv.n_kv_heads) + ")");
  }
  if (query.n_heads > kMaxGridY) {
    throw std::invalid_argument(std::string(who) + ": more than 65535 query heads");
  }
  if (kv.head_dim != 64 && kv.head_dim != 128) {
    throw std::invalid_argument(std::string(who) + ": head_dim must be 64 or 128, got " +
                                std::to_string(kv.head_dim));
  }
  if (query.n_queries <= 0 || kv.n_tokens <= 0) return;
  if (kv.head_dim == 64) {
    scores_launch<64>(query, kv, scores, stream);
  } else {
    scores_launch<128>(query, kv, scores, stream);
  }
}

void key_norms_cuda(const DenseKv& kv, float* norms, cudaStream_t stream) {
  check_kv_heads(kv, "key_norms_cuda");
  if (kv.n_tokens <= 0 || kv.n_kv_heads <= 0) return;
  key_norms_kernel<<<key_grid(kv), kKeyWarps * 32, 0, stream>>>(kv, norms);
  check(cudaGetLastError(), "key_norms_cuda", "kernel launch");
}

void key_anchor_cosine_cuda(const DenseKv& kv, float* cosine, cudaStream_t stream) {
  const char* who = "key_anchor_cosine_cuda";
  check_kv_heads(kv, who);
  if (kv.n_tokens <= 0 || kv.n_kv_heads <= 0) return;
  const int64_t heads = kv.n_kv_heads, dim = kv.head_dim;
  const int64_t n_chunks = (kv.n_tokens + kAnchorChunk - 1) / kAnchorChunk;
  // One temporary: partial sums (double), then anchors and their norms (float).
  const size_t partial_bytes = static_cast<size_t>(heads * n_chunks * dim) * sizeof(double);
  const size_t bytes = partial_bytes + static_cast<size_t>(heads * dim + heads) * sizeof(float);
  void* scratch = nullptr;
  cuda::keep_pool_memory(who);
  check(cudaMallocAsync(&scratch, bytes, stream), who, "cudaMallocAsync");
  double* partial = static_cast<double*>(scratch);
  float* anchors = reinterpret_cast<float*>(static_cast<char*>(scratch) + partial_bytes);
  float* anchor_norms = anchors + heads * dim;

  // Norms first (into `cosine`), then each head's anchor, then the cosines in place.
  key_norms_kernel<<<key_grid(kv), kKeyWarps * 32, 0, stream>>>(kv, cosine);
  check(cudaGetLastError(), who, "norms kernel launch");
  anchor_partial_kernel<<<dim3(static_cast<unsigned>(n_chunks), static_cast<unsigned>(heads)),
                          kAnchorThreads, 0, stream>>>(kv, cosine, n_chunks, partial);
  check(cudaGetLastError(), who, "anchor partial kernel launch");
  anchor_final_kernel<<<static_cast<unsigned>(heads), kAnchorThreads, 0, stream>>>(
      kv, partial, n_chunks, anchors, anchor_norms);
  check(cudaGetLastError(), who, "anchor kernel launch");
  anchor_cosine_kernel<<<key_grid(kv), kKeyWarps * 32, 0, stream>>>(kv, anchors, anchor_norms,
                                                                    cosine);
  check(cudaGetLastError(), who, "cosine kernel launch");
  check(cudaFreeAsync(scratch, stream), who, "cudaFreeAsync");
}

void pool1d_cuda(const float* in, float* out, int64_t rows, int64_t n, int32_t kernel,
                 PoolKind kind, cudaStream_t stream) {
  if (kernel <= 0 || kernel % 2 == 0 || in == out) {
    throw std::invalid_argument("pool1d_cuda: kernel must be odd and positive (got " +
                                std::to_string(kernel) + "), in and out distinct");
  }
  if (rows <= 0 || n <= 0) return;
  const int64_t total = rows * n;
  const int64_t blocks = std::min<int64_t>((total + kPoolThreads - 1) / kPoolThreads, 1 << 20);
  const float inv_kernel = 1.0f / static_cast<float>(kernel);  // as pool1d_cpu
  pool1d_kernel<<<static_cast<unsigned>(blocks), kPoolThreads, 0, stream>>>(
      in, out, rows, n, kernel / 2, inv_kernel, kind == PoolKind::Max);
  check(cudaGetLastError(), "pool1d_cuda", "kernel launch");
}

void top_k_indices_cuda(const float* values, int64_t rows, int64_t n, int64_t k, int32_t* out,
                        cudaStream_t stream) {
  constexpr int64_t kMax = 2147483647;
  if (k < 0 || k > n || n > kMax || rows < 0 || rows > kMax) {
    throw std::invalid_argument("top_k_indices_cuda: needs 0 <= k (" + std::to_string(k) +
                                ") <= n (" + std::to_string(n) + ") < 2^31 and rows < 2^31");
  }
  if (k == 0 || rows == 0) return;
  top_k_kernel<<<static_cast<unsigned>(rows), kTopKThreads, 0, stream>>>(values, n, k, out);
  check(cudaGetLastError(), "top_k_indices_cuda", "kernel launch");
}

}  // namespace kvbench
