// A file mapped read-only into memory, as the model files are read: GGUF and safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvbench {

class MappedFile {
 public:
  // Maps `path`; InputError naming it ("expected `what`") when it cannot be opened, is not a
  // regular file (a FIFO is refused without waiting for a writer) or cannot be mapped.
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile& operator=(MappedFile&&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvbench
