// Keys of prefix blocks, as vLLM and LMCache chain them: block i's key hashes block i-1's
// key, the model's identity and block i's tokens, so a key names a whole prefix and one
// model. Two requests share block i's key only if they share every token up to its end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

// Keys (lower-case hex SHA-256) of the whole blocks of `tokens`: n / block_tokens of them.
std::vector<std::string> chain_block_keys(const std::string& model_id, const int32_t* tokens,
                                          int64_t n, int64_t block_tokens);

// The model's identity for keys: the SHA-256 of its file, computed once per path, size and
// modification time in a process.
std::string model_identity(const std::string& model_path);

}  // namespace kvbench
