// SCBench JSONL samples.
#include <cstdint>
#include <set>
#include <sstream>
#include <string>

#include "datasets/sample.h"
#include "fuzz_check.h"

using namespace kvbench;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const std::vector<Sample> samples = parse_samples_jsonl(in, "fuzz.jsonl");
    FUZZ_CHECK(!samples.empty());
    std::set<std::string> ids;
    for (const Sample& s : samples) {
      FUZZ_CHECK(ids.insert(s.id).second);
      FUZZ_CHECK(!s.turns.empty());
      for (const SampleTurn& t : s.turns) FUZZ_CHECK(!t.answers.empty());
    }
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  return 0;
}
