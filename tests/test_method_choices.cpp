// The `choice:` lines `kvbench list methods` prints (MethodInfo::choices) against the
// registry's own flags: a line that says what the code no longer does is caught here, not by
// a reader. Each rule below is a claim a choice once made after it stopped being true.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <string>

#include "cache/registry.h"

using namespace kvbench;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool any_storage_splits_heads() {
  const auto& all = method_registry();
  return std::any_of(all.begin(), all.end(), [](const MethodInfo& m) {
    return m.kind == MethodKind::Storage && m.splits_heads;
  });
}

}  // namespace

TEST_CASE("method choices: no line contradicts the registry's flags", "[unit]") {
  REQUIRE(any_storage_splits_heads());
  for (const MethodInfo& info : method_registry()) {
    for (const std::string& line : info.choices) {
      const std::string text = lower(line);
      INFO(info.name << ": " << line);
      // A method that runs with --device cuda is not "CPU only".
      if (runs_on_cuda(info)) CHECK(text.find("cpu only") == std::string::npos);
      // A method whose heads keep their own counts can sit in front of the storage methods
      // that hold heads apart: not "fp32 store" only, not "no storage method".
      if (makes_ragged_heads(info)) {
        CHECK(text.find("no storage method") == std::string::npos);
        CHECK(text.find("with the fp32 store") == std::string::npos);
        CHECK(text.find("fp32 store (") == std::string::npos);
      }
      // Facts are cited from the repository (docs/methods.md), not from files outside it.
      CHECK(text.find("../shared") == std::string::npos);
      CHECK(text.find("methods-facts") == std::string::npos);
    }
  }
}

TEST_CASE("method choices: runs_on_cuda is what --device cuda accepts", "[unit]") {
  CHECK(runs_on_cuda(*find_method("full")));
  CHECK(runs_on_cuda(*find_method("snapkv")));
  CHECK(runs_on_cuda(*find_method("adakv")));
  CHECK(runs_on_cuda(*find_method("quest")));
#ifdef KVBENCH_WITH_CUDA  // a storage method runs there when its device twin is built
  CHECK(runs_on_cuda(*find_method("kivi")));
  CHECK(runs_on_cuda(*find_method("bf16")));
#else
  CHECK_FALSE(runs_on_cuda(*find_method("kivi")));
#endif
  CHECK_FALSE(runs_on_cuda(*find_method("prefix")));
  CHECK_FALSE(runs_on_cuda(*find_method("kvquant_keys")));
}
