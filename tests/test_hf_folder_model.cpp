// Real models as Hugging Face folders exported by transformers itself (scripts/hf_folders.sh:
// SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct and Qwen2.5-Coder-1.5B-Instruct from
// their GGUFs, bf16 weights), held to transformers' own fp32 forward over the same folder,
// written beside it by the same export (transformers_parity.json): token ids equal to its
// tokenizer's, top-8 logits at every position, the greedy continuation. The folders are
// ~/.cache/kvbench/hf/<short name> ($KVBENCH_HF_DIR for another parent); a missing one is
// skipped, and the process exits 77 (skipped) when all are: the export needs transformers
// and torch (about 6 GB from PyPI). CI exports all three and runs this test
// (.ci/run, docs/ci.md).
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

std::string exported_folder(const std::string& name) {
  const char* env = std::getenv("KVBENCH_HF_DIR");
  const char* home = std::getenv("HOME");
  const std::string parent = env && *env ? env
                             : home      ? std::string(home) + "/.cache/kvbench/hf"
                                         : "";
  const std::string path = parent + "/" + name;
  // The parity file is the export's last step: without it the export did not finish.
  return std::filesystem::exists(path + "/transformers_parity.json") ? path : "";
}

struct Exported {
  const char* name;
};
const Exported kExported[] = {{"smollm2-135m"}, {"qwen2.5-0.5b"}, {"qwen2.5-1.5b"}};

// Exits 77 (skipped) before any test runs when no folder was exported.
const bool kAnyExported = [] {
  for (const Exported& e : kExported) {
    if (!exported_folder(e.name).empty()) return true;
  }
  std::printf("no exported folder under ~/.cache/kvbench/hf (scripts/hf_folders.sh): "
              "skipped\n");
  std::exit(77);
}();

}  // namespace

TEST_CASE("hf folder model: models exported by transformers answer as transformers does",
          "[model]") {
  const Exported& exported = GENERATE(kExported[0], kExported[1], kExported[2]);
  const std::string folder = exported_folder(exported.name);
  if (folder.empty()) {
    WARN(exported.name << ": not exported, skipped");
    return;
  }
  INFO(exported.name);
  const auto model = LlamaModel::load(folder);
  const json fixture = json::parse(std::ifstream(folder + "/transformers_parity.json"));
  INFO(fixture["source"].get<std::string>());
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
  WARN(exported.name << " folder against transformers: largest top-8 logit difference " << worst);
  CHECK(worst < 1e-3);
}
