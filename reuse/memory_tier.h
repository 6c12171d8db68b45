// A tier in host memory: "device" (the memory the model computes from, host RAM on a
// CPU-only build) and "cpu". It holds the shared buffers themselves, so put and get copy
// nothing; the bytes it occupies are the values' sizes.
#pragma once

#include <string>
#include <unordered_map>

#include "reuse/tier.h"

namespace kvbench {

class MemoryTier : public Tier {
 public:
  explicit MemoryTier(std::string name);

  const std::string& name() const override { return stats_.name; }
  std::optional<int64_t> put(const std::string& key, const SharedBytes& value) override;
  SharedBytes get(const std::string& key) override;
  void erase(const std::string& key) override;

 private:
  std::unordered_map<std::string, SharedBytes> values_;
};

}  // namespace kvbench
