// The C++ model against two independent implementations on the same GGUF, for each model
// kvbench fetches (SmolLM2-135M: llama architecture, Q4_1; Qwen2.5-Coder-0.5B and 1.5B: qwen2,
// with q/k/v biases, NeoX RoPE and an untied head, Q4_K_M):
//  - llama.cpp (tests/fixtures/parity_<model>.json, scripts/make_parity_fixtures.py);
//  - an fp32 numpy forward on the dequantized weights (parity_<model>_fp32.json,
//    scripts/numpy_reference_forward.py), itself checked against llama.cpp.
// Token ids must equal llama.cpp's exactly. Logits and greedy continuations are held to the
// fp32 reference tightly and to llama.cpp within llama.cpp's own rounding noise: it
// multiplies by activations rounded to 8 bits and keeps K/V in fp16, which moves these
// models' logits by ~0.1 typically and up to ~2 (it disagrees with itself by as much between
// batched and one-token evaluation), so exact agreement with it is not a meaningful bar.
// Each check is one test case per model; a model file that is absent skips its cases. The
// 1.5B model, fetched on first use only, is checked by a build of this file of its own
// (test_parity_1.5b: KVBENCH_PARITY_MODELS), so that its absence skips only its cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "cache/full_cache.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "model_path.h"

using namespace kvbench;
using nlohmann::json;

namespace {

// kvbench and the numpy reference both compute in fp32 on the same dequantized weights and
// differ only in summation order (BLAS GEMM, tiled attention, block kernels vs numpy).
// Measured: at most 6.2e-5 on SmolLM2's logits of magnitude ~20, 5.9e-5 on Qwen2.5's (the
// fixtures round to 1e-5); 1e-3 leaves room for another BLAS or thread count, and is far below
// any real bug's effect (the fp32 reference's greedy margins are all above 0.03).
constexpr double kFp32Tolerance = 1e-3;

// Per model: its file, its fixtures and the bounds against llama.cpp, on |logit difference|
// at llama.cpp's top-8 ids, set above what the fp32 reference itself shows against llama.cpp.
// near_tie: where llama.cpp's top-2 logits are closer than this, its choice is within its
// noise, above every fp32-vs-llama.cpp top-1 disagreement measured.
struct SmolLM2 {
  static std::string path() { return testing::model_path_or_skip(); }
  static constexpr const char* llama_cpp_fixture = "parity_smollm2.json";
  static constexpr const char* fp32_fixture = "parity_smollm2_fp32.json";
  // fp32 reference vs llama.cpp: mean 0.14, p99 0.55, max 1.26; top-1 disagreements below 0.57.
  static constexpr double llama_cpp_mean = 0.3, llama_cpp_p99 = 1.0, llama_cpp_max = 2.0;
  // Decode with int8 activations rounds x independently of llama.cpp's own rounding:
  // measured mean 0.20, p99 0.79, max 2.04 over the test's 16 steps a prompt (over all 31:
  // 0.20, 0.81, 2.04; the fp32 decode's: 0.16, 0.61, 1.36).
  static constexpr double int8_decode_max = 3.0;
  static constexpr double near_tie = 0.6;
  static constexpr size_t llama_cpp_first_position = 0;
};

struct Qwen2 {
  static std::string path() { return testing::qwen_model_path_or_skip(); }
  static constexpr const char* llama_cpp_fixture = "parity_qwen2.json";
  static constexpr const char* fp32_fixture = "parity_qwen2_fp32.json";
  // fp32 reference vs llama.cpp: mean 0.056, p99 0.23, max 0.58; top-1 disagreements below 0.18.
  static constexpr double llama_cpp_mean = 0.12, llama_cpp_p99 = 0.5, llama_cpp_max = 1.0;
  // int8 decode: mean 0.066, p99 0.27, max 0.39 over 16 steps a prompt (over all 31: 0.065,
  // 0.26, 0.49; the fp32 decode's: 0.059, 0.23, 0.55).
  static constexpr double int8_decode_max = 1.0;
  static constexpr double near_tie = 0.3;
  static constexpr size_t llama_cpp_first_position = 0;
};

// Qwen2.5-Coder-1.5B (28 layers, 12 query and 2 KV heads; Q4_K and Q6_K).
struct Qwen2_1_5B {
  static std::string path() { return testing::qwen_1_5b_model_path_or_skip(); }
  static constexpr const char* llama_cpp_fixture = "parity_qwen2_1.5b.json";
  static constexpr const char* fp32_fixture = "parity_qwen2_1.5b_fp32.json";
  // fp32 reference vs llama.cpp from position 1: mean 0.075, p99 0.27, max 0.72; top-1
  // disagreements below 0.23.
  static constexpr double llama_cpp_mean = 0.15, llama_cpp_p99 = 0.5, llama_cpp_max = 1.2;
  // int8 decode: mean 0.070, p99 0.28, max 0.38 over 16 steps a prompt.
  static constexpr double int8_decode_max = 1.0;
  static constexpr double near_tie = 0.3;
  // Position 0 is llama.cpp's outlier, not ours: there its logits differ from the fp32
  // reference's by 4.5 to 7.5 (top-1 another token in every prompt) while kvbench equals the
  // fp32 reference within 1e-3 at every position. This model's first token carries
  // activations too large for llama.cpp's 8-bit rounding; from position 1 on the gap is 0.3.
  static constexpr size_t llama_cpp_first_position = 1;
};

#ifndef KVBENCH_PARITY_MODELS
#define KVBENCH_PARITY_MODELS SmolLM2, Qwen2
#endif

const json& load_fixture(const std::string& name) {
  static std::map<std::string, json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    std::ifstream in(std::string(KVBENCH_FIXTURES) + "/" + name);
    REQUIRE(in.good());
    it = cache.emplace(name, json::parse(in)).first;
  }
  return it->second;
}

