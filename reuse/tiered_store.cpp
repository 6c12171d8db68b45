#include "reuse/tiered_store.h"

#include <algorithm>
#include <cassert>
#include <chrono>

#include "common/elapsed.h"
#include "common/input_error.h"
#include "reuse/disk_tier.h"
#include "reuse/memory_tier.h"
#include "reuse/redis_tier.h"
#include "reuse/replacement.h"

namespace kvbench {

// One level of the hierarchy: the bytes (tier) and what the policy knows of them (index).
struct TieredStore::Level {
  Level(std::unique_ptr<Tier> tier_, int64_t capacity_, bool compresses_, const TierConfig& config,
        const SecondsClock& clock, bool pins)
      : tier(std::move(tier_)),
        index(pins ? ReplacementIndex(Replacement::Ttl, config.pin_ttl_s, clock, true)
                   : ReplacementIndex(config.policy, config.ttl_s, clock)),
        capacity(std::max<int64_t>(capacity_, 0)),
        compresses(compresses_) {
    tier->stats().capacity = capacity;
  }
  std::unique_ptr<Tier> tier;
  ReplacementIndex index;
  int64_t capacity;
  bool compresses;  // the size stored is known only after writing (an encoding tier)

  TierStats& stats() { return tier->stats(); }

  void drop(const std::string& key) {
    tier->erase(key);
    index.erase(key);
  }
  void evict(const std::string& key) {
    drop(key);
    ++stats().evictions;
  }
  // Evicts by the policy, never `keep`, until `incoming` more bytes fit beside the others.
  void make_room(const std::string& keep, int64_t incoming) {
    while (index.bytes() - index.bytes_of(keep) + incoming > capacity) {
      const auto victim = index.victim(keep);
      if (!victim) break;
      evict(*victim);
    }
  }
  // Expired entries go first, full or not, so bytes_resident counts live entries only.
  void evict_expired(const std::string& keep) {
    for (const std::string& key : index.expired_keys()) {
      if (key != keep) evict(key);
    }
  }

  void store(const std::string& key, const SharedBytes& value) {
    const auto size = static_cast<int64_t>(value->size());
    evict_expired(key);
    // Skips this level (an older value must not stay); encoded, only the stored size tells.
    if (capacity == 0 || (!compresses && size > capacity)) {
      if (index.contains(key)) drop(key);
      return;
    }
    make_room(key, compresses ? 0 : size);
    const auto start = std::chrono::steady_clock::now();
    const std::optional<int64_t> stored = tier->put(key, value);
    stats().store_ms += ms_since(start);
    if (!stored || *stored > capacity) {  // a fault (counted by the tier), or too big packed
      drop(key);
      return;
    }
    index.insert(key, *stored);
    stats().bytes_in += size;
    make_room(key, 0);  // encoded, the size is known only now
  }
};

TieredStore::TieredStore(const TierConfig& config, std::function<double()> clock)
    : config_(config) {
  if (config.policy == Replacement::Ttl && !(config.ttl_s > 0)) {
    throw InputError("tier ttl " + std::to_string(config.ttl_s) + " s: expected > 0");
  }
  if (config.pin_ttl_s < 0) {
    throw InputError("apc_ttl ttl " + std::to_string(config.pin_ttl_s) + " s: expected > 0");
  }
  if (!clock) clock = steady_seconds;
  auto add = [&](std::unique_ptr<Tier> tier, int64_t capacity, bool compresses, bool pins = false) {
    levels_.push_back(
        std::make_unique<Level>(std::move(tier), capacity, compresses, config, clock, pins));
  };
  add(std::make_unique<MemoryTier>("device"), config.device_bytes, false, config.pin_ttl_s > 0);
  if (config.cpu_bytes > 0) add(std::make_unique<MemoryTier>("cpu"), config.cpu_bytes, false);
  if (!config.disk_dir.empty())
    add(std::make_unique<DiskTier>(config.disk_dir, config.disk_codec), config.disk_bytes, true);
  if (!config.redis.empty()) {
    add(std::make_unique<RedisTier>(config.redis, 2.0, 1.0, config.redis_codec),
        config.redis_bytes, config.redis_codec != Codec::Raw);
  }
}

TieredStore::~TieredStore() = default;

void TieredStore::put(const std::string& key, const SharedBytes& value) {
  assert(value);
  if (!value) return;
  for (auto& level : levels_) level->store(key, value);
}

SharedBytes TieredStore::get(const std::string& key, std::string* from) {
  for (size_t i = 0; i < levels_.size(); ++i) {
    Level& level = *levels_[i];
    TierStats& stats = level.stats();
    if (!level.index.contains(key)) {
      ++stats.misses;
      continue;
    }
    if (level.index.expired(key)) {
      level.evict(key);
      ++stats.misses;
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    SharedBytes value = level.tier->get(key);
    if (!value) {  // unreadable: the tier counted the fault
      level.drop(key);
      ++stats.misses;
      continue;
    }
    stats.load_ms += ms_since(start);
    ++stats.hits;
    stats.bytes_out += static_cast<int64_t>(value->size());
    level.index.touch(key);
    for (size_t above = 0; above < i; ++above) levels_[above]->store(key, value);
    if (from) *from = level.tier->name();
    return value;
  }
  if (from) from->clear();
  return nullptr;
}

void TieredStore::erase(const std::string& key) {
  for (auto& level : levels_) {
    if (level->index.contains(key)) level->drop(key);
  }
}

void TieredStore::expire() {
  for (auto& level : levels_) level->evict_expired({});
}

std::vector<TierStats> TieredStore::stats() const {
  std::vector<TierStats> out;
  for (const auto& level : levels_) {
    TierStats stats = level->tier->stats();
    stats.capacity = level->capacity;
    stats.bytes_resident = level->index.bytes();
    stats.entries = level->index.entries();
    out.push_back(stats);
  }
  return out;
}

}  // namespace kvbench
