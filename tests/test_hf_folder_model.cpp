// A real model as a Hugging Face folder exported by transformers itself
// (scripts/export_hf_folder.py: SmolLM2-135M-Instruct from its GGUF, bf16 weights), held to
// transformers' own fp32 forward over the same folder (tests/fixtures/hf_parity_smollm2.json):
// token ids equal to its tokenizer's, top-8 logits at every position, the greedy continuation;
// and to kvbench's run of the GGUF it came from. The folder is $KVBENCH_HF_SMOLLM2, else
// ~/.cache/kvbench/hf/smollm2-135m; without it the test is skipped (exit 77): the export needs
// transformers and torch (about 3 GB), which CI does not install.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "tests/model_path.h"

using namespace kvbench;
using nlohmann::json;

namespace {

std::string folder_or_skip() {
  const char* env = std::getenv("KVBENCH_HF_SMOLLM2");
  const char* home = std::getenv("HOME");
  const std::string path = env && *env ? env
                           : home      ? std::string(home) + "/.cache/kvbench/hf/smollm2-135m"
                                       : "";
  if (path.empty() || !std::filesystem::exists(path + "/config.json")) {
    std::printf("no exported folder at '%s' (scripts/export_hf_folder.py): skipped\n",
                path.c_str());
    std::exit(77);
  }
  return path;
}

}  // namespace

TEST_CASE("hf folder model: SmolLM2 exported by transformers answers as transformers does",
          "[model]") {
  const auto model = LlamaModel::load(folder_or_skip());
  const json fixture =
      json::parse(std::ifstream(std::string(KVBENCH_FIXTURES) + "/hf_parity_smollm2.json"));
  const int64_t vocab = model->config().vocab_size;
  double worst = 0;
  for (const json& c : fixture["cases"]) {
    const std::string text = c["text"].get<std::string>();
    INFO(text);
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    CHECK(model->tokenizer().encode(text) == ids);
    KvCache kv = make_full_cache(model->kv_shape());
    kv.reserve_more(static_cast<int64_t>(ids.size()) + 16);
    const std::vector<float> logits = model->forward(ids, kv, /*all_logits=*/true);
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const auto top_ids = c["top_ids"][pos].get<std::vector<int32_t>>();
      const auto top = c["top_logits"][pos].get<std::vector<double>>();
      for (size_t j = 0; j < top_ids.size(); ++j) {
        worst = std::max(worst, std::abs(logits[pos * vocab + top_ids[j]] - top[j]));
      }
    }
    // Greedy decode, one token a step, as transformers' generate(do_sample=False).
    std::vector<int32_t> greedy;
    std::vector<float> last(logits.end() - vocab, logits.end());
    for (size_t i = 0; i < c["greedy"].size(); ++i) {
      const auto next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      greedy.push_back(next);
      last = model->forward({next}, kv);
    }
    CHECK(greedy == c["greedy"].get<std::vector<int32_t>>());
  }
  WARN("SmolLM2 folder against transformers: largest top-8 logit difference " << worst);
  CHECK(worst < 1e-3);
}
