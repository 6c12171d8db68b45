// The reuse hierarchy, after LMCache: device (the memory the model computes from), CPU
// memory, local disk (files), Redis; the two slow tiers encode what they store by their
// codec (reuse/block_codec.h: raw, zstd or cachegen), the memory tiers hold it as it is. Every put writes through to every tier (each
// keeps what its capacity and replacement policy allow); a get searches top-down, and a
// hit in a lower tier is copied back into the tiers above it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reuse/block_codec.h"
#include "reuse/tier.h"

namespace kvbench {

enum class Replacement { Lru, Lfu, Fifo, Ttl };
Replacement parse_replacement(const std::string& text);  // InputError unless lru/lfu/fifo/ttl
const char* to_string(Replacement policy);

struct TierConfig {
  int64_t device_bytes = 64ll << 20;
  int64_t cpu_bytes = 0;       // 0: no CPU tier
  std::string disk_dir;        // "": no disk tier
  int64_t disk_bytes = 4ll << 30;
  Codec disk_codec = Codec::Zstd;
  std::string redis;           // "host:port", "": no Redis tier
  int64_t redis_bytes = 1ll << 30;
  Codec redis_codec = Codec::Raw;
  Replacement policy = Replacement::Lru;
  double ttl_s = 600;          // Replacement::Ttl: an entry expires this long after its put
  // apc_ttl (Continuum): the device tier pins each block this long after its last use (put
  // or hit), then drops it; its policy is Ttl renewed on use, whatever `policy` says. The
  // tiers below keep `policy`. 0: no pinning.
  double pin_ttl_s = 0;
};

class TieredStore {
 public:
  // Opens the tiers. Throws InputError naming the directory when disk_dir cannot be created
  // or written (or the Redis address when it is not host:port). An unreachable Redis is not
  // an error: the tier reports misses and faults. `clock` (seconds, default steady_clock)
  // times TTL expiry; tests pass a fake one. Not thread-safe: one caller at a time.
  explicit TieredStore(const TierConfig& config, std::function<double()> clock = {});
  ~TieredStore();

  // Writes through to every tier, evicting by the policy where a tier is full. A value
  // larger than a tier's capacity skips that tier (on disk and Redis: as encoded). A failed
  // write (a fault, or a value the codec cannot encode) leaves that tier without the key.
  void put(const std::string& key, const SharedBytes& value);
  // The value from the highest tier that has it (copied into the tiers above), else nullptr.
  // `from` gets the name of the tier that served it. From a lossy codec's tier (cachegen)
  // the value is the decoded one, and so are the copies above.
  SharedBytes get(const std::string& key, std::string* from = nullptr);
  // Drops `key` from every tier (a block that failed its checksum).
  void erase(const std::string& key);
  // Evicts every expired entry of every tier (Ttl, or the device tier's pins), freeing its
  // bytes: what a lookup after a turn gap sees.
  void expire();

  std::vector<TierStats> stats() const;  // top-down

 private:
  struct Level;
  std::vector<std::unique_ptr<Level>> levels_;
  TierConfig config_;
};

}  // namespace kvbench
