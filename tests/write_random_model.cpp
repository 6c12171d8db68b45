// Writes the random-weight GGUF of SmolLM2-135M's shape that the gpu tests use, and prints
// its path: for the benchmarks and the CLI on a machine without the model download
// (KVBENCH_MODEL=$(write_random_model 32768) bench_forward ...).
// Usage: write_random_model [CONTEXT_LENGTH]   (default 8192)
#include <cstdio>
#include <exception>
#include <string>

#include "gguf_writer.h"

int main(int argc, char** argv) {
  try {
    const int context = argc > 1 ? std::stoi(argv[1]) : 8192;
    if (context < 1 || context > (1 << 20)) {
      std::fprintf(stderr, "write_random_model: context length %d out of range 1..1048576\n",
                   context);
      return 2;
    }
    std::printf("%s\n", kvbench::testing::random_smollm2_gguf(context).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_random_model: %s\n", e.what());
    return 2;
  }
}
