// Baselines of kvbench check: what parses is in range, and written back parses the same.
#include <cmath>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "reports/regression_check.h"

using namespace kvbench;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const Aggregate& a : parse_baseline(text, "fuzz_baseline.json")) {
      FUZZ_CHECK(std::isfinite(a.kv_bytes) && a.kv_bytes >= 0);
      FUZZ_CHECK(a.decode_tokens_per_s >= 0 && a.ttft_ms >= 0);
      if (a.accuracy) {
        FUZZ_CHECK(*a.accuracy >= 0 && *a.accuracy <= 1 && a.accuracy_ci);
        FUZZ_CHECK(a.accuracy_ci->low <= *a.accuracy && *a.accuracy <= a.accuracy_ci->high);
      }
    }
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  return 0;
}
