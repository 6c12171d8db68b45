#include "reuse/context_snapshots.h"

#include <chrono>

#include "common/elapsed.h"
#include "common/sha256.h"

namespace kvbench {

ContextSnapshots::ContextSnapshots(int64_t capacity_bytes, Replacement policy, double ttl_s,
                                   SecondsClock clock, double pin_ttl_s)
    : index_(pin_ttl_s > 0 ? ReplacementIndex(Replacement::Ttl, pin_ttl_s, std::move(clock), true)
                           : ReplacementIndex(policy, ttl_s, std::move(clock))) {
  stats_.name = "device";
  stats_.capacity = capacity_bytes;
}

std::optional<KvCache> ContextSnapshots::find(const std::string& key) {
  for (const std::string& expired : index_.expired_keys()) {
    index_.erase(expired);
    entries_.erase(expired);
    ++stats_.evictions;
  }
  stats_.bytes_resident = index_.bytes();
  stats_.entries = index_.entries();
  const auto it = entries_.find(key);
  if (it == entries_.end() || !index_.touch(key)) {
    if (it != entries_.end()) {  // expired (policy ttl)
      index_.erase(key);
      entries_.erase(it);
      ++stats_.evictions;
      stats_.bytes_resident = index_.bytes();
      stats_.entries = index_.entries();
    }
    ++stats_.misses;
    return std::nullopt;
  }
  const auto start = std::chrono::steady_clock::now();
  KvCache copy = it->second.clone();
  stats_.load_ms += ms_since(start);
  ++stats_.hits;
  stats_.bytes_out += copy.bytes_resident();
  return copy;
}

void ContextSnapshots::put(const std::string& key, KvCache cache) {
  const int64_t bytes = cache.bytes_resident();
  if (bytes > stats_.capacity) return;
  const auto start = std::chrono::steady_clock::now();
  if (index_.contains(key)) {
    index_.erase(key);
    entries_.erase(key);
  }
  while (index_.bytes() + bytes > stats_.capacity) {
    const std::optional<std::string> victim = index_.victim();
    if (!victim) break;
    index_.erase(*victim);
    entries_.erase(*victim);
    ++stats_.evictions;
  }
  entries_.emplace(key, std::move(cache));
  index_.insert(key, bytes);
  stats_.bytes_in += bytes;
  stats_.bytes_resident = index_.bytes();
  stats_.entries = index_.entries();
  stats_.store_ms += ms_since(start);
}

std::string context_key(const std::string& model_id, const std::string& method,
                        const std::vector<int32_t>& tokens) {
  Sha256 hash;
  hash.update(model_id.data(), model_id.size());
  hash.update(method.data(), method.size() + 1);  // with its NUL: method and tokens stay apart
  hash.update(tokens.data(), tokens.size() * sizeof(int32_t));
  return hash.hex_digest();
}

}  // namespace kvbench