// Loads the model first, so a missing model file skips before any fixture is read.
template <class M>
LlamaModel& mutable_model() {
  static const std::unique_ptr<LlamaModel> m = LlamaModel::load(M::path());
  return *m;
}
template <class M>
const LlamaModel& model() {
  return mutable_model<M>();
}
template <class M>
const json& llama_cpp() {
  model<M>();
  return load_fixture(M::llama_cpp_fixture);
}
template <class M>
const json& fp32_reference() {
  model<M>();
  return load_fixture(M::fp32_fixture);
}

int32_t argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// Logits at every prompt position, computed once per prompt.
template <class M>
const std::vector<float>& prompt_logits(const json& prompt) {
  static std::map<std::string, std::vector<float>> cache;
  const std::string name = prompt["name"];
  auto it = cache.find(name);
  if (it == cache.end()) {
    KvCache kv = make_full_cache(model<M>().kv_shape());
    it = cache
             .emplace(name, model<M>().forward(prompt["tokens"].get<std::vector<int32_t>>(), kv,
                                               /*all_logits=*/true))
             .first;
  }
  return it->second;
}

// Prefill, then one-token decode steps fed with our own choices, as the fixtures were made.
// Computed once per prompt and length: both fixtures hold the same prompts, and these decode
// steps were half of the test's time.
template <class M>
const std::vector<int32_t>& greedy(const std::vector<int32_t>& prompt, size_t n_new) {
  static std::map<std::pair<std::vector<int32_t>, size_t>, std::vector<int32_t>> done;
  auto it = done.find({prompt, n_new});
  if (it != done.end()) return it->second;
  KvCache cache = make_full_cache(model<M>().kv_shape());
  std::vector<float> logits = model<M>().forward(prompt, cache);
  std::vector<int32_t> ids;
  while (ids.size() < n_new) {
    ids.push_back(argmax(logits.data(), static_cast<int64_t>(logits.size())));
    if (ids.size() < n_new) logits = model<M>().forward({ids.back()}, cache);
  }
  return done.emplace(std::make_pair(prompt, n_new), std::move(ids)).first->second;
}

// |ours - reference| at the reference's top-8 ids, over every position of a prompt.
template <class M>
std::vector<double> top8_differences(const json& prompt, const std::vector<float>& logits,
                                     size_t first_position = 0) {
  const int64_t vocab = model<M>().config().vocab_size;
  std::vector<double> diffs;
  for (size_t pos = first_position; pos < prompt["top_ids"].size(); ++pos) {
    const auto ids = prompt["top_ids"][pos].get<std::vector<int32_t>>();
    const auto values = prompt["top_logits"][pos].get<std::vector<double>>();
    for (size_t j = 0; j < ids.size(); ++j) {
      diffs.push_back(std::abs(logits[pos * vocab + ids[j]] - values[j]));
    }
  }
  return diffs;
}

}  // namespace

TEMPLATE_TEST_CASE("parity: token ids equal llama.cpp's", "[model]", KVBENCH_PARITY_MODELS) {
  for (const json& prompt : llama_cpp<TestType>()["prompts"]) {
    INFO("prompt " << prompt["name"].get<std::string>());
    const auto expected = prompt["tokens"].get<std::vector<int32_t>>();
    const auto ids = model<TestType>().tokenizer().encode(prompt["text"].get<std::string>());
    CHECK(ids == expected);
    CHECK(model<TestType>().tokenizer().decode(ids) == prompt["text"].get<std::string>());
  }
}

