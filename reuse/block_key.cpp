#include "reuse/block_key.h"

#include <sys/stat.h>

#include <map>
#include <mutex>
#include <tuple>

#include "common/sha256.h"

namespace kvbench {

std::vector<std::string> chain_block_keys(const std::string& model_id, const int32_t* tokens,
                                          int64_t n, int64_t block_tokens) {
  std::vector<std::string> keys;
  std::string previous;  // block 0 chains from nothing
  for (int64_t start = 0; block_tokens > 0 && start + block_tokens <= n; start += block_tokens) {
    Sha256 hash;
    hash.update(previous.data(), previous.size());
    hash.update(model_id.data(), model_id.size());
    const int64_t count = block_tokens;
    hash.update(&count, sizeof(count));  // a block size change never reuses old keys
    hash.update(tokens + start, static_cast<size_t>(block_tokens) * sizeof(int32_t));
    previous = hash.hex_digest();
    keys.push_back(previous);
  }
  return keys;
}

std::string model_identity(const std::string& model_path) {
  struct stat st {};
  if (stat(model_path.c_str(), &st) != 0) return sha256_file(model_path);  // throws, naming it
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t>;
  static std::mutex mutex;
  static std::map<Key, std::string> known;
  const Key key{model_path, static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                static_cast<int64_t>(st.st_mtim.tv_nsec)};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(key);
  if (it == known.end()) it = known.emplace(key, sha256_file(model_path)).first;
  return it->second;
}

}  // namespace kvbench
