// A safetensors file (huggingface/safetensors), memory-mapped: an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and [begin, end) byte offsets into
// the data that follows, then the data. Every entry is checked when the file is opened: its
// dtype known, its shape non-negative, its bytes the shape's size, inside the file and
// overlapping no other tensor's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvbench {

class MappedFile;

struct SafetensorsTensor {
  std::string dtype;           // "F32", "F16", "BF16", "I64", ... as the header names it
  std::vector<int64_t> shape;  // outermost first (row-major, as torch)
  const uint8_t* data = nullptr;
  int64_t bytes = 0;
  int64_t n_elements() const;
};

class SafetensorsFile {
 public:
  // Throws InputError naming the path: not a regular file, a header longer than the file (or
  // than 100 MiB), JSON that is not an object of entries, an unknown dtype, a shape whose
  // size the offsets do not hold, offsets past the data or overlapping.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;  // nullptr if absent

 private:
  std::string path_;
  std::unique_ptr<MappedFile> mapping_;
  std::map<std::string, SafetensorsTensor> tensors_;
};

// Bytes of one element of a safetensors dtype, 0 for a name the format does not define.
int64_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace kvbench