TEMPLATE_TEST_CASE("parity: logits equal the fp32 reference at every position", "[model]",
                   KVBENCH_PARITY_MODELS) {
  const int64_t vocab = model<TestType>().config().vocab_size;
  for (const json& prompt : fp32_reference<TestType>()["prompts"]) {
    INFO("prompt " << prompt["name"].get<std::string>());
    const std::vector<float>& logits = prompt_logits<TestType>(prompt);
    const auto diffs = top8_differences<TestType>(prompt, logits);
    const double max_diff = *std::max_element(diffs.begin(), diffs.end());
    INFO("max |logit - fp32 reference| over top-8 = " << max_diff);
    CHECK(max_diff < kFp32Tolerance);
    for (size_t pos = 0; pos < prompt["top_ids"].size(); ++pos) {
      const auto values = prompt["top_logits"][pos].get<std::vector<double>>();
      if (values[0] - values[1] > 2 * kFp32Tolerance) {
        CHECK(argmax(logits.data() + pos * vocab, vocab) == prompt["top_ids"][pos][0]);
      }
    }
  }
}

TEMPLATE_TEST_CASE("parity: 32-token greedy continuations equal the fp32 reference's", "[model]",
                   KVBENCH_PARITY_MODELS) {
  for (const json& prompt : fp32_reference<TestType>()["prompts"]) {
    INFO("prompt " << prompt["name"].get<std::string>());
    const auto expected = prompt["greedy"]["ids"].get<std::vector<int32_t>>();
    CHECK(greedy<TestType>(prompt["tokens"].get<std::vector<int32_t>>(), expected.size()) ==
          expected);
  }
}

TEMPLATE_TEST_CASE("parity: logits within llama.cpp's rounding noise", "[model]",
                   KVBENCH_PARITY_MODELS) {
  std::vector<double> all;
  const int64_t vocab = model<TestType>().config().vocab_size;
  for (const json& prompt : llama_cpp<TestType>()["prompts"]) {
    INFO("prompt " << prompt["name"].get<std::string>());
    const std::vector<float>& logits = prompt_logits<TestType>(prompt);
    const auto diffs =
        top8_differences<TestType>(prompt, logits, TestType::llama_cpp_first_position);
    all.insert(all.end(), diffs.begin(), diffs.end());
    for (size_t pos = TestType::llama_cpp_first_position; pos < prompt["top_ids"].size(); ++pos) {
      const auto values = prompt["top_logits"][pos].get<std::vector<double>>();
      if (values[0] - values[1] > TestType::near_tie) {
        INFO("position " << pos);
        CHECK(argmax(logits.data() + pos * vocab, vocab) == prompt["top_ids"][pos][0]);
      }
    }
  }
  std::sort(all.begin(), all.end());
  double mean = 0;
  for (double d : all) mean += d / all.size();
  const double p99 = all[all.size() * 99 / 100];
  INFO("top-8 |logit - llama.cpp|: mean " << mean << ", p99 " << p99 << ", max " << all.back());
  CHECK(mean < TestType::llama_cpp_mean);
  CHECK(p99 < TestType::llama_cpp_p99);
  CHECK(all.back() < TestType::llama_cpp_max);
}

TEMPLATE_TEST_CASE("parity: greedy continuations follow llama.cpp's up to its first near-tie",
                   "[model]", KVBENCH_PARITY_MODELS) {
  for (const json& prompt : llama_cpp<TestType>()["prompts"]) {
    INFO("prompt " << prompt["name"].get<std::string>());
    const auto expected = prompt["greedy"]["ids"].get<std::vector<int32_t>>();
    // Step k is decided by the last prompt position (k = 0) or by decode step k - 1.
    auto margin = [&](size_t k) {
      const json& top =
          k == 0 ? prompt["top_logits"].back() : prompt["greedy"]["decode_top_logits"][k - 1];
      return top[0].get<double>() - top[1].get<double>();
    };
    size_t decided = 0;
    while (decided < expected.size() && margin(decided) > TestType::near_tie) ++decided;
    const std::vector<int32_t>& ids =
        greedy<TestType>(prompt["tokens"].get<std::vector<int32_t>>(), expected.size());
    INFO("llama.cpp's first near-tie at step " << decided);
    CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + decided) ==
          std::vector<int32_t>(expected.begin(), expected.begin() + decided));
  }
}

