// GGUF reader: versions 2 and 3, every metadata type, the tensor table, memory-mapped data.
// Spec: ggml-org/ggml docs/gguf.md. All multi-byte values are little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "common/input_error.h"

namespace kvbench {

// ggml tensor types, numbered as in ggml.h. Only the ones kvbench can dequantize are named.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

const char* ggml_type_name(GgmlType type);  // "F32", ..., or "unknown"
// A tensor shape as "[a, b]", for messages.
std::string shape_text(const std::vector<int64_t>& shape);
bool ggml_type_supported(GgmlType type);
int64_t ggml_block_elements(GgmlType type);  // elements per block (1 for F32/F16/BF16)
int64_t ggml_block_bytes(GgmlType type);     // bytes per block
// Bytes for n elements (n must be a multiple of the block size).
int64_t ggml_row_bytes(GgmlType type, int64_t n);

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// One metadata value. Arrays hold their elements as a vector of scalars or strings.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT32;
  GgufValueType array_type = GgufValueType::UINT32;  // element type when type == ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string,  // scalars (widened)
               std::vector<uint64_t>, std::vector<int64_t>, std::vector<double>,
               std::vector<bool>, std::vector<std::string>>
      value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the contiguous (row) dimension
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // from the start of the data section
  const uint8_t* data = nullptr;  // into the mapping
  int64_t n_elements() const;
  int64_t n_bytes() const;
};

class GgufFile {
 public:
  // Maps and parses the file. Throws InputError naming the path on any malformed input:
  // bad magic, unsupported version, truncation, out-of-range tensor data, unknown type.
  explicit GgufFile(const std::string& path);
  // The same contents from elsewhere (harness/model/hf_folder.h: a Hugging Face folder read
  // as llama.cpp's converter would write it): tensors' data live in `owned`.
  GgufFile(std::string path, std::map<std::string, GgufValue> metadata,
           std::vector<GgufTensorInfo> tensors, std::vector<std::shared_ptr<const void>> owned);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent
  const GgufTensorInfo& tensor(const std::string& name) const;      // InputError if absent

  // Typed metadata access; InputError if the key is missing or of an incompatible type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer type
  double get_float(const std::string& key) const;  // any float or integer type
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  // Defaults for optional keys.
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::vector<std::shared_ptr<const void>> owned_;  // the mapping(s) and buffers tensors point in
};

}  // namespace kvbench
