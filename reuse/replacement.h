// The replacement index of one tier: which keys it holds, their sizes as stored, when they
// were written and used, and which to drop first when the tier is full. The tier holds the
// bytes; this holds only the bookkeeping, so one policy serves memory, disk and Redis alike.
//
// Victim order per policy (ties always go to the entry used least recently):
//   Lru  - least recently written or read;
//   Lfu  - fewest accesses (the put counts as one);
//   Fifo - written longest ago; reads do not matter;
//   Ttl  - soonest to expire, so expired entries come first; an expired entry is a miss.
//          An entry expires ttl after its put, or, renewing (apc_ttl: Continuum's pin), ttl
//          after its last use.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "reuse/tiered_store.h"

namespace kvbench {

// Seconds on some monotonic scale; injectable so TTL tests need not sleep.
using SecondsClock = std::function<double()>;
double steady_seconds();  // std::chrono::steady_clock, in seconds

class ReplacementIndex {
 public:
  // `ttl_s` is used by Replacement::Ttl only; `clock` defaults to steady_seconds. With
  // `renew_on_touch` a read restarts an entry's ttl (a pin held while it is used).
  explicit ReplacementIndex(Replacement policy, double ttl_s = 0, SecondsClock clock = {},
                            bool renew_on_touch = false);

  // Records that `key` now occupies `bytes` (a rewrite replaces the entry and counts as an
  // access; its insert time and expiry restart).
  void insert(const std::string& key, int64_t bytes);
  // Records a read of `key`. False when absent or expired (the caller drops it: a miss).
  bool touch(const std::string& key);
  void erase(const std::string& key);

  bool contains(const std::string& key) const { return entries_.count(key) != 0; }
  bool expired(const std::string& key) const;      // Ttl only; false when absent
  // The expired entries (Ttl only), soonest expired first: what expiry frees.
  std::vector<std::string> expired_keys() const;
  int64_t bytes_of(const std::string& key) const;  // 0 when absent
  // The next entry to drop, other than `keep` (the entry being written); nullopt when none.
  std::optional<std::string> victim(const std::string& keep = {}) const;

  int64_t bytes() const { return bytes_; }  // total of all entries
  int64_t entries() const { return static_cast<int64_t>(entries_.size()); }
  Replacement policy() const { return policy_; }

 private:
  // Sort key of an entry: policy-specific primary, then a unique tick (least recent first).
  using Rank = std::pair<double, uint64_t>;
  struct Entry {
    int64_t bytes = 0;
    double inserted_s = 0;
    double last_access_s = 0;
    int64_t accesses = 0;
    double expires_s = 0;  // Ttl only
    uint64_t inserted_tick = 0;
    uint64_t last_tick = 0;
    Rank rank;
  };
  Rank rank_of(const Entry& entry) const;
  void rerank(const std::string& key, Entry& entry);

  Replacement policy_;
  double ttl_s_;
  bool renew_on_touch_;
  SecondsClock clock_;
  uint64_t tick_ = 0;  // orders events that share a clock reading
  int64_t bytes_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::map<Rank, std::string> order_;  // victim first
};

}  // namespace kvbench
