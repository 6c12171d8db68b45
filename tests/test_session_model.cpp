// The README's session demo on the real model: the example sample runs through the full
// cache as its own reference, and the model finds some of the values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "datasets/sample.h"
#include "harness/model/llama_model.h"
#include "harness/session.h"
#include "methods/registry.h"
#include "model_path.h"

using namespace kvbench;

TEST_CASE("session model: the kv_retrieval example with the full cache", "[model]") {
  const auto model = LlamaModel::load(testing::model_path_or_skip());
  const auto samples =
      load_samples_jsonl(std::string(KVBENCH_FIXTURES) + "/../../datasets/examples/kv_retrieval.jsonl");
  REQUIRE(samples.size() == 1);
  SessionOptions options;
  options.max_new_tokens = 24;
  SessionResult full = run_session(*model, samples[0], "full", options, nullptr);
  apply_reference(full, reference_of(full));
  REQUIRE(full.turns.size() == 3);
  CHECK(full.context_tokens > 400);
  int found = 0;
  for (const TurnRecord& t : full.turns) {
    CHECK(t.first_token_kl == 0.0);
    CHECK(t.top1_agreement == 1.0);
    found += t.prediction.find(t.reference) != std::string::npos;
  }
  CHECK(found >= 1);  // SmolLM2-135M is weak at retrieval: 2 of 3 when this was written

  if (find_method("streamingllm")) {
    const SampleReference reference = reference_of(full);
    const SessionResult evicted =
        run_session(*model, samples[0], "streamingllm:budget=128", options, &reference);
    for (const TurnRecord& t : evicted.turns) {
      CHECK(t.tokens_kept <= 128.0);
      CHECK(t.kv_bytes <= full.turns[t.turn - 1].kv_bytes);
    }
    CHECK(std::any_of(evicted.turns.begin(), evicted.turns.end(),
                      [](const TurnRecord& t) { return t.first_token_kl > 0.0; }));
  }
}
