#include "methods/ivf_index.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <numeric>

namespace kvbench {

namespace {

// splitmix64: a fixed, portable sequence (std distributions differ across libraries).
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

float dot(const float* a, const float* b, int32_t dim) {
  float s = 0.f;
  for (int32_t i = 0; i < dim; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

int32_t IvfIndex::nearest(const float* key) const {
  // argmin |c|^2 - 2 k.c (|k|^2 is the same for every centroid); ties to the lower index.
  int32_t best = 0;
  float best_d = std::numeric_limits<float>::infinity();
  for (int32_t c = 0; c < n_clusters(); ++c) {
    const float* x = centroid(c);
    const float d = dot(x, x, dim_) - 2.f * dot(key, x, dim_);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

void IvfIndex::build(const float* keys, int32_t dim, int64_t first_slot, int64_t n,
                     int32_t n_clusters, int32_t iterations, uint64_t seed) {
  assert(n >= 0 && n_clusters > 0);
  dim_ = dim;
  size_ = 0;
  const int64_t k = std::min<int64_t>(n_clusters, n);
  lists_.assign(static_cast<size_t>(k), {});
  centroids_.assign(static_cast<size_t>(k * dim), 0.f);
  if (k == 0) return;
  // Start from k distinct rows: the first k of a seeded Fisher-Yates shuffle.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  uint64_t state = seed;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + static_cast<int64_t>(next_random(state) % static_cast<uint64_t>(n - i));
    std::swap(order[i], order[j]);
    std::copy_n(keys + order[i] * dim, dim, centroids_.begin() + i * dim);
  }
  std::vector<int32_t> assign(static_cast<size_t>(n));
  std::vector<double> sum(static_cast<size_t>(k * dim));
  std::vector<int64_t> count(static_cast<size_t>(k));
  for (int32_t it = 0; it < iterations; ++it) {
    for (int64_t r = 0; r < n; ++r) assign[r] = nearest(keys + r * dim);
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), 0);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t c = assign[r];
      ++count[c];
      for (int32_t d = 0; d < dim; ++d) sum[c * dim + d] += keys[r * dim + d];
    }
    for (int64_t c = 0; c < k; ++c) {
      if (count[c] == 0) continue;
      for (int32_t d = 0; d < dim; ++d) {
        centroids_[c * dim + d] = static_cast<float>(sum[c * dim + d] / count[c]);
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) insert(keys + r * dim, first_slot + r);
}

void IvfIndex::insert(const float* key, int64_t slot) {
  assert(n_clusters() > 0);
  lists_[nearest(key)].push_back(static_cast<int32_t>(slot));
  ++size_;
}

int64_t IvfIndex::bytes() const {
  int64_t bytes = static_cast<int64_t>(centroids_.capacity() * sizeof(float));
  for (const auto& list : lists_) bytes += static_cast<int64_t>(list.capacity() * sizeof(int32_t));
  return bytes;
}

}  // namespace kvbench
