#include "reuse/memory_tier.h"

#include <utility>

namespace kvbench {

MemoryTier::MemoryTier(std::string name) { stats_.name = std::move(name); }

std::optional<int64_t> MemoryTier::put(const std::string& key, const SharedBytes& value) {
  if (!value) {
    fault(stats_.name + " put " + key + ": no value");
    return std::nullopt;
  }
  values_[key] = value;
  return static_cast<int64_t>(value->size());
}

SharedBytes MemoryTier::get(const std::string& key) {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : it->second;
}

void MemoryTier::erase(const std::string& key) { values_.erase(key); }

}  // namespace kvbench
