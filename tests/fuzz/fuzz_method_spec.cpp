// Method spec strings: resolved, then each per-sequence cache built with the tiny model's
// shape and fed a short context and decode steps, so that parameter values reach the
// method's arithmetic and buffers (window=10^17 must not allocate or overflow).
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "../cache_feed.h"
#include "cache/registry.h"
#include "fuzz_check.h"
#include "methods/builtin_methods.h"

using namespace kvbench;

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  register_builtin_methods();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ResolvedSpec spec;
  try {
    spec = resolve_method_spec(text);
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
    return 0;
  }
  FUZZ_CHECK(!spec.components.empty());
  FUZZ_CHECK(resolve_method_spec(spec.canonical).canonical == spec.canonical);
  // A tiny model's shape: 2 layers, 2 KV heads of 32 (KIVI's channel group), GQA 2, and its
  // RoPE (theta 10000), which kvquant_keys turns keys back by.
  KvShape shape{2, 2, 32};
  for (int i = 0; i < 16; ++i) shape.rope_inv_freq.push_back(std::pow(10000.f, -i / 16.f));
  constexpr int32_t kHeads = 4;
  std::optional<KvCache> built;
  try {
    built.emplace(make_cache(spec, shape));
  } catch (const InputError& e) {  // a method that cannot run at this shape says so
    fuzz::check_input_error(e);
    return 0;
  }
  KvCache& cache = *built;
  std::mt19937 rng(1);
  testing::feed(cache, kHeads, testing::random_chunk(40, shape, kHeads, rng));
  cache.end_context();
  for (int step = 0; step < 3; ++step) {
    testing::decode_step(cache, kHeads, testing::random_chunk(1, shape, kHeads, rng));
  }
  FUZZ_CHECK(cache.bytes_resident() > 0 && cache.bytes_resident() < (int64_t{1} << 26));
  return 0;
}
