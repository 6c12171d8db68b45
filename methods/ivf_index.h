// A small IVF (inverted file) index over one KV head's keys, for retrieval_attention: k-means
// centroids of the keys, and per centroid the list of slots whose keys are nearest to it
// (L2). A search scans the centroids, then the keys of the lists it probes.
#pragma once

#include <cstdint>
#include <vector>

namespace kvbench {

class IvfIndex {
 public:
  // Clusters rows [0, n) of keys ([n, dim]; row r is slot first_slot + r) into
  // min(n_clusters, n) clusters: Lloyd's k-means with L2, `iterations` rounds, started from
  // rows picked by a shuffle seeded with `seed` (the same input gives the same index). A
  // cluster left empty in a round keeps its centroid.
  void build(const float* keys, int32_t dim, int64_t first_slot, int64_t n, int32_t n_clusters,
             int32_t iterations, uint64_t seed);

  // Adds `slot` (its key: dim floats) to the list of its nearest centroid; centroids stay.
  void insert(const float* key, int64_t slot);

  int32_t n_clusters() const { return static_cast<int32_t>(lists_.size()); }
  int32_t dim() const { return dim_; }
  const float* centroid(int32_t c) const {
    return centroids_.data() + static_cast<int64_t>(c) * dim_;
  }
  const std::vector<int32_t>& list(int32_t c) const { return lists_[c]; }
  int64_t size() const { return size_; }

  // Bytes held: centroids and list slots (the keys themselves are held by the caller).
  int64_t bytes() const;

 private:
  int32_t nearest(const float* key) const;

  int32_t dim_ = 0;
  int64_t size_ = 0;
  std::vector<float> centroids_;             // [n_clusters, dim]
  std::vector<std::vector<int32_t>> lists_;  // slots, ascending as inserted
};

}  // namespace kvbench