// Decode steps teacher-forced with llama.cpp's greedy ids after the prompt, beside its
// decode-step logits: |ours - llama.cpp| at its top-8 ids, for every step of every prompt.
template <class M>
std::vector<double> decode_differences(Activations activations) {
  LlamaModel& m = mutable_model<M>();
  m.set_decode_activations(activations);
  const int64_t vocab = m.config().vocab_size;
  std::vector<double> diffs;
  for (const json& prompt : llama_cpp<M>()["prompts"]) {
    const json& greedy = prompt["greedy"];
    const auto ids = greedy["ids"].get<std::vector<int32_t>>();
    KvCache cache = make_full_cache(m.kv_shape());
    m.forward(prompt["tokens"].get<std::vector<int32_t>>(), cache);
    // The first 16 steps of each prompt: the test's time is mostly these decode steps.
    for (size_t k = 0; k + 1 < ids.size() && k < greedy["decode_top_ids"].size() && k < 16; ++k) {
      const std::vector<float> logits = m.decode(ids[k], cache);
      REQUIRE(static_cast<int64_t>(logits.size()) == vocab);
      const auto top_ids = greedy["decode_top_ids"][k].get<std::vector<int32_t>>();
      const auto top = greedy["decode_top_logits"][k].get<std::vector<double>>();
      for (size_t j = 0; j < top_ids.size(); ++j) {
        diffs.push_back(std::abs(logits[top_ids[j]] - top[j]));
      }
    }
  }
  m.set_decode_activations(Activations::Fp32);
  std::sort(diffs.begin(), diffs.end());
  return diffs;
}

TEMPLATE_TEST_CASE("parity: int8 decode activations stay within llama.cpp's rounding noise",
                   "[model]", KVBENCH_PARITY_MODELS) {
  // --decode-activations int8 rounds x as llama.cpp does (not bit for bit: its own scales
  // and, for K-quants, 256-value blocks): its decode logits are held to llama.cpp's by the
  // fp32 path's mean and p99 bounds, and a max of its own (the fp32 decode's figures, in
  // the comments above, come from decode_differences<M>(Activations::Fp32)).
  const std::vector<double> all = decode_differences<TestType>(Activations::Int8);
  REQUIRE(!all.empty());
  double mean = 0;
  for (double d : all) mean += d / all.size();
  const double p99 = all[all.size() * 99 / 100];
  WARN("int8 decode: mean " << mean << " p99 " << p99 << " max " << all.back());
  CHECK(mean < TestType::llama_cpp_mean);
  CHECK(p99 < TestType::llama_cpp_p99);
  CHECK(all.back() < TestType::int8_decode_max);
}

TEMPLATE_TEST_CASE("parity: int8 prefill activations stay within llama.cpp's rounding noise",
                   "[model]", KVBENCH_PARITY_MODELS) {
  // --prefill-activations int8: every prompt prefilled whole (all logits) through the int8
  // GEMM, held to llama.cpp's logits by the same bounds as int8 decode, and to the fp32
  // forward's own logits by the max the rounding is allowed to move them.
  LlamaModel& m = mutable_model<TestType>();
  // The fp32 logits first: prompt_logits caches what the model computes when first asked.
  for (const json& prompt : llama_cpp<TestType>()["prompts"]) prompt_logits<TestType>(prompt);
  m.set_prefill_activations(Activations::Int8);
  std::vector<double> to_llama, to_fp32;
  const int64_t vocab = m.config().vocab_size;
  for (const json& prompt : llama_cpp<TestType>()["prompts"]) {
    const auto tokens = prompt["tokens"].get<std::vector<int32_t>>();
    KvCache kv = make_full_cache(m.kv_shape());
    const std::vector<float> logits = m.forward(tokens, kv, /*all_logits=*/true);
    const auto diffs =
        top8_differences<TestType>(prompt, logits, TestType::llama_cpp_first_position);
    to_llama.insert(to_llama.end(), diffs.begin(), diffs.end());
    const std::vector<float>& fp32 = prompt_logits<TestType>(prompt);
    // From llama.cpp's first compared position: the 1.5B's first token carries activations
    // too large for 8-bit rounding per 32 values, ours as llama.cpp's (its own note above).
    for (size_t pos = TestType::llama_cpp_first_position; pos < tokens.size(); ++pos) {
      const auto ids = prompt["top_ids"][pos].get<std::vector<int32_t>>();
      for (int32_t id : ids) {
        to_fp32.push_back(std::abs(logits[pos * vocab + id] - fp32[pos * vocab + id]));
      }
    }
  }
  m.set_prefill_activations(Activations::Fp32);
  REQUIRE(!to_llama.empty());
  std::sort(to_llama.begin(), to_llama.end());
  std::sort(to_fp32.begin(), to_fp32.end());
  double mean = 0;
  for (double d : to_llama) mean += d / to_llama.size();
  const double p99 = to_llama[to_llama.size() * 99 / 100];
  WARN("int8 prefill vs llama.cpp: mean " << mean << " p99 " << p99 << " max " << to_llama.back()
                                          << "; vs fp32: max " << to_fp32.back());
  CHECK(mean < TestType::llama_cpp_mean);
  CHECK(p99 < TestType::llama_cpp_p99);
  CHECK(to_llama.back() < TestType::int8_decode_max);
  CHECK(to_fp32.back() < TestType::int8_decode_max);
}
