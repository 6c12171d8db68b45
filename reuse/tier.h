// One storage tier of the reuse hierarchy (LMCache's backends): a byte store under string
// keys with a capacity. Tiers hold encoded KV blocks (reuse/kv_block.h) and know nothing of
// their contents; the replacement policy and the hierarchy live in reuse/tiered_store.h.
//
// A tier never throws for an I/O fault (disk full, a Redis server gone, an unreadable
// file): put returns nullopt, get returns nothing, and the fault is counted and described
// in its stats. A fault costs a miss, never a crash or wrong data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvbench {

using Bytes = std::vector<uint8_t>;
using SharedBytes = std::shared_ptr<const Bytes>;

// What a tier holds and did; counters run from its creation.
struct TierStats {
  std::string name;            // "device", "cpu", "disk", "redis"
  int64_t capacity = 0;        // bytes it may hold
  int64_t bytes_resident = 0;  // bytes it holds now (as stored: compressed on disk)
  int64_t entries = 0;
  int64_t bytes_in = 0;        // block bytes written into it
  int64_t bytes_out = 0;       // block bytes read out of it (hits)
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;       // entries dropped by the replacement policy or TTL
  int64_t faults = 0;          // failed writes or reads (disk full, server gone, corrupt file)
  double load_ms = 0;          // time spent in hits' reads
  double store_ms = 0;         // time spent in writes
  std::string last_fault;      // what the last fault was, "" if none
};

class Tier {
 public:
  virtual ~Tier() = default;
  virtual const std::string& name() const = 0;
  // Stores `value` under `key` (replacing any). Returns the bytes it now occupies in the
  // tier (compressed size on disk), or nullopt on a fault (recorded in stats()).
  virtual std::optional<int64_t> put(const std::string& key, const SharedBytes& value) = 0;
  // The value under `key`, or nullptr when absent or unreadable (a fault when unreadable).
  virtual SharedBytes get(const std::string& key) = 0;
  virtual void erase(const std::string& key) = 0;
  // A tier records its name and faults here; the TieredStore that owns it counts the rest.
  TierStats& stats() { return stats_; }
  const TierStats& stats() const { return stats_; }

 protected:
  void fault(const std::string& what) {
    ++stats_.faults;
    stats_.last_fault = what;
  }
  TierStats stats_;
};

}  // namespace kvbench
