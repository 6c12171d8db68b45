// Prefix reuse across requests (stage 4): the model's KV of whole token blocks, stored in
// the tiers under chained keys (reuse/block_key.h). A request loads its longest cached
// prefix into a fresh cache and prefills only the rest; the blocks it computed are then
// stored for the next request.
//
// Blocks hold the KV as the model computes it (before any method transforms it), captured
// as the cache receives it, so a per-sequence store composes: a KIVI cache packs loaded
// blocks as it packs prefilled ones, and Quest bounds its pages as they arrive.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "reuse/tiered_store.h"

namespace kvbench {

struct ResolvedSpec;

struct ReuseConfig {
  int64_t block_tokens = 256;
  TierConfig tiers;
};

// The reuse a spec asks for (its prefix and tiers components), nullptr when none.
std::unique_ptr<ReuseConfig> prefix_reuse_config(const ResolvedSpec& spec);

// What reuse did for one request.
struct ReuseTurn {
  int64_t tokens_looked_up = 0;  // prompt tokens whose whole blocks were looked up
  int64_t tokens_reused = 0;     // loaded from a tier instead of prefilled
  int64_t blocks_hit = 0;
  int64_t blocks_missed = 0;     // the first block not found ends the prefix
  int64_t bytes_loaded = 0;      // block bytes served by the tiers (decoded: what a disk or
                                 // Redis codec stores is in the tier's bytes_resident)
  double load_ms = 0;            // lookup, checksum and copy into the cache
  int64_t blocks_stored = 0;      // (CacheBlend: documents prefilled alone, once per session)
  int64_t bytes_stored = 0;
  double store_ms = 0;           // writing through the tiers (after the first token)
  std::string served_by;         // tiers that served the hits, e.g. "device" or "disk,redis"
  std::string faults;            // what went wrong ("" if nothing): a corrupt block, Redis gone
  bool documents = false;        // CacheBlend: the units are documents, not prefix blocks
  double hit_ratio() const {
    return tokens_looked_up > 0 ? static_cast<double>(tokens_reused) / tokens_looked_up : 0;
  }
};

class PrefixCache : private KvTap {
 public:
  // `clock` (seconds) times TTL expiry: the session's simulated clock, advanced by turn
  // gaps (default: steady_clock).
  PrefixCache(const ReuseConfig& config, const std::string& model_id, const KvShape& shape,
              std::function<double()> clock = {});
  ~PrefixCache() override;

  // First evicts what expired (apc_ttl's pins, policy=ttl). Then loads the longest cached
  // prefix of `prompt` in whole blocks, at most prompt.size() - 1
  // tokens (the last token is always computed, for its logits), into `cache`, which must be
  // empty. Returns the tokens loaded. A block that fails its checks is a miss and a fault.
  int64_t load(const std::vector<int32_t>& prompt, KvCache& cache, ReuseTurn& turn);

  // Records the KV `cache` receives for the whole blocks of `prompt` not yet stored, from
  // position `from` on (where load stopped), until store().
  void start_capture(KvCache& cache, const std::vector<int32_t>& prompt, int64_t from);
  // Stops capturing and writes the captured blocks through the tiers.
  void store(KvCache& cache, ReuseTurn& turn);

  std::vector<TierStats> tier_stats() const { return store_.stats(); }
  int64_t block_tokens() const { return config_.block_tokens; }

 private:
  void appended(int32_t layer, const float* k, const float* v, const int32_t* positions,
                int64_t n) override;

  struct Capture;
  ReuseConfig config_;
  std::string model_id_;
  KvShape shape_;
  TieredStore store_;
  std::unique_ptr<Capture> capture_;
};

}  // namespace kvbench
