// Sweep configs: a config that parses writes canonical JSON that parses back to the same.
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "harness/sweep_config.h"
#include "methods/builtin_methods.h"

using namespace kvbench;

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  register_builtin_methods();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const SweepConfig config = parse_sweep_config(text, "fuzz.json");
    FUZZ_CHECK(!config.tasks.empty() && !config.methods.empty());
    FUZZ_CHECK(config.samples >= 1 && config.turns >= 1 && config.context_tokens >= 1);
    const std::string canonical = canonical_config_json(config);
    const SweepConfig again = parse_sweep_config(canonical, "canonical.json");
    FUZZ_CHECK(canonical_config_json(again) == canonical);
    FUZZ_CHECK(!sweep_methods(config).empty());
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  return 0;
}
