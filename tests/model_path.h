// The real model for `model`-labelled tests: $KVBENCH_MODEL, else the bundled default.
// When it is absent the test process exits 77, which ctest reports as skipped.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvbench::testing {

inline std::string model_path_or_skip() {
  const char* env = std::getenv("KVBENCH_MODEL");
  const std::string path = env && *env ? env : KVBENCH_DEFAULT_MODEL;
  if (!std::filesystem::exists(path)) {
    std::printf("model not found at %s (run ./scripts/setup.sh): skipped\n", path.c_str());
    std::exit(77);
  }
  return path;
}

}  // namespace kvbench::testing
