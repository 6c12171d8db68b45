// The task generators with SmolLM2's real tokenizer: every task at 1K and 4K tokens lands
// within 2% of the target, and a seed gives the same sample twice. Exits 77 (skipped)
// without the model.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "datasets/generator.h"
#include "harness/model/gguf.h"
#include "harness/model/tokenizer.h"
#include "model_path.h"

using namespace kvbench;

TEST_CASE("every task lands within 2% of 1K and 4K real tokens", "[model]") {
  const std::string path = testing::model_path_or_skip();
  GgufFile file(path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  for (const auto& task : task_registry()) {
    for (int64_t target : {1024, 4096}) {
      GeneratorOptions o;
      o.task = task.name;
      o.context_tokens = target;
      o.turns = 5;
      o.samples = 2;
      o.seed = 1;
      const auto samples = generate_samples(o, tok);
      REQUIRE(samples.size() == 2);
      for (const auto& s : samples) {
        const int64_t n = count_context_tokens(tok, s.context);
        std::printf("%-20s target %5lld: %5lld tokens (%+.2f%%)\n", task.name.c_str(),
                    static_cast<long long>(target), static_cast<long long>(n),
                    100.0 * static_cast<double>(n - target) / static_cast<double>(target));
        INFO(task.name << " at " << target << ": " << n << " tokens");
        CHECK(std::abs(n - target) <= target * kContextTolerance);
        CHECK(s.turns.size() == 5);
      }
      if (target == 1024) {
        const auto again = generate_samples(o, tok);
        CHECK(again[0].context == samples[0].context);
        CHECK(again[1].turns[4].input == samples[1].turns[4].input);
      }
    }
  }
}
