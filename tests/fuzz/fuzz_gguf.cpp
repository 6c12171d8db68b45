// GGUF: header, metadata, tensor table, and the model config and tokenizer read from them.
// The bytes go through a memfd, as GgufFile maps a path.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "harness/model/gguf.h"
#include "harness/model/model_config.h"
#include "harness/model/tokenizer.h"

using namespace kvbench;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.gguf", 0);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    GgufFile file(path);
    FUZZ_CHECK(file.version() == 2 || file.version() == 3);
    for (const GgufTensorInfo& t : file.tensors()) {  // every tensor's bytes lie in the file
      FUZZ_CHECK(t.n_bytes() >= 0 && static_cast<size_t>(t.n_bytes()) <= size);
      if (t.n_bytes() > 0) {
        volatile uint8_t last = t.data[t.n_bytes() - 1];  // ASan: inside the mapping
        (void)last;
      }
    }
    const ModelConfig config = ModelConfig::from_gguf(file);
    FUZZ_CHECK(config.n_layers > 0 && config.n_heads > 0 && config.n_kv_heads > 0);
    FUZZ_CHECK(config.n_heads % config.n_kv_heads == 0);
    FUZZ_CHECK(config.head_dim > 0 && config.head_dim % 2 == 0);
    FUZZ_CHECK(config.rms_eps > 0 && std::isfinite(config.rope_theta));
    for (float f : config.rope_inv_freq) FUZZ_CHECK(std::isfinite(f));
    const Tokenizer tokenizer = Tokenizer::from_gguf(file);
    for (int32_t id : tokenizer.encode("Hello, world! 123")) {
      FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
    }
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  return 0;
}
