// Compressed caches reused whole: with an eviction or merging method, what a request can
// reuse is its context's cache after the method compressed it (SnapKV's choice depends on
// the whole context, so no prefix block of it stands alone). A snapshot of that cache is
// kept in device memory under a key of the model, the method and every context token, and
// each request with the same context starts from a copy of it: the method's decision is
// made once and reused, as a serving system that caches compressed KV would.
//
// Snapshots are live caches (stores and policy state), not bytes, so they live in the
// device tier only; the CPU, disk and Redis tiers hold prefix blocks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "cache/kv_cache.h"
#include "reuse/replacement.h"
#include "reuse/tier.h"
#include "reuse/tiered_store.h"

namespace kvbench {

class ContextSnapshots {
 public:
  // `clock` (seconds, default steady_clock) times TTL expiry. pin_ttl_s > 0 (apc_ttl): each
  // snapshot is pinned that long after its last use, then dropped, whatever `policy` says.
  ContextSnapshots(int64_t capacity_bytes, Replacement policy, double ttl_s,
                   SecondsClock clock = {}, double pin_ttl_s = 0);

  // A copy of the snapshot under `key`, or nullopt (a miss). Expired snapshots are evicted
  // first, so their bytes are free before the lookup.
  std::optional<KvCache> find(const std::string& key);
  // Keeps `cache` (a copy the caller made) under `key`, dropping others by the policy to
  // stay within the capacity; a cache larger than the capacity is not kept.
  void put(const std::string& key, KvCache cache);
  const TierStats& stats() const { return stats_; }

 private:
  std::map<std::string, KvCache> entries_;
  ReplacementIndex index_;
  TierStats stats_;
};

// The key of a context for `method` (its canonical per-sequence spec): SHA-256 over the
// model's identity, the method and the tokens.
std::string context_key(const std::string& model_id, const std::string& method,
                        const std::vector<int32_t>& tokens);

}  // namespace kvbench
