// SHA-256 (FIPS 180-4), for the model file's identity in the results db: two shards or a
// baseline made with different weights must not be compared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvbench {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::string hex_digest();  // lower-case hex of the 32-byte digest; call once

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed
};

// The hex SHA-256 of a file's bytes; throws InputError naming the file when it cannot be read.
std::string sha256_file(const std::string& path);
// A model's: the file's, or for a folder (a Hugging Face model) the hash of its regular files'
// names and hashes in name order.
std::string sha256_model(const std::string& path);

}  // namespace kvbench
